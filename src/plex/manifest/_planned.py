"""Manifest features that are accepted and validated but not built yet.

This is the one list of them. Using one (giving it a non-default value) is an error at its line,
never silently ignored. When a feature lands, delete its entry here and carry the value into the
specs in `_specs.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plex.manifest._document import TomlDocument
from plex.manifest._locate import KeyPath


def _given(value: Any) -> bool:
    return value not in (None, {}, [])


@dataclass(frozen=True)
class Planned:
    work: str  # where it is planned, e.g. "the runtime-policies work"
    remedy: str  # what the user can do today
    used: Callable[[Any], bool] = _given
    subject: Callable[[Any], str] | None = None  # what to call the value; default: its repr

    def message(self, value: Any) -> str:
        if self.subject is not None:
            what = f"{self.subject(value)} is "
        elif isinstance(value, str | int | float):
            what = f"{value!r} is "
        else:
            what = ""
        return f"{what}not implemented yet (planned in {self.work}); {self.remedy}"


# (manifest kind, key path...) -> Planned. "*" matches any name in a table.
NOT_IMPLEMENTED: dict[KeyPath, Planned] = {
    # plex.toml entries count only for the graphs an app selects and the weights those use.
    ("plex.toml", "weights", "*", "source"): Planned(
        "the weight-formats work",
        "convert the file to .safetensors",
        used=lambda v: Path(v).suffix in (".irpa", ".gguf"),
        subject=lambda v: f"the {Path(v).suffix} weights format",
    ),
}


def check_planned(
    doc: TomlDocument, kind: str, in_scope: Callable[[KeyPath], bool] = lambda path: True
) -> None:
    """Raise at the first (by line) not-implemented feature `doc` uses within `in_scope`."""
    problems = []
    for pattern, planned in NOT_IMPLEMENTED.items():
        if pattern[0] != kind:
            continue
        for path, value in _matches(doc.data, pattern[1:], ()):
            if in_scope(path) and planned.used(value):
                problems.append(doc.error(path, planned.message(value)))
    if problems:
        raise min(problems, key=lambda p: p.line or 0)


def _matches(data: Any, pattern: KeyPath, path: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
    if not pattern:
        yield path, data
        return
    if not isinstance(data, dict):
        return
    head, rest = pattern[0], pattern[1:]
    keys = list(data) if head == "*" else [head] if head in data else []
    for key in keys:
        yield from _matches(data[key], rest, (*path, key))
