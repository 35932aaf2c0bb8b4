"""Why each node was a cache hit or had to run: reasons decided at planning time, and `explain`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synapse._executor import NodeResult
    from synapse._plan import Node

HIT = "cache hit"
FIRST_BUILD = "no cache entry (first build)"
EVICTED = "no cache entry (same inputs as last build: evicted or cleared)"
NOT_CACHEABLE = "not cacheable"
NO_CACHE = "no cache configured"
CORRUPT = "corrupt cache entry discarded"

# Reasons that mean "there was nothing to reuse", worded "built" rather than "rebuilt".
_FRESH = {FIRST_BUILD, NOT_CACHEABLE, NO_CACHE}


def fingerprint_record(node: Node, key: str, dep_keys: Mapping[str, str], salt: str) -> dict:
    """What the cache remembers per node id so the next build can say what changed."""
    return {
        "key": key,
        "kind": node.kind,
        "inputs": dict(node.inputs),
        "deps": {dep: dep_keys[dep] for dep in node.deps},
        "salt": salt,
    }


def miss_reason(
    node: Node,
    key: str,
    dep_keys: Mapping[str, str],
    salt: str,
    previous: Mapping[str, Any] | None,
) -> str:
    """Why a cacheable node with no usable entry must run, comparing against its last record."""
    if previous is None:
        return FIRST_BUILD
    if previous.get("key") == key:
        return EVICTED
    old_inputs: Mapping[str, str] = previous.get("inputs") or {}
    old_deps: Mapping[str, str] = previous.get("deps") or {}
    new_inputs, new_deps = dict(node.inputs), {dep: dep_keys[dep] for dep in node.deps}
    parts = [
        *_differences("input", "inputs", old_inputs, new_inputs),
        *_differences("dependency", "dependencies", old_deps, new_deps),
        "tool versions changed (salt)" if previous.get("salt") != salt else "",
        f"kind changed from '{previous.get('kind')}'" if previous.get("kind") != node.kind else "",
    ]
    return "; ".join(p for p in parts if p) or "cache key recipe changed"


def _differences(one: str, many: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """E.g. ["input 'source' changed", "inputs 'a', 'b' added"] (empty strings when none)."""
    changes = {
        "changed": [name for name in new if name in old and old[name] != new[name]],
        "added": [name for name in new if name not in old],
        "removed": [name for name in old if name not in new],
    }
    lines = []
    for verb, names in changes.items():
        if names:
            quoted = ", ".join(f"'{name}'" for name in sorted(names))
            lines.append(f"{one if len(names) == 1 else many} {quoted} {verb}")
    return lines


def explain(results: Mapping[str, NodeResult]) -> list[str]:
    """One line per node, in the order given, e.g.
    `compile:mlp:cpu  rebuilt: input 'source' changed` or `import:mlp       hit`.
    """
    width = max((len(node_id) for node_id in results), default=0)
    lines = []
    for node_id, result in results.items():
        if result.status == "hit":
            verdict = "hit"
        elif result.status == "built":
            verdict = f"{'built' if result.reason in _FRESH else 'rebuilt'}: {result.reason}"
        elif result.status == "pending":
            verdict = f"{'will build' if result.reason in _FRESH else 'will rebuild'}: "
            verdict += result.reason
        else:
            verdict = f"{result.status}: {result.reason}"
        lines.append(f"{node_id.ljust(width)}  {verdict}")
    return lines
