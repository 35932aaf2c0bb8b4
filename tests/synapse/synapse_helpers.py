"""Job types, steps and small real plans for the SYNaPSe tests.

Everything here is module-level, as a real build's jobs are: a spawned worker process imports
this module by name and finds the same steps. Test instruments (a Recorder, a threading.Event,
an exception to raise) sit in jobs as `keyless("test instrument")` fields: they steer or watch
a step and cannot change what it writes.
"""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from synapse import (
    InputFile,
    InputTree,
    Job,
    Node,
    NodeContext,
    Output,
    Plan,
    keyless,
    run_job,
    step,
)


class Recorder:
    """Thread-safe log of which steps ran, when, and how many ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: list[str] = []
        self.spans: dict[str, tuple[float, float]] = {}
        self.active = 0
        self.max_active = 0

    def __enter__(self) -> Recorder:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1

    def record(self, node_id: str, start: float, end: float) -> None:
        with self._lock:
            self.runs.append(node_id)
            self.spans[node_id] = (start, end)


# -- concat: the workhorse ----------------------------------------------------------------------


@dataclass(frozen=True)
class ConcatJob(Job):
    """Writes `out.txt`: "(source dep1 dep2 ...)", each dependency's own `out.txt` in order."""

    kind = "concat"
    source: str
    deps: tuple[Output, ...] = ()
    recorder: Recorder | None = keyless("test instrument", default=None)
    sleep_s: float = keyless("test pacing: how long the step takes", default=0.0)


# One job type per kind of a PLeX build, so a plan reads (and describes) like one; all run
# through the same step.
@dataclass(frozen=True)
class ResolveJob(ConcatJob):
    kind = "resolve"


@dataclass(frozen=True)
class ImportJob(ConcatJob):
    kind = "import"


@dataclass(frozen=True)
class WeightsJob(ConcatJob):
    kind = "weights"


@dataclass(frozen=True)
class CompileJob(ConcatJob):
    kind = "compile"


@dataclass(frozen=True)
class ComposeJob(ConcatJob):
    kind = "compose"


@step(ConcatJob)
@step(ResolveJob)
@step(ImportJob)
@step(WeightsJob)
@step(CompileJob)
@step(ComposeJob)
def run_concat(job: ConcatJob, ctx: NodeContext) -> None:
    start = time.monotonic()
    with job.recorder or nullcontext():
        try:
            time.sleep(job.sleep_s)
            parts = [job.source] + [(ctx.output(d) / "out.txt").read_text() for d in job.deps]
            (ctx.out_dir / "out.txt").write_text("(" + " ".join(parts) + ")")
        finally:
            if job.recorder is not None:
                job.recorder.record(ctx.node.id, start, time.monotonic())


def diamond_plan(
    sources: Mapping[str, str] | None = None,
    recorder: Recorder | None = None,
    sleep_s: float = 0.0,
) -> Plan:
    """resolve -> (import, weights) -> compile -> compose (uncached), like a PLeX build.

    `sources` overrides the `source` field (and so the key) of any node.
    """
    text = {"resolve": "r", "import": "i", "weights": "w", "compile": "c", "compose": "x"}
    text.update(sources or {})
    watch = {"recorder": recorder, "sleep_s": sleep_s}
    resolve = Output("resolve")
    return Plan(
        [
            Node("resolve", ResolveJob(text["resolve"], **watch)),
            Node("import", ImportJob(text["import"], (resolve,), **watch)),
            Node("weights", WeightsJob(text["weights"], (resolve,), **watch)),
            Node(
                "compile",
                CompileJob(text["compile"], (Output("import"), Output("weights")), **watch),
                heavy=True,
            ),
            Node(
                "compose",
                ComposeJob(text["compose"], (Output("compile"),), **watch),
                cacheable=False,
            ),
        ]
    )


# -- failure, cancellation, interruption --------------------------------------------------------


@dataclass(frozen=True)
class FailJob(Job):
    """Writes a partial output file (if `partial` names one), then raises `error`."""

    kind = "compile"
    error: BaseException = keyless("test instrument: what the step raises")
    partial: str = ""
    deps: tuple[Output, ...] = ()
    wait_for: threading.Event | None = keyless("test instrument: raise once set", default=None)


@step(FailJob)
def run_fail(job: FailJob, ctx: NodeContext) -> None:
    if job.wait_for is not None:
        job.wait_for.wait(timeout=10)
    if job.partial:
        (ctx.out_dir / job.partial).write_text("half")
    raise job.error


@dataclass(frozen=True)
class WaitForCancelJob(Job):
    """A long step that polls `ctx.cancelled`, as a long compile should, and returns early."""

    kind = "compile"
    started: threading.Event | None = keyless("test instrument", default=None)
    saw_cancel: threading.Event | None = keyless("test instrument", default=None)
    sigint_after_s: float | None = keyless(
        "test instrument: send this process Ctrl-C", default=None
    )


@step(WaitForCancelJob)
def run_wait_for_cancel(job: WaitForCancelJob, ctx: NodeContext) -> None:
    if job.started is not None:
        job.started.set()
    (ctx.out_dir / "out.txt").write_text("incomplete")
    if job.sigint_after_s is not None:
        threading.Timer(job.sigint_after_s, os.kill, (os.getpid(), signal.SIGINT)).start()
    if ctx.cancelled.wait(timeout=10) and job.saw_cancel is not None:
        job.saw_cancel.set()  # returns early: its output must not be trusted


@dataclass(frozen=True)
class InspectJob(Job):
    """Logs what it sees of its dependency and checks its context."""

    kind = "compile"
    source: Output


@step(InspectJob)
def run_inspect(job: InspectJob, ctx: NodeContext) -> None:
    ctx.log(f"deps: {sorted(ctx.dep_outputs)}")
    assert (ctx.output(job.source) / "out.txt").is_file()
    assert ctx.key and ctx.out_dir.is_dir() and not any(ctx.out_dir.iterdir())
    (ctx.out_dir / "out.txt").write_text("ok")


# -- memory -------------------------------------------------------------------------------------


class MemoryMeter:
    """Adds up the declared memory of the steps running at each moment."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_use = 0
        self.peak = 0
        self.max_running = 0
        self.running = 0


@dataclass(frozen=True)
class MeteredJob(Job):
    """Counts itself into `meter` for `sleep_s` while it runs, with its node's `memory`."""

    kind = "weights"
    meter: MemoryMeter = keyless("test instrument")
    barrier: threading.Barrier | None = keyless("test instrument: run all at once", default=None)
    sleep_s: float = keyless("test pacing", default=0.05)


@step(MeteredJob)
def run_metered(job: MeteredJob, ctx: NodeContext) -> None:
    meter, memory = job.meter, ctx.node.memory
    with meter.lock:
        meter.in_use += memory
        meter.running += 1
        meter.peak = max(meter.peak, meter.in_use)
        meter.max_running = max(meter.max_running, meter.running)
    if job.barrier is not None:
        job.barrier.wait(timeout=30)  # all must be running at once, however slow the machine
    time.sleep(job.sleep_s)
    (ctx.out_dir / "out.txt").write_text(ctx.node.id)
    with meter.lock:
        meter.in_use -= memory
        meter.running -= 1


# -- job rules: files, nested outputs, every kind of field --------------------------------------


@dataclass(frozen=True)
class Flags:
    """A nested value: its keyed fields enter the key of the job that holds it."""

    opt_level: int
    source: Output | None = None
    note: str = keyless("a comment for people", default="")


@dataclass(frozen=True)
class GatherJob(Job):
    """Reads dependencies named anywhere in its fields: a tuple, a dict, a nested dataclass."""

    kind = "gather"
    first: Output
    pair: tuple[Output, Output]
    named: Mapping[str, Output]
    flags: Flags


@step(GatherJob)
def run_gather(job: GatherJob, ctx: NodeContext) -> None:
    refs = [job.first, *job.pair, *(job.named[k] for k in sorted(job.named)), job.flags.source]
    parts = [(ctx.output(ref) / "out.txt").read_text() for ref in refs if ref is not None]
    (ctx.out_dir / "out.txt").write_text(" + ".join(parts))


@dataclass(frozen=True)
class ModelJob(Job):
    """Reads a model file and the .py files beside it, as a PLeX import does."""

    kind = "import"
    model: InputFile
    sources: InputTree
    entry: str = "main"


@step(ModelJob)
def run_model(job: ModelJob, ctx: NodeContext) -> None:
    names = [p.relative_to(job.sources.root).as_posix() for p in job.sources.files()]
    text = f"{job.entry}: {job.model.path.read_text()} [{', '.join(names)}]"
    (ctx.out_dir / "out.txt").write_text(text)


class Mode(enum.Enum):
    FAST = "fast"
    SMALL = "small"


@dataclass(frozen=True)
class KitchenSinkJob(Job):
    """A field of every kind a key can hold, to show that each one enters it."""

    kind = "sink"
    text: str
    count: int
    ratio: float
    enabled: bool
    maybe: str | None
    mode: Mode
    blob: bytes
    names: tuple[str, ...]
    tags: frozenset[str]
    options: Mapping[str, int]
    flags: Flags
    model: InputFile
    sources: InputTree
    source: Output
    destination: Path | None = keyless(
        "where the result is copied to; not what it holds", default=None
    )
    label: str = keyless("shown in progress only", default="")


@step(KitchenSinkJob)
def run_kitchen_sink(job: KitchenSinkJob, ctx: NodeContext) -> None:
    (ctx.out_dir / "out.txt").write_text(f"{job.text} x{job.count}")


@dataclass(frozen=True)
class UnregisteredJob(Job):
    """A job type no step was registered for."""

    kind = "orphan"
    source: str = ""


def run_job_elsewhere(job: Job, node_id: str, out_dir: str, dep_outputs: dict[str, str]) -> str:
    """Target of a spawned process: run `job` through `run_job`, return its `out.txt`."""
    ctx = NodeContext(
        node=Node(node_id, job),
        out_dir=Path(out_dir),
        dep_outputs={dep: Path(p) for dep, p in dep_outputs.items()},
        cancelled=threading.Event(),
    )
    run_job(job, ctx)
    return (Path(out_dir) / "out.txt").read_text()


def run_diamond_in_process(cache_root: str, barrier, queue) -> None:
    """Target of a spawned process: wait for the sibling process, then build the diamond."""
    from synapse import Cache, Executor

    barrier.wait(timeout=60)
    results = Executor(Cache(Path(cache_root)), jobs=2, salt="test").run(diamond_plan(sleep_s=0.05))
    queue.put(
        {node_id: (r.status, (r.out_dir / "out.txt").read_text()) for node_id, r in results.items()}
    )
