"""SYNaPSe: the build DAG executor under PLeX. Generic: it knows nothing of models or IREE.

Nodes describe work (`Node`), a `Plan` validates them into a DAG, and only the `Executor` decides
when and where an action runs. Outputs are reused through a content-addressed `Cache` keyed by
`node_key` (a node's inputs, its dependencies' keys and a global salt). See docs/synapse.md.

    plan = Plan([Node("a", "import", make_a), Node("b", "compile", make_b, deps=("a",))])
    with make_progress("auto") as progress:
        results = Executor(Cache(root), jobs=4, salt="iree=3.13.0", on_event=progress).run(plan)
    print("\\n".join(explain(results)))
"""

from synapse._cache import Cache, CacheEntryInfo, GcResult
from synapse._events import Event, EventKind, EventSink
from synapse._executor import Executor, NodeResult, NodeStatus, RunResult
from synapse._explain import explain
from synapse._fingerprint import bytes_digest, file_digest, json_digest, node_key
from synapse._plan import Node, NodeContext, Plan
from synapse.errors import BuildFailed, CacheError, PlanError, SynapseError
from synapse.progress import (
    JsonProgress,
    PlainProgress,
    ProgressRenderer,
    RichProgress,
    make_progress,
)

__all__ = [
    "BuildFailed",
    "Cache",
    "CacheEntryInfo",
    "CacheError",
    "Event",
    "EventKind",
    "EventSink",
    "Executor",
    "GcResult",
    "JsonProgress",
    "Node",
    "NodeContext",
    "NodeResult",
    "NodeStatus",
    "PlainProgress",
    "Plan",
    "PlanError",
    "ProgressRenderer",
    "RichProgress",
    "RunResult",
    "SynapseError",
    "bytes_digest",
    "explain",
    "file_digest",
    "json_digest",
    "make_progress",
    "node_key",
]
