"""Tool versions that enter every build fingerprint and the artifact's provenance."""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path


@functools.cache
def versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "plex": version("plex"),
        "iree-base-compiler": version("iree-base-compiler"),
        "iree-base-runtime": version("iree-base-runtime"),
    }


@functools.cache
def code_digest() -> str:
    """sha256 over PLeX's own Python sources (plex, synapse, myelin). A version number does not
    change with every edit of a working tree or a patched install; the code that produced a
    cached step does, so a changed step never serves an old result."""
    digest = hashlib.sha256()
    roots = [Path(__import__(name).__file__).parent for name in ("plex", "synapse", "myelin")]
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint_salt() -> str:
    return ";".join(
        [*(f"{k}={v}" for k, v in sorted(versions().items())), f"plex-code={code_digest()}"]
    )
