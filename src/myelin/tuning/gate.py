"""One tuning spec per process at a time: IREE 3.13 keeps `--iree-codegen-tuning-spec-path` in
process-wide options, so a session that sets it changes it for every session after it and for
those compiling concurrently in other threads (verified: a compile without the flag, after one
with it, still loaded the first spec). Every compile therefore names its spec explicitly (the
empty value means none), and compiles that name different specs never overlap; compiles with
the same spec (the usual case: none) still run concurrently.

A compile that applies a spec runs its passes on one thread. IREE 3.13 parses a spec file once
per context, in `IREECodegenDialect::getOrLoadTransformLibraryModule`, holding the dialect's
(non-recursive) library mutex; the parse verifies the spec's named sequences in parallel, and a
pool thread waiting for that verification picks up queued work, which can be the same pass for
another executable, which takes the same mutex on the same thread: the compile hangs for good
with no CPU used (seen in CI and here: one worker thread blocked in that mutex, every other
thread idle). Without the MLIR thread pool there is no nested wait, so no deadlock; the cost is
a single-threaded compile for tuned builds only.

The same once-per-process command line carries LLVM's code-layout option for llvm-cpu
(CODE_LAYOUT_FLAGS): IREE 3.13 has no session option for it. Without it, where a hot kernel's
inner loop falls against the 64-byte lines the CPU fetches from depends on every other
function linked into the same executable: on MiniLM with data tiling, the mmt4d loop of the
int8 build started 32 bytes into a line (three lines a pass, fp32's and q4's two), because the
int8 build's load-time decode functions come first, and its calls took ~6% more CPU time at
batch 32 than fp32's running the same kernel on the same packed weights; forcing fp32's loop
to the same place made fp32 as slow (docs/benchmarks.md, "The codecs' 6%: where the linker
puts a kernel"). So the first compile of a process that targets llvm-cpu (or applies a
library) sets the option, and the process keeps it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SPEC_PATH_FLAG = "--iree-codegen-tuning-spec-path"
# Not a session option in IREE 3.13's C API ("option not found"): a global command-line one,
# set at most once per process through the embedding API's global command line.
LIBRARY_FLAG = "--iree-codegen-transform-dialect-library"
# What an `iree-compile` process that applies a spec adds (the in-process equivalent is a
# session whose context has multithreading off): see the module docstring.
SINGLE_THREADED_FLAG = "--mlir-disable-threading"
# LLVM options for the process's global command line: innermost loops start on a 64-byte
# boundary (LLVM's x86 default: 16), so a kernel's speed no longer depends on where the linker
# puts it (see above). The option exists in every IREE 3.13 build (its X86 backend is always
# built) and is read only when generating x86 code.
CODE_LAYOUT_FLAGS = ("--x86-experimental-pref-innermost-loop-alignment=6",)
# A compile for llvm-cpu names it among its flags (myelin.compiler.targets).
_LLVM_CPU_FLAG = "--iree-hal-local-target-device-backends=llvm-cpu"

_condition = threading.Condition()
_current: str | None = None
_holders = 0
# The library option of this process's global command line, once it is set (it can be once;
# "": set without a library).
_library: str | None = None


@contextmanager
def process_wide_spec(flags: Sequence[str]) -> Iterator[tuple[list[str], bool]]:
    """Hold the process's tuning-spec option for a compile with `flags`; yields the flags to
    open its session with (the spec path always set, to the given one or to none) and whether
    the compile applies a spec (then it must run single-threaded, see above)."""
    global _current, _holders
    prefix = f"{SPEC_PATH_FLAG}="
    value = next((f[len(prefix) :] for f in reversed(flags) if f.startswith(prefix)), "")
    with _condition:
        while _holders and _current != value:
            _condition.wait()
        _current = value
        _holders += 1
    try:
        rest = _global_library(flags)
        applies_a_spec = bool(value) or bool(_library)
        yield [*(f for f in rest if not f.startswith(prefix)), f"{prefix}{value}"], applies_a_spec
    finally:
        with _condition:
            _holders -= 1
            _condition.notify_all()


def _global_library(flags: Sequence[str]) -> list[str]:
    """The flags without LIBRARY_FLAG, which is set process-wide instead (IREE's public
    `ireeCompilerSetupGlobalCL`, once per process): every compile of this process then applies
    that library, on every target. So a process serves one library: a compile that names
    another one, or none after one was set, is refused with the fix, never silently tuned
    with the wrong spec. (`plex tune` builds each candidate in a process of its own.)

    The same call sets CODE_LAYOUT_FLAGS, at the process's first compile for llvm-cpu or
    with a library, whichever comes first; a library asked for after that call (a process
    that compiled for llvm-cpu first) is refused the same way."""
    global _library
    prefix = f"{LIBRARY_FLAG}="
    value = next((f[len(prefix) :] for f in reversed(flags) if f.startswith(prefix)), "")
    with _condition:
        if _library is None and (value or _LLVM_CPU_FLAG in flags):
            from iree.compiler.api import _initializeGlobalCL

            _initializeGlobalCL(
                "plex", *CODE_LAYOUT_FLAGS, *([f"{prefix}{value}"] if value else [])
            )
            _library = value
        elif _library is not None and value != _library:
            from myelin.errors import CompileError

            now = f"the tuning spec {_library}" if _library else "no tuning spec"
            raise CompileError(
                f"this process applies {now} to every compile (IREE 3.13 takes "
                f"{LIBRARY_FLAG} only process-wide, set at its first llvm-cpu or tuned "
                f"compile); compile {'with ' + value if value else 'without it'} in another "
                "process (`plex build` gives each such compile a worker process of its own; "
                "in one process, e.g. with PLEX_BUILD_ISOLATE=0, build one variant per build)"
            )
    return [f for f in flags if not f.startswith(prefix)]
