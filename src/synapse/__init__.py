"""SYNaPSe: the build DAG executor under PLeX. Generic: it knows nothing of models or IREE.

A `Node` holds a `Job`: a frozen dataclass that is both its cache key (every field) and the
argument of its registered `step` function. A `Plan` validates nodes into a DAG, and only the
`Executor` decides when and where a step runs. Outputs are reused through a content-addressed
`Cache` keyed by `node_key` (the job's fields, its dependencies' keys and a global salt). See
docs/synapse.md.

    @dataclass(frozen=True)
    class CompileJob(Job):
        kind = "compile"
        source: Output            # a dependency, by construction
        flags: tuple[str, ...]    # every field enters the key

    @step(CompileJob)
    def run_compile(job: CompileJob, ctx: NodeContext) -> None: ...

    plan = Plan([Node("a", ImportJob(InputFile(path))), Node("b", CompileJob(Output("a"), flags))])
    with make_progress("auto") as progress:
        results = Executor(Cache(root), jobs=4, salt="iree=3.13.0", on_event=progress).run(plan)
    print("\\n".join(explain(results)))
"""

from synapse._cache import Cache, CacheEntryInfo, GcResult
from synapse._events import Event, EventKind, EventSink
from synapse._executor import Executor, NodeResult, NodeStatus, RunResult
from synapse._explain import explain
from synapse._fingerprint import bytes_digest, file_digest, json_digest, node_key
from synapse._job import (
    InputFile,
    InputTree,
    Job,
    Output,
    job_inputs,
    job_outputs,
    keyed_fields,
    keyless,
    run_job,
    step,
)
from synapse._plan import Node, NodeContext, Plan
from synapse.errors import BuildFailed, CacheError, PlanError, SynapseError
from synapse.progress import (
    JsonProgress,
    PlainProgress,
    ProgressRenderer,
    RichProgress,
    make_progress,
)

# The Ray executor's module imports ray: loaded only when one of its names is asked for, so local
# builds never pay it (without Ray installed, asking raises ImportError).
_RAY_NAMES = ("RayExecutor", "DEFAULT_SHARED_CACHE", "call_with_resources")


def __getattr__(name: str) -> object:
    if name in _RAY_NAMES:
        from synapse import _ray

        return getattr(_ray, name)
    raise AttributeError(f"module 'synapse' has no attribute {name!r}")


__all__ = [
    "DEFAULT_SHARED_CACHE",
    "BuildFailed",
    "Cache",
    "CacheEntryInfo",
    "CacheError",
    "Event",
    "EventKind",
    "EventSink",
    "Executor",
    "GcResult",
    "InputFile",
    "InputTree",
    "Job",
    "JsonProgress",
    "Node",
    "NodeContext",
    "NodeResult",
    "NodeStatus",
    "Output",
    "PlainProgress",
    "Plan",
    "PlanError",
    "ProgressRenderer",
    "RayExecutor",
    "RichProgress",
    "RunResult",
    "SynapseError",
    "bytes_digest",
    "call_with_resources",
    "explain",
    "file_digest",
    "job_inputs",
    "job_outputs",
    "json_digest",
    "keyed_fields",
    "keyless",
    "make_progress",
    "node_key",
    "run_job",
    "step",
]
