"""External backends: a vendor library behind IREE's executable-plugin contract.

A backend is C code implementing PLeX's backend ABI (`abi/plex_backend.h`: one function per op,
called on the HAL binding pointers) plus PLeX's plugin shim (`abi/plex_plugin.c`: IREE's
executable plugin query/load/resolve). The build compiles both with gcc into one shared object
(`build_plugin`); the compiler rewrites placed ops into dispatches that import `plex_<backend>_<op>`
(`myelin.compiler.backend_ops`); the runtime loads the plugin and the vendor libraries it links
from the .mln through memfds (`myelin.runtime.backends`). docs/backends.md is the contract.

Standard library only: the runtime imports this on devices without the compiler.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from myelin.errors import MyelinError

ABI_VERSION = 2  # PLEX_BACKEND_ABI_VERSION in abi/plex_backend.h
ABI_DIR = Path(__file__).parent / "abi"
ABI_FILES = (ABI_DIR / "plex_backend.h", ABI_DIR / "plex_plugin.c")
# The ops the compiler can hand to a backend.
OPS = ("matmul", "attention", "gelu")


def import_symbol(backend: str, op: str) -> str:
    """The import a dispatch of `op` on `backend` calls; the plugin shim resolves it."""
    return f"plex_{backend}_{op}"


class BackendBuildError(MyelinError):
    """gcc failed on a backend's sources, or no C compiler is installed."""


def compiler_version(cc: str = "gcc") -> str:
    """First line of `cc --version`, part of a backend node's key: another compiler is another
    plugin. Empty when no compiler is installed (the build then says so)."""
    if shutil.which(cc) is None:
        return ""
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else ""


def build_plugin(
    name: str,
    sources: Sequence[Path],
    *,
    include_dirs: Sequence[Path],
    libraries: Sequence[Path],
    static_libraries: Sequence[Path],
    cflags: Sequence[str],
    output: Path,
    cc: str = "gcc",
) -> list[str]:
    """Compile a backend's sources with the plugin shim into `output` (a shared object that
    links `libraries` by their sonames: the runtime loads those first, from the .mln; and
    contains `static_libraries`, linked as one group since vendor archives refer to each other
    (MKL's interface, threading and core layers), their symbols made local to the plugin so that
    nothing else in the process binds to them, e.g. another copy of the same vendor library).

    Returns the command line, for the build record.
    """
    if shutil.which(cc) is None:
        raise BackendBuildError(f"backend '{name}': no C compiler ({cc}) on PATH")
    command = [
        cc, "-shared", "-fPIC", "-fvisibility=hidden", *cflags,
        f'-DPLEX_BACKEND_NAME="{name}"', f"-I{ABI_DIR}",
        *(f"-I{d}" for d in include_dirs),
        str(ABI_DIR / "plex_plugin.c"), *(str(s) for s in sources),
        *(f"-L{lib.parent}" for lib in libraries),
        *(f"-l:{lib.name}" for lib in libraries),
        *(["-Wl,--start-group", *(str(a) for a in static_libraries), "-Wl,--end-group",
           "-Wl,--exclude-libs,ALL"] if static_libraries else []),
        "-lm", "-ldl", "-lpthread",
        "-o", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-12:])
        raise BackendBuildError(f"backend '{name}': gcc failed:\n{tail}")
    return command
