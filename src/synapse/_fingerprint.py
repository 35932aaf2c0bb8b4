"""Fingerprints: the one place where content becomes a hex sha256, and nodes become cache keys."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synapse._plan import Node

# Bump when the key recipe changes, so old cache entries stop matching instead of lying.
KEY_SCHEMA = 2


def file_digest(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in chunks (weights files may be many GB)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def bytes_digest(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of a bytes-like object."""
    return hashlib.sha256(data).hexdigest()


def json_digest(obj: Any) -> str:
    """Hex sha256 of canonical JSON (sorted keys, no whitespace); paths are written as strings.

    For options and flag lists: two equal dicts give the same digest whatever their key order.
    """
    text = json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default
    )
    return bytes_digest(text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, PurePath):
        return obj.as_posix()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"json_digest cannot fingerprint a {type(obj).__name__}: {obj!r}")


def node_key(node: Node, dep_keys: Mapping[str, str], salt: str) -> str:
    """The cache key of `node`: sha256 over its kind, job type, id, job fields, its
    dependencies' keys and salt.

    `dep_keys` maps each dependency id to that dependency's key, so a change anywhere upstream
    changes the keys of every node downstream and of nothing else. `salt` carries what applies to
    the whole build (tool versions such as the IREE release).
    """
    missing = [dep for dep in node.deps if dep not in dep_keys]
    if missing:
        raise KeyError(f"node '{node.id}': no key for dependencies {missing}")
    return json_digest(
        {
            "schema": KEY_SCHEMA,
            "kind": node.kind,
            "job": type(node.job).__qualname__,
            "id": node.id,
            "inputs": dict(node.inputs),
            "deps": {dep: dep_keys[dep] for dep in node.deps},
            "salt": salt,
        }
    )
