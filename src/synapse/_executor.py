"""The local executor: decides what runs, runs it on a bounded thread pool, fills the cache.

A run has two phases. Triage (no actions run): every node's key comes from its inputs and its
dependencies' keys, so the whole plan's hits and misses, and why, are known up front. Execution:
misses run as soon as their dependencies are available, at most `jobs` at a time; actions are
expected to spend their time in native code (the IREE compiler) that releases the GIL.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from synapse import _explain
from synapse._cache import Cache, _pid_alive
from synapse._events import Event, EventKind, EventSink
from synapse._fingerprint import node_key
from synapse._job import run_job
from synapse._plan import Node, NodeContext, Plan
from synapse._worker import WorkerPool
from synapse.errors import BuildFailed, DiskFull

NodeStatus = Literal["hit", "built", "failed", "cancelled", "skipped", "pending"]


@dataclass(frozen=True)
class NodeResult:
    """How one node ended. `out_dir` holds its outputs (None when it has none: failed, skipped).

    `reason` says why it ran or did not (see `synapse.explain`). "pending" appears only in
    `Executor.preview`.
    """

    node_id: str
    key: str
    out_dir: Path | None
    status: NodeStatus
    reason: str
    seconds: float = 0.0
    # Keeps a run's scratch folder (outputs of uncached nodes) alive while this result is.
    _keepalive: object = field(default=None, repr=False, compare=False)


class RunResult(dict[str, NodeResult]):
    """Node id -> NodeResult, in topological order.

    Outputs of nodes that were not cached live in a scratch folder that is deleted when this
    object and every NodeResult from it are garbage collected (or at interpreter exit).
    """

    scratch: Path | None = None
    _keepalive: object = None


_SCRATCH_PREFIX = "synapse-run-"
_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


class _Scratch:
    """A temporary folder for uncached outputs, removed when the last reference goes.

    Its name carries the host and pid of its process (`synapse-run-<host>-<pid>-...`), so the
    folders of a process that was killed outright are recognised and removed by the next run
    (`remove_stale`)."""

    def __init__(self, parent: Path | None) -> None:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        prefix = f"{_SCRATCH_PREFIX}{_HOST}-{os.getpid()}-"
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    @staticmethod
    def remove_stale(parent: Path | None) -> None:
        """Delete the scratch folders under `parent` whose process on this host is gone."""
        folder = parent if parent is not None else Path(tempfile.gettempdir())
        try:
            names = [p.name for p in folder.iterdir() if p.name.startswith(_SCRATCH_PREFIX)]
        except OSError:
            return
        for name in names:
            host, _, rest = name[len(_SCRATCH_PREFIX) :].partition("-")
            pid = rest.partition("-")[0]
            if host == _HOST and pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(folder / name, ignore_errors=True)

    def new_dir(self, node_id: str) -> Path:
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", node_id)[:60] + "-"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.path))


@dataclass
class _Triage:
    key: str
    hit: Path | None
    reason: str
    discarded: str = ""  # the cache's message when a corrupt entry was thrown away


class Executor:
    """Runs plans locally.

    cache: where outputs are reused and stored; None runs everything into a scratch folder.
    jobs: most actions running at once (default: the CPU count).
    salt: mixed into every key; pass the tool versions (e.g. "iree=3.13.0").
    on_event: receives `Event`s; calls are serialized, so it need not be thread-safe.
    workdir: parent of scratch folders for uncached outputs (default: the system temp folder).
    memory_budget: bytes of temporary memory that nodes with a `memory` estimate may use at once
    (None: no limit). Such nodes start only while the running ones' estimates plus theirs fit;
    a node whose estimate alone exceeds the budget runs with no other such node.
    isolate: run the steps of nodes marked `isolate=True` in worker processes, kept for the run
    (False: every step in this process's threads, e.g. to debug a step).
    """

    def __init__(
        self,
        cache: Cache | None,
        jobs: int | None = None,
        salt: str = "",
        on_event: EventSink | None = None,
        workdir: str | os.PathLike[str] | None = None,
        memory_budget: int | None = None,
        isolate: bool = True,
    ) -> None:
        self.cache = cache
        self.isolate = isolate
        self.jobs = jobs if jobs is not None else (os.cpu_count() or 1)
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {self.jobs}")
        self.salt = salt
        self.on_event = on_event
        self.workdir = Path(workdir) if workdir is not None else None
        if memory_budget is not None and memory_budget < 0:
            raise ValueError(f"memory_budget must be at least 0, got {memory_budget}")
        self.memory_budget = memory_budget
        self._event_lock = threading.Lock()

    def keys(self, plan: Plan) -> dict[str, str]:
        """Every node's cache key, in topological order. Runs nothing, reads nothing."""
        keys: dict[str, str] = {}
        for node_id in plan.topological_order():
            keys[node_id] = node_key(plan.nodes[node_id], keys, self.salt)
        return keys

    def preview(self, plan: Plan) -> RunResult:
        """What `run` would do: each node "hit" or "pending" with its reason. Runs no action
        (a corrupt cache entry found on the way is still discarded)."""
        keys = self.keys(plan)
        result = RunResult()
        for node_id, triage in self._triage(plan, keys).items():
            status: NodeStatus = "hit" if triage.hit else "pending"
            result[node_id] = NodeResult(node_id, triage.key, triage.hit, status, triage.reason)
        return result

    def run(self, plan: Plan) -> RunResult:
        """Run every node that is not a cache hit; return how each node ended.

        Raises BuildFailed (the action's error as `__cause__`) after the nodes that were running
        when the first action failed have finished; re-raises KeyboardInterrupt after cancelling
        and waiting for running actions. Failed and cancelled nodes leave nothing in the cache.
        """
        self._remove_stale_temporaries()
        keys = self.keys(plan)
        triage = self._triage(plan, keys)
        return _Run(self, plan, keys, triage).execute()

    def _remove_stale_temporaries(self) -> None:
        """What builds killed outright (SIGKILL, OOM) left: staging folders in the cache and
        scratch folders. Only folders whose owner process is gone are touched."""
        if self.cache is not None:
            with contextlib.suppress(OSError):  # a read-only cache has nothing of ours
                self.cache.remove_stale_temporaries()
        _Scratch.remove_stale(self.workdir)

    def _triage(self, plan: Plan, keys: Mapping[str, str]) -> dict[str, _Triage]:
        out: dict[str, _Triage] = {}
        for node_id, key in keys.items():
            node = plan.nodes[node_id]
            if self.cache is None:
                out[node_id] = _Triage(key, None, _explain.NO_CACHE)
                continue
            if not node.cacheable:
                out[node_id] = _Triage(key, None, _explain.NOT_CACHEABLE)
                continue
            discarded: list[str] = []
            hit = self.cache.get(key, on_discard=discarded.append)
            if hit is not None:
                out[node_id] = _Triage(key, hit, _explain.HIT)
            elif discarded:
                out[node_id] = _Triage(key, None, _explain.CORRUPT, discarded[0])
            else:
                previous = self.cache.previous_inputs(node_id)
                reason = _explain.miss_reason(node, key, keys, self.salt, previous)
                out[node_id] = _Triage(key, None, reason)
        return out

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            with self._event_lock:
                self.on_event(event)


class _Run:
    """The mutable state of one `Executor.run`; the main thread schedules, workers build."""

    def __init__(
        self, executor: Executor, plan: Plan, keys: dict[str, str], triage: dict[str, _Triage]
    ) -> None:
        self.executor = executor
        self.cache = executor.cache
        self.plan = plan
        self.keys = keys
        self.triage = triage
        self.cancelled = threading.Event()
        self.results: dict[str, NodeResult] = {}
        self.outputs: dict[str, Path] = {i: t.hit for i, t in triage.items() if t.hit is not None}
        self._scratch: _Scratch | None = None
        self._scratch_lock = threading.Lock()
        self._workers: WorkerPool | None = None  # started by the first isolated step
        self._counter_lock = threading.Lock()
        self.done = 0
        self.hits = 0
        self.started = time.monotonic()

    # -- events ----------------------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        node: Node | None = None,
        *,
        finished: bool = False,
        hit: bool = False,
        **fields: object,
    ) -> None:
        with self._counter_lock:
            self.done += finished
            self.hits += hit
            counters = {"done": self.done, "total": len(self.plan), "hits": self.hits}
        if node is not None:
            fields.update(node_id=node.id, label=node.label, heavy=node.heavy)
            fields.update(key=self.keys[node.id])
        self.executor._emit(Event(kind, **counters, **fields))

    # -- main thread -----------------------------------------------------------------------

    def execute(self) -> RunResult:
        plan = self.plan
        to_run = [i for i in plan.topological_order() if self.triage[i].hit is None]
        hits = len(plan) - len(to_run)
        self.emit("plan", message=f"{len(plan)} nodes, {hits} cached, {len(to_run)} to run")
        for node_id, triage in self.triage.items():
            node = plan.nodes[node_id]
            if triage.discarded:
                self.emit("cache", node, status="discarded", message=triage.discarded)
            if triage.hit is not None:
                self.results[node_id] = NodeResult(
                    node_id, triage.key, triage.hit, "hit", "cache hit"
                )
                self._record(node, only_if_changed=True)
                self.emit("cache", node, status="hit", message="cache hit", finished=True, hit=True)

        waiting_on = {i: {d for d in plan.nodes[i].deps if d not in self.outputs} for i in to_run}
        pending = list(to_run)
        running: dict[Future, str] = {}
        failure: tuple[str, BaseException] | None = None
        interrupt: BaseException | None = None
        pool = ThreadPoolExecutor(
            max_workers=max(1, min(self.executor.jobs, len(to_run))),
            thread_name_prefix="synapse",
        )
        try:
            while True:
                if not self.cancelled.is_set():
                    for node_id in [i for i in pending if not waiting_on[i]]:
                        if len(running) >= self.executor.jobs:
                            break
                        node = plan.nodes[node_id]
                        if not self._fits_memory(node, running.values()):
                            continue  # a later ready node may need no memory
                        pending.remove(node_id)
                        running[pool.submit(self._build, node)] = node_id
                if not running:
                    break
                try:
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                except KeyboardInterrupt as exc:  # Ctrl-C while waiting: drain, then re-raise
                    if interrupt is not None:
                        raise
                    interrupt = exc
                    self.cancelled.set()
                    continue
                for future in finished:
                    node_id = running.pop(future)
                    result, error = future.result()
                    self.results[node_id] = result
                    if result.status == "built":
                        self.outputs[node_id] = result.out_dir
                        # A dependent that is a cache hit waits on nothing (its dependency ran
                        # only because that entry was discarded or evicted on its own).
                        for user in plan.dependents(node_id):
                            if user in waiting_on:
                                waiting_on[user].discard(node_id)
                    elif isinstance(error, Exception):
                        failure = failure or (node_id, error)
                        self.cancelled.set()
                    elif error is not None:
                        interrupt = interrupt or error
                        self.cancelled.set()
        except BaseException:
            self.cancelled.set()  # e.g. Ctrl-C outside `wait`: stop the actions before leaving
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if self._workers is not None:
                self._workers.close()

        why = "interrupted" if interrupt else f"'{failure[0]}' failed" if failure else ""
        for node_id in pending:
            key = self.keys[node_id]
            self.results[node_id] = NodeResult(node_id, key, None, "skipped", f"not run: {why}")
        ordered = RunResult((i, self.results[i]) for i in plan.topological_order())
        if self._scratch is not None:
            ordered.scratch, ordered._keepalive = self._scratch.path, self._scratch
        status = "interrupted" if interrupt else "failed" if failure else "ok"
        seconds = time.monotonic() - self.started
        self.emit("done", status=status, seconds=seconds, message=_summary(ordered, seconds))
        if interrupt is not None:
            raise interrupt
        if failure is not None:
            raise BuildFailed(failure[0], failure[1], ordered) from failure[1]
        return ordered

    def _fits_memory(self, node: Node, running: Iterable[str]) -> bool:
        """Whether `node` may start next to the `running` node ids under the memory budget."""
        budget = self.executor.memory_budget
        if budget is None or node.memory == 0:
            return True
        in_use = sum(self.plan.nodes[i].memory for i in running)
        # Over budget on its own: it runs, but alone among the nodes that declare memory.
        return in_use == 0 or in_use + node.memory <= budget

    def _record(self, node: Node, *, only_if_changed: bool = False) -> None:
        """Remember the node's inputs for the next build's explain."""
        if self.cache is None or not node.cacheable:
            return
        key = self.keys[node.id]
        if only_if_changed:
            previous = self.cache.previous_inputs(node.id)
            if previous is not None and previous.get("key") == key:
                return
        record = _explain.fingerprint_record(node, key, self.keys, self.executor.salt)
        with contextlib.suppress(OSError):  # explain records are a courtesy, never a failure
            self.cache.record_inputs(node.id, record)

    # -- worker threads --------------------------------------------------------------------

    def _build(self, node: Node) -> tuple[NodeResult, BaseException | None]:
        """Run one action and commit its outputs. Never raises: the error is returned."""
        key, reason = self.keys[node.id], self.triage[node.id].reason
        if self.cancelled.is_set():
            return NodeResult(node.id, key, None, "skipped", "not run: build stopping"), None
        cached = self.cache is not None and node.cacheable
        keepalive = self._scratch_folder() if not cached else None
        start = time.monotonic()
        out_dir: Path | None = None
        try:
            out_dir = self.cache.staging_dir() if cached else keepalive.new_dir(node.id)
            context = NodeContext(
                node=node,
                out_dir=out_dir,
                dep_outputs=MappingProxyType({dep: self.outputs[dep] for dep in node.deps}),
                cancelled=self.cancelled,
                key=key,
                _log=lambda msg: self.emit("log", node, message=str(msg)),
            )
            self.emit("start", node, message=node.label or node.id)
            if node.isolate and self.executor.isolate:
                self._worker_pool().run(node, context)
            else:
                run_job(node.job, context)
            if self.cancelled.is_set():
                # It may have returned early because it saw the flag: its output is not trusted.
                raise _Cancelled
            if cached:
                staged, out_dir = out_dir, None  # `put` moves it, or removes it if it fails
                out_dir = self.cache.put(key, staged, node_id=node.id, kind=node.kind)
        except BaseException as exc:
            if out_dir is not None:
                shutil.rmtree(out_dir, ignore_errors=True)
            exc = self._disk_full(exc, node, out_dir)
            seconds = time.monotonic() - start
            if isinstance(exc, Exception) and not self.cancelled.is_set():
                why = f"{type(exc).__name__}: {exc}"
                self.emit(
                    "error", node, status="failed", message=why, seconds=seconds, finished=True
                )
                return NodeResult(node.id, key, None, "failed", why, seconds), exc
            if isinstance(exc, Exception):
                # Stopped because another node failed or Ctrl-C: not a failure of its own.
                why, error = "build stopped while it ran; output discarded", None
            else:
                why, error = f"interrupted ({type(exc).__name__})", exc
            self.emit(
                "finish", node, status="cancelled", message=why, seconds=seconds, finished=True
            )
            return NodeResult(node.id, key, None, "cancelled", why, seconds), error
        seconds = time.monotonic() - start
        self._record(node)
        self.emit("finish", node, status="built", message=reason, seconds=seconds, finished=True)
        return NodeResult(node.id, key, out_dir, "built", reason, seconds, keepalive), None

    def _worker_pool(self) -> WorkerPool:
        with self._scratch_lock:
            if self._workers is None:
                self._workers = WorkerPool()
            return self._workers

    def _disk_full(self, exc: BaseException, node: Node, out_dir: Path | None) -> BaseException:
        """A full disk as an error that names where and what to do; `[Errno 28]` alone names
        neither (a write to an open file carries no file name)."""
        if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return exc
        root = self.cache.root if self.cache is not None else None
        path = exc.filename or root or out_dir
        where = f" (in the build cache {root})" if exc.filename and root is not None else ""
        what = "the build cache " if path == root else ""
        error = DiskFull(
            f"no space left on the device of {what}{path}{where} while node '{node.id}' wrote "
            "its output: free space on that disk, make the cache smaller, or move it to a "
            "larger disk",
            str(path),
        )
        error.__cause__ = exc
        return error

    def _scratch_folder(self) -> _Scratch:
        with self._scratch_lock:
            if self._scratch is None:
                self._scratch = _Scratch(self.executor.workdir)
            return self._scratch


class _Cancelled(Exception):
    """Raised inside a worker when the build stopped while its action ran."""


def _summary(results: Mapping[str, NodeResult], seconds: float) -> str:
    counts: dict[str, int] = {}
    for result in results.values():
        counts[result.status] = counts.get(result.status, 0) + 1
    parts = [f"{n} {status}" for status, n in counts.items()]
    return f"{', '.join(parts) or 'nothing to do'} in {seconds:.2f}s"
