"""Tool versions that enter every build fingerprint and the artifact's provenance."""

from __future__ import annotations

import functools
from importlib import metadata


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


def fingerprint_salt() -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(versions().items()))
