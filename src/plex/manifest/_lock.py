"""`plex.lock`: the packages an app resolved to, with their content fingerprints."""

from __future__ import annotations

import os
from pathlib import Path

import tomli_w

from plex.manifest._specs import AppSpec

LOCK_NAME = "plex.lock"
LOCK_VERSION = 1
_HEADER = "# plex.lock: the packages this app resolved to. Written by plex; do not edit.\n"


def write_lock(app: AppSpec, path: Path | str | None = None) -> Path:
    """Write `plex.lock` (default: next to app.toml) and return its path.

    The content depends only on the resolved packages: sorted, no timestamps, so an unchanged
    app writes the same bytes and a changed source file changes its package's fingerprint.
    """
    path = Path(path) if path is not None else app.path.parent / LOCK_NAME
    packages = [
        {
            "fingerprint": p.fingerprint,
            "name": p.name,
            "path": _relative(app.path.parent, p.path),
            "version": p.version,
        }
        for p in sorted(app.packages, key=lambda p: p.name)
    ]
    lock = {
        "app": {"name": app.name, "version": app.version},
        "lock_version": LOCK_VERSION,
        "package": packages,
    }
    path.write_text(_HEADER + tomli_w.dumps(lock), encoding="utf-8", newline="\n")
    return path


def _relative(folder: Path, path: Path) -> str:
    try:
        return Path(os.path.relpath(path, folder)).as_posix()
    except ValueError:  # another drive on Windows
        return path.as_posix()
