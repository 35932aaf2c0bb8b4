"""Names that come from a file (an artifact's manifest, a `plex.toml`) are data, never
instructions: showing one must not drive the terminal, and a path made from one must stay in the
folder it was made for. These helpers are the one place both happen.

- `printable(text)`: the text with control characters, escape sequences and lone surrogates
  written as Python escapes (`\\x1b`, `\\ud800`), so a crafted name cannot move the cursor,
  recolour the terminal or crash an encoder.
- `relative_path_problem(text)`: why a path template is not a plain relative path (absolute,
  `..`, empty parts, control characters), or None; manifests check their path fields with it.
- `path_inside(folder, relative, what=...)`: `folder/relative`, resolved, refused with
  `UnsafePath` unless it is inside `folder` (symbolic links followed).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from myelin.errors import UnsafePath

# A name an artifact uses as one file name (a parameter scope, a module, a backend): no path
# separators, not `.` or `..`, and short enough that `<name>-plugin.so` stays under the 255 bytes
# a Linux file name may have.
FILE_NAME_PATTERN = r"(?!\.\.?$)[A-Za-z0-9_.-]{1,128}"


def printable(text: str) -> str:
    """`text` with every non-printable character escaped as in a Python literal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def relative_path_problem(text: str) -> str | None:
    """What keeps `text` from being a relative path that stays below its folder, or None."""
    if not text:
        return "is empty"
    if not text.isprintable():
        return "contains control characters"
    path = PurePosixPath(text)
    if path.is_absolute():
        return "is an absolute path; give a path relative to the output folder"
    if ".." in path.parts:
        return "steps out of its folder with '..'"
    return None


def path_inside(folder: Path, relative: str, *, what: str) -> Path:
    """The resolved `folder/relative`, which must lie inside `folder` (not be `folder` itself).

    `what` names where `relative` came from, for the error (`parameter scope`, `[runtime.profile]
    output`)."""
    problem = relative_path_problem(relative)
    if problem is None:
        base = folder.resolve()
        path = (base / relative).resolve()
        if path != base and path.is_relative_to(base):
            return path
        problem = "leads outside it (through a symbolic link)"
    raise UnsafePath(
        f"{what} '{printable(relative)}' {problem}: a name from a file may only name a file "
        f"inside {printable(str(folder))}"
    )
