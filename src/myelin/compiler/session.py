"""In-process access to the IREE compiler through its C API.

The Python `iree.compiler.api` wrapper covers sessions, sources and outputs, but not compile
phases or diagnostics capture. Both are stable C API entry points; we declare their ctypes
signatures here (undeclared, ctypes truncates the 64-bit pointers and the process crashes) and
keep every use of the private `ctypes_dl` module in this file.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.api import Output, Session, Source, ctypes_dl

from myelin.compiler.phases import PHASES
from myelin.errors import CompileError

_DIAGNOSTIC_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
)
_SEVERITY = {0: "note", 1: "warning", 2: "error", 3: "remark"}
_dylib_lock = threading.Lock()
_dylib_ready = False


def _dylib() -> ctypes.CDLL:
    global _dylib_ready
    with _dylib_lock:
        if not _dylib_ready:
            ctypes_dl._init_dylib()
            lib = ctypes_dl._dylib
            for name in (
                "ireeCompilerInvocationSetCompileToPhase",
                "ireeCompilerInvocationSetCompileFromPhase",
            ):
                ctypes_dl._setsig(getattr(lib, name), None, [ctypes.c_void_p, ctypes.c_char_p])
            ctypes_dl._setsig(
                lib.ireeCompilerInvocationEnableCallbackDiagnostics,
                None,
                [ctypes.c_void_p, ctypes.c_int, _DIAGNOSTIC_CALLBACK, ctypes.c_void_p],
            )
            _dylib_ready = True
    return ctypes_dl._dylib


@dataclass
class Diagnostics:
    """Messages the compiler emitted during one invocation.

    A failed compile can print hundreds of lines (every dispatch that fails repeats the target's
    CPU feature string and dumps its op), so `failure` gives people a few lines (the first
    error's op, message and source location, how many errors there were) and writes the full
    text to a log file whose path it names. The folder is `Diagnostics.log_dir` when a caller
    sets it, else $PLEX_LOG_DIR, else `<system temp dir>/plex-logs`.
    """

    messages: list[tuple[str, str]] = field(default_factory=list)
    # where failure() writes its log; None: $PLEX_LOG_DIR or <temp dir>/plex-logs
    log_dir: ClassVar[Path | None] = None

    def errors(self) -> list[str]:
        return [m for s, m in self.messages if s == "error"]

    def render(self, limit: int = 20) -> str:
        picked = [f"{s}: {m}" for s, m in self.messages if s in ("error", "warning")]
        if not picked:
            picked = [f"{s}: {m}" for s, m in self.messages]
        text = "\n".join(picked[:limit])
        if len(picked) > limit:
            text += f"\n... {len(picked) - limit} more"
        return text

    def failure(self, headline: str) -> str:
        """A short report of a failed invocation, starting with `headline` (what failed: the
        graph or node and the phase), with the full diagnostics written to a log file."""
        errors = [_ParsedDiagnostic.of(m) for s, m in self.messages if s == "error"]
        if not errors:  # nothing was reported as an error: say what there was
            errors = [_ParsedDiagnostic.of(m) for _, m in self.messages]
        log = self._write_log(headline)
        where = (
            f"full IREE diagnostics: {log}" if log else "(the diagnostics log could not be written)"
        )
        if not errors:
            return f"{headline}: IREE reported no diagnostics\n  {where}"
        # the first error that is not IREE's generic "failed to ..." wrapper of another one
        first = next((e for e in errors if not e.generic), errors[0])
        same = sum(1 for e in errors if e.summary == first.summary)
        lines = [f"{headline}: {first.text}", f"  at {first.place()}"]
        count = f"{len(errors)} error{'s' * (len(errors) != 1)} in all"
        if same > 1:
            count = f"{same} like it, {count}"
        lines.append(f"  {count}; {where}")
        return "\n".join(lines)

    def _write_log(self, headline: str) -> Path | None:
        folder = self.log_dir or Path(
            os.environ.get("PLEX_LOG_DIR") or Path(tempfile.gettempdir()) / "plex-logs"
        )
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", headline)[:80].strip("_") or "compile"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        text = [f"# {headline}", f"# {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()}", ""]
        text += [f"{severity}: {message}\n" for severity, message in self.messages]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{stem}-{stamp}-{os.getpid()}-{next(_log_numbers)}.log"
            path.write_text("\n".join(text))
        except OSError:
            return None
        return path


_log_numbers = itertools.count(1)
_LOCATED = re.compile(r"^(?P<loc>\S.*?:\d+:\d+): (?P<text>.*)$", re.DOTALL)
_OP = re.compile(r"'(?P<op>[\w.$]+)' op ")
_DISPATCH = re.compile(
    r'sym_name = "(?P<name>[^"]+)"|func\.func (?:public |private )?@(?P<at>[\w$.-]+)'
)
_TARGET = re.compile(r"#hal\.executable\.target<(\"[^\"]*\"), (\"[^\"]*\").*", re.DOTALL)
_LIBRARY_FRAMES = (
    "site-packages",
    "dist-packages",
    "python-stdlib/",  # portable_path's name for the standard library
    "torch/fx/",
    "<frozen",
    "/lib/python",
)


@dataclass(frozen=True)
class _ParsedDiagnostic:
    """One diagnostic message split into what people read first: its location, the op it
    names, its text (one line, cut), the user frame that called it and the dispatch it is in."""

    location: str
    op: str
    text: str
    caller: str  # the first "called from" frame outside libraries ("" if none)
    dispatch: str  # the failing dispatch function, from "see current operation" ("" if none)

    @property
    def summary(self) -> tuple[str, str]:
        return (self.op, self.text)

    @property
    def generic(self) -> bool:
        return self.text.startswith("failed to ")

    @classmethod
    def of(cls, message: str) -> _ParsedDiagnostic:
        paragraphs = [p.strip() for p in message.split("\n\n") if p.strip()]
        head = paragraphs[0] if paragraphs else message
        m = _LOCATED.match(head)
        location, text = (m.group("loc"), m.group("text")) if m else ("unknown location", head)
        text = _TARGET.sub(r"#hal.executable.target<\1, \2, ...>", text)
        text = " ".join(text.split())
        if len(text) > 200:
            text = text[:197] + "..."
        op = _OP.search(text)
        caller, dispatch = "", ""
        for p in paragraphs[1:]:
            n = _LOCATED.match(p)
            note = n.group("text") if n else p
            if note.startswith("called from") and not caller and n is not None:
                if not any(frame in n.group("loc") for frame in _LIBRARY_FRAMES):
                    caller = n.group("loc")
            elif note.startswith("see current operation") and not dispatch:
                d = _DISPATCH.search(note)
                if d:
                    dispatch = d.group("name") or d.group("at")
        return cls(location, op.group("op") if op else "", text, caller, dispatch)

    def place(self) -> str:
        parts = [self.location]
        if self.caller and self.caller != self.location:
            parts.append(f"called from {self.caller}")
        if self.dispatch:
            parts.append(f"in dispatch {self.dispatch}")
        return ", ".join(parts)


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise CompileError(f"unknown compile phase {phase!r}; phases: {', '.join(PHASES)}")


class CompilerSession:
    """One IREE compiler session (a context plus flags). Not shared across threads; two sessions
    in two threads compile concurrently because the C API releases the GIL."""

    def __init__(self, flags: Sequence[str], *, threaded: bool = True) -> None:
        """`threaded=False` runs every pass of this session on the calling thread (see
        `myelin.tuning.gate`: compiles that apply a tuning spec deadlock otherwise)."""
        self._lib = _dylib()
        self._session = Session()
        self.flags = tuple(flags)
        self._invocations: list[object] = []
        if not threaded:
            self._session.context.enable_multithreading(False)
        try:
            self._session.set_flags(*self.flags)
        except ValueError as e:
            raise CompileError(f"the IREE compiler rejected a flag: {e}") from e

    @property
    def context(self) -> ir.Context:
        return self._session.context

    def _invocation(self, diagnostics: Diagnostics):
        inv = self._session.invocation()

        @_DIAGNOSTIC_CALLBACK
        def on_diagnostic(severity: int, message: bytes, size: int, _user: int) -> None:
            diagnostics.messages.append(
                (_SEVERITY.get(severity, "note"), message[:size].decode(errors="replace"))
            )

        inv._plex_diag_callback = on_diagnostic  # keep the callback alive with the invocation
        self._lib.ireeCompilerInvocationEnableCallbackDiagnostics(
            inv._inv_p, 0, on_diagnostic, None
        )
        return inv

    def parse(
        self,
        source: Path | bytes | str,
        *,
        compile_to: str | None = None,
        what: str = "module",
        source_name: str | None = None,
    ) -> ir.Operation:
        """Parse a source (file or text/bytecode) and run the pipeline up to `compile_to`
        (None: parse only). Returns the module operation, owned by this session's context.

        The source is parsed from memory under `source_name` (default: the file's base name):
        locations end up in the module's debug info, and an absolute build path there would make
        the same model build to different bytes in different folders.
        """
        diagnostics = Diagnostics()
        inv = self._invocation(diagnostics)
        if isinstance(source, Path):
            name = source_name or source.name
            try:
                data = source.read_bytes()
            except OSError as e:
                raise CompileError(f"cannot read {what}: {e}") from e
        else:
            name = source_name or "source.mlir"
            data = source.encode() if isinstance(source, str) else source
        if not data.startswith(b"ML\xefR") and not data.endswith(b"\0"):
            data += b"\0"  # text sources are parsed as NUL-terminated strings
        src = Source.wrap_buffer(self._session, data, buffer_name=name)
        if not inv.parse_source(src):
            raise CompileError(diagnostics.failure(f"cannot parse {what}"))
        if compile_to is not None:
            _check_phase(compile_to)
            self._lib.ireeCompilerInvocationSetCompileToPhase(inv._inv_p, compile_to.encode())
            if not inv.execute():
                raise CompileError(
                    diagnostics.failure(f"compiling {what} to phase '{compile_to}' failed")
                )
        op = inv.export_module()
        self._invocations.append(inv)  # the module's memory stays valid while the session lives
        return op

    def compile(
        self,
        module: ir.Operation,
        *,
        compile_from: str | None = None,
        compile_to: str | None = None,
        what: str = "module",
    ) -> tuple[bytes, Diagnostics]:
        """Run the rest of the pipeline on `module`; returns VM bytecode (or IR bytecode when
        `compile_to` stops before the end)."""
        diagnostics = Diagnostics()
        inv = self._invocation(diagnostics)
        if compile_from is not None:
            _check_phase(compile_from)
            self._lib.ireeCompilerInvocationSetCompileFromPhase(inv._inv_p, compile_from.encode())
        if compile_to is not None:
            _check_phase(compile_to)
            self._lib.ireeCompilerInvocationSetCompileToPhase(inv._inv_p, compile_to.encode())
        inv.import_module(module)
        if not inv.execute():
            raise CompileError(diagnostics.failure(f"compiling {what} failed"))
        output = Output.open_membuffer()
        if compile_to is not None and compile_to not in ("vm", "end"):
            inv.output_ir_bytecode(output)
        else:
            inv.output_vm_bytecode(output)
        data = bytes(output.map_memory())
        output.close()
        return data, diagnostics

    def advance(
        self, module: ir.Operation, *, compile_from: str, compile_to: str, what: str = "module"
    ) -> ir.Operation:
        """Run the pipeline on `module` from one phase to a later one and return the resulting
        module (owned by this session), for stepping through phases without serializing."""
        _check_phase(compile_from)
        _check_phase(compile_to)
        diagnostics = Diagnostics()
        inv = self._invocation(diagnostics)
        self._lib.ireeCompilerInvocationSetCompileFromPhase(inv._inv_p, compile_from.encode())
        self._lib.ireeCompilerInvocationSetCompileToPhase(inv._inv_p, compile_to.encode())
        inv.import_module(module)
        if not inv.execute():
            raise CompileError(
                diagnostics.failure(
                    f"compiling {what} from phase '{compile_from}' to '{compile_to}' failed"
                )
            )
        op = inv.export_module()
        self._invocations.append(inv)
        return op

    def close(self) -> None:
        self._invocations.clear()
        self._session.close()

    def __enter__(self) -> CompilerSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
