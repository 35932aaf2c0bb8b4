"""Jobs: a node's work as a value. A job is a frozen dataclass that is both the node's cache key
(every field, by construction) and the argument of the one registered step function that runs it.

A key kept by hand beside a closure can forget a field the closure reads, and then the cache
serves a stale build. Here nothing can be forgotten: `job_inputs` fingerprints every field of
the dataclass, a field that must not enter the key says so with `keyless(why)`, and a bare path
is refused (a path says where a file is, not what it holds: wrap it in `InputFile` or
`InputTree`, whose contents are hashed). Jobs pickle, so a step can run in another process or
on another machine; only the registry lookup happens there.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from synapse._fingerprint import bytes_digest, file_digest, json_digest
from synapse.errors import PlanError

if TYPE_CHECKING:
    from synapse._plan import NodeContext

# Field metadata key of a field left out of the key; its value is the reason.
_KEYLESS = "synapse.keyless"


def keyless(why: str, **kwargs: Any) -> Any:
    """A job field that does not enter the node's key, with the reason (e.g. a destination path
    of an uncached node, or a progress label). `kwargs` go to `dataclasses.field`."""
    if not why:
        raise PlanError("keyless(why): say why the field cannot change the node's output")
    return field(metadata={_KEYLESS: why}, **kwargs)


@dataclass(frozen=True)
class InputFile:
    """A file a step reads; its bytes, not its path, enter the key (a moved project stays
    cached)."""

    path: Path


@dataclass(frozen=True)
class InputTree:
    """The files under `root` whose names end with `suffix` (e.g. the .py files a model file may
    import): their relative names and bytes enter the key. Hidden folders, `__pycache__` and
    `site-packages` are skipped."""

    root: Path
    suffix: str

    def files(self) -> list[Path]:
        skip = ("__pycache__", "site-packages")
        return sorted(
            p
            for p in self.root.rglob(f"*{self.suffix}")
            if p.is_file()
            and not any(
                part.startswith(".") or part in skip for part in p.relative_to(self.root).parts
            )
        )


@dataclass(frozen=True)
class Output:
    """The output folder of another node. The node depends on it, and that node's key (not its
    id) is what enters this node's key."""

    node_id: str


class Job:
    """Base of job dataclasses. `kind` names the kind of node (import, compile, ...).

    `step_module` names the module whose import registers the job type's step: `run_job`
    imports it on first use, so making a plan never loads what only running a step needs, and a
    job unpickled in a worker process finds its step. `resources` is what a run of the step
    claims on a cluster (see `synapse._ray.task_options`).
    """

    kind: ClassVar[str] = "job"
    step_module: ClassVar[str | None] = None
    # What one run of the step occupies where steps are scheduled by resources (RayExecutor):
    # e.g. {"GPU": 1} for a timing trial, so one trial runs per GPU at a time. Empty: the
    # node's `heavy` flag decides its CPUs. Not part of the key: where a step runs does not
    # change what it writes.
    resources: ClassVar[Mapping[str, float]] = MappingProxyType({})


J = TypeVar("J", bound=Job)
StepFunction = Callable[[Any, "NodeContext"], None]
_STEPS: dict[type, StepFunction] = {}


def step(job_type: type[J]) -> Callable[[Callable[[J, NodeContext], None]], Callable]:
    """Register the module-level function that runs jobs of `job_type`: `fn(job, ctx)` writes
    its outputs under `ctx.out_dir` and reads dependencies with `ctx.output(job.field)`."""

    def register(fn: Callable[[J, NodeContext], None]) -> Callable[[J, NodeContext], None]:
        if not dataclasses.is_dataclass(job_type) or not job_type.__dataclass_params__.frozen:
            raise PlanError(f"{job_type.__name__} must be a frozen dataclass to be a job")
        other = _STEPS.get(job_type)
        if other is not None and other is not fn:
            raise PlanError(f"{job_type.__name__} already runs through {other.__qualname__}")
        _STEPS[job_type] = fn
        return fn

    return register


def run_job(job: Job, ctx: NodeContext) -> None:
    """Run `job` through its registered step."""
    fn = _STEPS.get(type(job))
    if fn is None and type(job).step_module is not None:
        importlib.import_module(type(job).step_module)
        fn = _STEPS.get(type(job))
    if fn is None:
        raise PlanError(
            f"no step is registered for {type(job).__qualname__}; decorate its step function "
            f"with @synapse.step({type(job).__name__}) in an imported module"
        )
    fn(job, ctx)


def keyed_fields(job_type: type) -> list[dataclasses.Field]:
    """The fields of a job type that enter its key (all but the `keyless` ones)."""
    return [f for f in dataclasses.fields(job_type) if _KEYLESS not in f.metadata]


def job_inputs(job: Job) -> dict[str, str]:
    """Field name -> fingerprint, for every keyed field (files hashed by content)."""
    if not dataclasses.is_dataclass(job) or isinstance(job, type):
        raise PlanError(f"a job must be a dataclass instance, got {type(job).__name__}")
    where = type(job).__name__
    return {
        f.name: json_digest(_canonical(getattr(job, f.name), f"{where}.{f.name}"))
        for f in keyed_fields(type(job))
    }


def job_outputs(job: Job) -> tuple[str, ...]:
    """Ids of the nodes whose outputs the job reads (its `Output` fields, anywhere inside them),
    in field order: the node's dependencies, by construction."""
    return tuple(dict.fromkeys(o.node_id for o in _walk_outputs(job)))


def _walk_outputs(value: Any) -> Iterator[Output]:
    if isinstance(value, Output):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk_outputs(getattr(value, f.name))
    elif isinstance(value, (tuple, list, frozenset, set)):
        for item in value:
            yield from _walk_outputs(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _walk_outputs(item)


def _canonical(value: Any, where: str) -> Any:
    """A JSON value standing for `value` in a key: contents for files, ids for outputs."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, InputFile):
        return {"file": file_digest(value.path)}
    if isinstance(value, InputTree):
        files = value.files()
        return {"tree": {p.relative_to(value.root).as_posix(): file_digest(p) for p in files}}
    if isinstance(value, Output):
        return {"output": value.node_id}
    if isinstance(value, (PurePath, os.PathLike)):
        raise PlanError(
            f"{where} is a path ({value}); a key needs what the file holds: wrap it in "
            "synapse.InputFile / InputTree, or mark the field keyless(why)"
        )
    if isinstance(value, enum.Enum):
        return _canonical(value.value, where)
    if isinstance(value, (tuple, list)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (frozenset, set)):
        return sorted(json_digest(_canonical(v, where)) for v in value)
    if isinstance(value, Mapping):
        pairs = [[_canonical(k, where), _canonical(v, f"{where}[{k!r}]")] for k, v in value.items()]
        return {"dict": sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if isinstance(value, bytes):
        return {"bytes": bytes_digest(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "type": type(value).__qualname__,
            "fields": {
                f.name: _canonical(getattr(value, f.name), f"{where}.{f.name}")
                for f in keyed_fields(type(value))
            },
        }
    raise PlanError(f"{where}: a {type(value).__name__} cannot enter a key ({value!r})")


__all__ = [
    "InputFile",
    "InputTree",
    "Job",
    "Output",
    "job_inputs",
    "job_outputs",
    "keyed_fields",
    "keyless",
    "run_job",
    "step",
]
