"""The manifest's one JSON encoding, and the error its schema raises.

The schema itself is the typed records (`myelin.mln._records`); this module only turns a manifest
into bytes and back, strictly (no NaN, no duplicate keys), so that two writes of one manifest
give identical bytes and a reader never guesses what a JSON object meant.
"""

from __future__ import annotations

import json
from typing import Any


class ManifestInvalid(ValueError):
    """A manifest breaks the schema; `field` is the path of the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"manifest field {field}: {problem}" if field else f"manifest {problem}")
        self.field = field


# --- encoding ------------------------------------------------------------------------------------


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """The canonical bytes: UTF-8 JSON, sorted keys, compact separators (deterministic)."""
    text = json.dumps(
        manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def decode_manifest(data: bytes) -> Any:
    """Parse manifest bytes; raises UnicodeDecodeError, ValueError or RecursionError."""
    return json.loads(
        data.decode("utf-8"),
        object_pairs_hook=_object_without_duplicate_keys,
        parse_constant=_reject_constant,
    )


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:  # JSON leaves duplicates undefined; the writer never makes them
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
