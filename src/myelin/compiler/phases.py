"""Phase files: compiler IR saved at a named phase, with the phase recorded inside the file.

IREE 3.13 does not check that IR given to `--compile-from=P` really is at phase P: a mismatch
compiles without error and returns wrong results (all zeros, measured on IREE 3.13.0). So IR we
save carries its phase twice, and a resume is refused unless both agree with what the caller
asks for:

    // plex-phase: flow
    // plex-module: mlp
    // plex-variant: default
    // plex-flags: 3f5c...   (sha256 of the compile flags and module attributes)
    // plex-source: 9ab1...  (sha256 of the graph source it came from)
    module @mlp attributes {plex.phase = "flow"} { ... }

The header is a block of `// plex-<field>: <value>` comment lines (MLIR ignores them); the module
attribute survives editing tools that drop comments. `plex-phase` is required; the other fields
are what the build checks before it resumes (see plex.builder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from myelin.errors import CompileError

# The phases accepted by --compile-to / --compile-from, in pipeline order (iree-compile --help).
PHASES: tuple[str, ...] = (
    "start",
    "input",
    "abi",
    "preprocessing",
    "global-optimization",
    "dispatch-creation",
    "flow",
    "stream",
    "executable-sources",
    "executable-configurations",
    "executable-targets",
    "hal",
    "vm",
    "end",
)

PHASE_ATTRIBUTE = "plex.phase"
HEADER_PREFIX = "// plex-"
# Phases IR can be saved at and resumed from: "start" is the source itself and "end" is VM
# bytecode, not IR.
RESUMABLE_PHASES: tuple[str, ...] = PHASES[1:-1]

_HEADER_LINE = re.compile(r"// plex-([a-z]+): *(.*)")
_ATTRIBUTE = re.compile(r"\b" + re.escape(PHASE_ATTRIBUTE) + r'\s*=\s*"([^"]*)"')


class PhaseFileError(CompileError):
    """A phase file cannot be resumed from: no recorded phase, or not the phase it claims."""


@dataclass(frozen=True)
class PhaseFile:
    """A saved IR file: its header fields (`phase` among them) and its full text."""

    path: Path | None
    fields: dict[str, str]
    text: str

    @property
    def phase(self) -> str:
        return self.fields["phase"]


def render_phase_file(module_text: str, fields: dict[str, str]) -> str:
    """The header (fields in the given order, `phase` first) followed by the module text, which
    must already carry the `plex.phase` attribute (the compile pipeline sets it)."""
    ordered = {"phase": fields["phase"], **fields}
    header = "".join(f"{HEADER_PREFIX}{k}: {v}\n" for k, v in ordered.items())
    return header + module_text.rstrip("\n") + "\n"


def phase_file_name(index_of: str) -> str:
    """`07.flow.mlir`: files of a dump sort in pipeline order."""
    return f"{PHASES.index(index_of):02d}.{index_of}.mlir"


def read_phase_file(path: Path) -> PhaseFile:
    """Read and check a phase file; raises PhaseFileError with the fix when it cannot be
    resumed from safely."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PhaseFileError(f"cannot read phase file {path}: {e}") from e
    return parse_phase_file(text, path)


def parse_phase_file(text: str, path: Path | None = None) -> PhaseFile:
    name = str(path) if path is not None else "the phase file"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = _HEADER_LINE.fullmatch(line.strip())
        if match is None:
            break
        fields[match.group(1)] = match.group(2).strip()
    phase = fields.get("phase")
    if phase is None:
        raise PhaseFileError(
            f"{name} records no compile phase (no leading '{HEADER_PREFIX}phase: <phase>' line); "
            "IREE cannot tell which phase IR is at and silently miscompiles a wrong guess, so "
            "resume only from files written by `plex build --compile-to` or `--dump-phases`"
        )
    if phase not in RESUMABLE_PHASES:
        raise PhaseFileError(
            f"{name} records phase {phase!r}, which is not a phase one can resume from "
            f"(phases: {', '.join(RESUMABLE_PHASES)})"
        )
    attributes = _ATTRIBUTE.findall(text)
    if attributes != [phase]:
        found = ", ".join(repr(a) for a in attributes) or "none"
        raise PhaseFileError(
            f"{name}: its header says phase '{phase}' but its module attribute "
            f"{PHASE_ATTRIBUTE} says {found}; the two must agree (was IR from another phase "
            "pasted in?). Write the file again with `plex build --compile-to` and edit that"
        )
    return PhaseFile(path, fields, text)
