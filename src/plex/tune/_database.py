"""tuning.json: what `plex tune` measured, keyed so that a later run reuses only what still
holds: the dispatch fingerprint (op, shapes, dtypes, layout through its indexing maps), the
target (its arch and CPU features) and the IREE version that compiled it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATABASE = "tuning.json"
SCHEMA = 1


def entry_key(fingerprint: str, target: str, iree_version: str) -> str:
    return hashlib.sha256(f"{fingerprint}|{target}|{iree_version}".encode()).hexdigest()[:24]


@dataclass
class Database:
    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, folder: Path) -> Database:
        path = folder / DATABASE
        if not path.is_file():
            return cls(path)
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA:
            return cls(path)  # another layout: start over rather than misread it
        return cls(path, dict(data.get("entries", {})))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.partial")
        data = {"schema": SCHEMA, "entries": self.entries}
        partial.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(partial, self.path)
