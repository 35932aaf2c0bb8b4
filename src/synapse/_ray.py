"""The Ray executor: the same plans, keys, cache, events and explain as `Executor`, but every
cacheable miss runs as a Ray task somewhere on a cluster.

Why it is built this way:
- Triage, scheduling order, failure and Ctrl-C handling are the local executor's (this class
  reuses its run loop); only "run one cacheable node" differs. One driver thread waits on each
  task in flight, so the local loop's bookkeeping applies unchanged.
- A task returns its output folder as one tar plus a small record (sha256 of the tar, where it
  ran, its log lines, its error). The driver checks the digest and commits the files to its own
  content-addressed `Cache`, so a cluster build leaves the same cache a local one does and the
  uncacheable nodes (compose, phases) run on the driver exactly as locally.
- A dependent task receives its dependencies' tars as ObjectRef arguments: Ray moves the bytes
  from the node that produced them, not through the driver. Outputs that were cache hits are
  put into the object store once, when a task first needs them.
- Tasks are deterministic (a job is its whole input), so a worker lost mid-task is handled by
  Ray's own retries (`max_retries`) and lineage reconstruction: the task runs again elsewhere.
- The shared cache is a named, detached actor on the head node that owns an ordinary `Cache`
  folder on the head's disk (`SharedCache`). Every driver that names the same folder talks to
  the same actor, so builders reuse each other's outputs without a shared filesystem, and the
  entries keep the local cache's guarantees (atomic rename under a lock, sha256 per file checked
  on every read); the tars it sends and receives are checked against their digest too.

What a cluster needs: the same Python environment on every node (the steps' modules are imported
by name) and the build's input files at the same paths (jobs name them by path; their bytes are
in the key, so a node that reads different bytes would build something the key does not say,
which is why a shared checkout, e.g. NFS, or identical images are assumed). Ray is imported only
by this module, which `synapse` loads only when a `RayExecutor` is asked for.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import ray

from synapse import _explain
from synapse._cache import ENTRY_FILE, Cache
from synapse._events import EventSink
from synapse._executor import Executor, NodeResult, RunResult, _Run, _Triage
from synapse._fingerprint import bytes_digest
from synapse._job import run_job
from synapse._plan import Node, NodeContext, Plan
from synapse.errors import SynapseError

# CPUs a step that is not `heavy` reserves: two light steps (weights, link) share a core.
LIGHT_STEP_CPUS = 0.5
# Ray retries a task whose worker or node died this many times (tasks are deterministic).
TASK_RETRIES = 3
# Where the shared cache's folder lives on the head node when the caller names none.
DEFAULT_SHARED_CACHE = "~/.cache/synapse/cluster"
_NAMESPACE = "synapse"
_HEAD_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource
_POLL_S = 0.2
T = TypeVar("T")


def task_options(node: Node) -> dict[str, Any]:
    """The Ray resources one run of `node`'s step reserves.

    `heavy` steps (imports, compiles) take a whole CPU, light ones `LIGHT_STEP_CPUS`; a `memory`
    estimate becomes Ray's `memory` resource, so a node's tasks never overcommit its RAM. A job
    type may claim more through `Job.resources` (e.g. `{"GPU": 1}` for a timing trial, so that
    one trial runs per GPU at a time; `{"CPU": 0}` for a step that only waits); other names are
    custom resources a node must offer.
    """
    claimed: dict[str, float] = dict(type(node.job).resources)
    options: dict[str, Any] = {
        "num_cpus": claimed.pop("CPU", 1.0 if node.heavy else LIGHT_STEP_CPUS),
        # Ray's default places a task where its largest argument lives; for compiles sharing
        # one import output that queues them all on one node while others idle. Moving the
        # output once per node costs seconds, a compile tens of seconds: spread heavy steps.
        "scheduling_strategy": "SPREAD" if node.heavy else "DEFAULT",
        "max_retries": TASK_RETRIES,
        "retry_exceptions": False,  # a step that raises would raise again: it is deterministic
        "name": node.id,
    }
    if "GPU" in claimed:
        options["num_gpus"] = claimed.pop("GPU")
    if node.memory:
        options["memory"] = node.memory
    if claimed:
        options["resources"] = claimed
    return options


@dataclass(frozen=True)
class Placement:
    """Where a task ran: the Ray node, its address, the worker process."""

    node_id: str  # Ray's node id (hex)
    address: str
    pid: int

    def __str__(self) -> str:
        return f"{self.address}/{self.node_id[:12]}/pid{self.pid}"


class ClusterUnavailable(SynapseError):
    """No Ray cluster at the address (none is ever started implicitly)."""


class ClusterExposed(SynapseError):
    """The cluster accepts drivers without authentication on addresses beyond loopback: PLeX
    will not put its shared cache there (anyone who reaches it could replace build outputs)."""


# Node addresses whose Ray processes listen on loopback only. Measured with ray 2.60: a node
# started with `--node-ip-address=127.0.0.1` (and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, else Ray
# swaps it for the external address) binds GCS, raylet and workers to 127.0.0.1; any other
# address, 127.0.0.2 included, binds them to every interface (`*:6379`).
LOOPBACK_ONLY_ADDRESSES = frozenset({"127.0.0.1", "::1", "localhost"})


def exposure(nodes: list[Mapping[str, Any]], token_auth: bool) -> str | None:
    """Why a cluster is open to anyone who can reach it (`nodes` as `ray.nodes()` gives
    them), or None: with Ray's token authentication on, or every live node on loopback."""
    if token_auth:
        return None
    reachable = sorted(
        {
            str(node.get("NodeManagerAddress"))
            for node in nodes
            if node.get("Alive", True)
            and node.get("NodeManagerAddress") not in LOOPBACK_ONLY_ADDRESSES
        }
    )
    if not reachable:
        return None
    return (
        f"the cluster runs without authentication (RAY_AUTH_MODE is not 'token' here) and "
        f"its nodes listen on {', '.join(reachable)}, beyond loopback"
    )


def _token_auth_enabled() -> bool:
    """Whether this driver authenticates with a token (RAY_AUTH_MODE=token). Ray 2.60 has no
    public call for it; an older Ray without token authentication has it off."""
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
    except ImportError:
        return False
    return bool(is_token_auth_enabled())


def _loopback_address(address: str) -> bool:
    host = address.removeprefix("ray://").rpartition(":")[0] or address
    return host.strip("[]") in LOOPBACK_ONLY_ADDRESSES


class RayExecutor(Executor):
    """Runs plans on a Ray cluster; same interface, results and events as `Executor`.

    address: the cluster (`ray.init`'s address: "HOST:PORT", "ray://HOST:PORT"); None uses the
        session this process already joined, else "auto" (RAY_ADDRESS or a `ray start` cluster
        on this machine). A cluster is never started implicitly, and a process already
        connected to one keeps it.
    jobs: most tasks in flight at once (Ray queues them further by their resources).
    shared_cache: folder on the head node of the cache that all drivers of this cluster share
        (`~` is the head's home); None shares nothing. Local hits are looked up first, then the
        shared cache; what a task builds goes to both.
    memory_budget: accepted for the same interface; on a cluster each node's `memory` resource
        plays that role (`task_options`).
    After `run`, `placements` maps each node that ran as a task to where it ran, and
    `step_seconds` to how long its step took there, `queued_seconds` to how long it waited
    for a free worker; the rest of the node's time is the cluster's cost (moving and unpacking
    tars, committing).
    """

    def __init__(
        self,
        cache: Cache | None,
        jobs: int | None = None,
        salt: str = "",
        on_event: EventSink | None = None,
        workdir: str | os.PathLike[str] | None = None,
        memory_budget: int | None = None,
        *,
        address: str | None = None,
        shared_cache: str | None = DEFAULT_SHARED_CACHE,
    ) -> None:
        super().__init__(cache, jobs or 64, salt, on_event, workdir, memory_budget=None)
        self.address = address
        self.shared_cache_root = shared_cache
        self.placements: dict[str, Placement] = {}
        self.step_seconds: dict[str, float] = {}  # the step alone, on its worker
        self.queued_seconds: dict[str, float] = {}  # submitted until its worker started it
        self._shared: Any = None

    def run(self, plan: Plan) -> RunResult:
        self._connect()
        self._remove_stale_temporaries()
        self.placements, self.step_seconds, self.queued_seconds = {}, {}, {}
        keys = self.keys(plan)
        return _RayRun(self, plan, keys, self._triage(plan, keys)).execute()

    def preview(self, plan: Plan) -> RunResult:
        self._connect()
        return super().preview(plan)

    def _connect(self) -> None:
        if not ray.is_initialized():
            address = self.address or "auto"
            # A driver of a loopback cluster listens on loopback too (Ray would otherwise bind
            # its own servers to the machine's external address).
            local = {"_node_ip_address": "127.0.0.1"} if _loopback_address(address) else {}
            try:
                # Workers' stdout (IREE's own warnings) would tear the driver's progress
                # display; steps record what a build must say in their outputs.
                ray.init(
                    address=address,
                    namespace=_NAMESPACE,
                    log_to_driver=False,
                    logging_level="WARNING",
                    configure_logging=False,
                    **local,
                )
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise ClusterUnavailable(
                    f"cannot reach the Ray cluster at {address!r}: {e} (start one with "
                    "`ray start --head`, or name it: --executor ray=HOST:PORT)"
                ) from e
        if self.shared_cache_root is not None and self._shared is None:
            problem = exposure(ray.nodes(), _token_auth_enabled())
            if problem is not None:
                raise ClusterExposed(
                    f"refusing to start the shared build cache on the Ray cluster at "
                    f"{self.address or 'auto'}: {problem}, so anyone who reaches it could read "
                    "and replace build outputs. Turn on Ray's token authentication "
                    "(RAY_AUTH_MODE=token on every node and driver), keep the cluster on "
                    "127.0.0.1, or build without the shared cache (PLEX_CLUSTER_CACHE=none); "
                    "see docs/cluster.md"
                )
            self._shared = shared_cache_actor(self.shared_cache_root)

    def _triage(self, plan: Plan, keys: Mapping[str, str]) -> dict[str, _Triage]:
        """Local triage, then the shared cache for the cacheable misses: a shared hit is copied
        into the local cache (checked on the way) and counts as a hit."""
        out = super()._triage(plan, keys)
        if self._shared is None or self.cache is None:
            return out
        misses = [i for i, t in out.items() if t.hit is None and plan.nodes[i].cacheable]
        if not misses:
            return out
        present = set(ray.get(self._shared.present.remote([keys[i] for i in misses])))
        fetches = {i: self._shared.fetch.remote(keys[i]) for i in misses if keys[i] in present}
        for node_id, ref in fetches.items():
            fetched = ray.get(ref)
            if fetched is None:  # evicted between the two calls
                continue
            digest, packed = fetched
            if bytes_digest(packed) != digest:
                continue  # damaged on the way: build it instead
            path = _commit(self.cache, keys[node_id], packed, plan.nodes[node_id])
            out[node_id] = _Triage(keys[node_id], path, _explain.HIT)
        return out


class _RayRun(_Run):
    """One run: the local loop, with cacheable nodes sent to the cluster."""

    executor: RayExecutor

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._refs: dict[str, ray.ObjectRef] = {}  # node id -> its output tar in the store
        self._refs_lock = threading.Lock()

    def _build(self, node: Node) -> tuple[NodeResult, BaseException | None]:
        if not node.cacheable:
            return super()._build(node)  # compose, phases: they write the user's files here
        return self._build_remote(node)

    def _dep_ref(self, dep: str) -> ray.ObjectRef:
        """The output tar of `dep` in the object store; a cache hit is put there once."""
        with self._refs_lock:
            ref = self._refs.get(dep)
            if ref is None:
                ref = self._refs[dep] = ray.put(pack_folder(self.outputs[dep]))
            return ref

    def _build_remote(self, node: Node) -> tuple[NodeResult, BaseException | None]:
        key, reason = self.keys[node.id], self.triage[node.id].reason
        if self.cancelled.is_set():
            return NodeResult(node.id, key, None, "skipped", "not run: build stopping"), None
        deps = tuple(node.deps)
        args = [self._dep_ref(dep) for dep in deps]
        self.emit("start", node, message=node.label or node.id)
        start, submitted = time.monotonic(), time.time()
        task = _run_fresh_step if node.fresh_process else _run_step
        tar_ref, record_ref = task.options(**task_options(node)).remote(
            node.job, node.id, key, deps, *args
        )
        with self._refs_lock:
            self._refs[node.id] = tar_ref

        def stopped(why: str, error: BaseException | None = None):
            seconds = time.monotonic() - start
            self.emit(
                "finish", node, status="cancelled", message=why, seconds=seconds, finished=True
            )
            return NodeResult(node.id, key, None, "cancelled", why, seconds), error

        try:
            while not ray.wait([record_ref], timeout=_POLL_S)[0]:
                if self.cancelled.is_set():
                    # Unlike a thread, a task can be stopped: its worker process is killed.
                    ray.cancel(record_ref, force=True)
                    return stopped("build stopped while it ran; task cancelled")
            record = ray.get(record_ref)
        except ray.exceptions.RayError as exc:  # the task could not run (retries spent, ...)
            return self._failed(node, key, exc, f"{type(exc).__name__}: {exc}", start)
        placement = record["placement"]
        for line in record["logs"]:
            self.emit("log", node, message=line, worker=str(placement))
        if record["error"] is not None:
            error = record["error"]
            error.add_note(f"synapse: node '{node.id}' ran on Ray worker {placement}")
            why = f"{type(error).__name__}: {error} (on worker {placement})"
            return self._failed(node, key, error, why, start, placement)
        if self.cancelled.is_set():
            return stopped("build stopped while it ran; output discarded")
        try:
            packed = ray.get(tar_ref)
            if bytes_digest(packed) != record["digest"]:
                raise OSError(f"output of '{node.id}' from worker {placement} arrived damaged")
            if self.cache is not None:
                out_dir = _commit(self.cache, key, packed, node)
                keepalive = None
            else:
                keepalive = self._scratch_folder()
                out_dir = keepalive.new_dir(node.id)
                unpack_folder(packed, out_dir)
            if self.executor._shared is not None and self.cache is not None:
                # The actor reads the tar from the object store, not from this process.
                ray.get(
                    self.executor._shared.store.remote(
                        key, node.id, node.kind, record["digest"], tar_ref
                    )
                )
        except Exception as exc:
            return self._failed(node, key, exc, f"{type(exc).__name__}: {exc}", start, placement)
        seconds = time.monotonic() - start
        self.executor.placements[node.id] = placement
        self.executor.step_seconds[node.id] = record["seconds"]
        # Clocks of two machines: exact on one host, as good as their sync elsewhere.
        self.executor.queued_seconds[node.id] = max(0.0, record["entered"] - submitted)
        self._record(node)
        self.emit(
            "finish",
            node,
            status="built",
            message=reason,
            seconds=seconds,
            finished=True,
            worker=str(placement),
        )
        return NodeResult(node.id, key, out_dir, "built", reason, seconds, keepalive), None

    def _failed(
        self,
        node: Node,
        key: str,
        error: BaseException,
        why: str,
        start: float,
        placement: Placement | None = None,
    ) -> tuple[NodeResult, BaseException | None]:
        seconds = time.monotonic() - start
        if self.cancelled.is_set():  # stopped because of another node, as locally
            why = "build stopped while it ran; output discarded"
            self.emit(
                "finish", node, status="cancelled", message=why, seconds=seconds, finished=True
            )
            return NodeResult(node.id, key, None, "cancelled", why, seconds), None
        worker = str(placement) if placement is not None else ""
        self.emit(
            "error",
            node,
            status="failed",
            message=why,
            seconds=seconds,
            finished=True,
            worker=worker,
        )
        return NodeResult(node.id, key, None, "failed", why, seconds), error


# -- one call on the cluster ----------------------------------------------------------------


def call_with_resources(
    fn: Callable[..., T], *args: Any, resources: Mapping[str, float], name: str = ""
) -> tuple[T, Placement]:
    """Run the module-level `fn(*args)` as one task that claims `resources` (the `Job.resources`
    vocabulary: {"GPU": 1} makes it one of at most one task per GPU), and return its result and
    where it ran. For work that is measured rather than built (a tuning trial's timing): it is
    never cached, and Ray does not retry it (a measurement on a dying node is not trusted).
    """
    claimed = dict(resources)
    options: dict[str, Any] = {"num_cpus": claimed.pop("CPU", 1.0), "max_retries": 0}
    if "GPU" in claimed:
        options["num_gpus"] = claimed.pop("GPU")
    if claimed:
        options["resources"] = claimed
    if name:
        options["name"] = name
    return ray.get(_call.options(**options).remote(fn, *args))


@ray.remote
def _call(fn: Callable[..., T], *args: Any) -> tuple[T, Placement]:
    placement = Placement(ray.get_runtime_context().get_node_id(), _node_address(), os.getpid())
    return fn(*args), placement


# -- the task --------------------------------------------------------------------------------


def _step_task(
    job: Any, node_id: str, key: str, deps: tuple[str, ...], *dep_tars: bytes
) -> tuple[bytes, dict[str, Any]]:
    """Run one job on a worker: unpack its dependencies' outputs, run the step, pack its output.

    Returns (tar, record); an exception of the step is returned in the record, not raised, so
    that the driver gets the step's own exception type and the worker it ran on.
    """
    entered = time.time()
    context = ray.get_runtime_context()
    placement = Placement(context.get_node_id(), _node_address(), os.getpid())
    logs: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="synapse-task-"))
    try:
        dep_outputs = {}
        for i, (dep, packed) in enumerate(zip(deps, dep_tars, strict=True)):
            dep_outputs[dep] = work / f"dep{i}"
            unpack_folder(packed, dep_outputs[dep])
        out_dir = work / "out"
        out_dir.mkdir()
        ctx = NodeContext(
            node=_TaskNode(node_id, job),  # type: ignore[arg-type]
            out_dir=out_dir,
            dep_outputs=MappingProxyType(dep_outputs),
            cancelled=threading.Event(),  # a cancelled task is killed, not asked to stop
            key=key,
            _log=logs.append,
        )
        start = time.perf_counter()
        try:
            run_job(job, ctx)
        except Exception as exc:
            return b"", {"placement": placement, "logs": logs, "error": _picklable(exc)}
        packed = pack_folder(out_dir)
        seconds = time.perf_counter() - start
        record = {
            "placement": placement,
            "logs": logs,
            "error": None,
            "seconds": seconds,
            "entered": entered,
        }
        return packed, {**record, "digest": bytes_digest(packed)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The task, as Ray runs it: in a worker kept for later tasks, or, for a node whose step sets
# process-wide state (`Node.fresh_process`), in one that exits after it (Ray takes `max_calls`
# only where a remote function is declared, not in `.options()`).
_run_step = ray.remote(num_returns=2)(_step_task)
_run_fresh_step = ray.remote(num_returns=2, max_calls=1)(_step_task)


@dataclass(frozen=True)
class _TaskNode:
    """What a step may read of its node on a worker. A `Node` is not sent: building one hashes
    every input file again, and its fingerprints are the driver's business."""

    id: str
    job: Any

    @property
    def kind(self) -> str:
        return self.job.kind


def _node_address() -> str:
    try:
        return ray.util.get_node_ip_address()
    except Exception:  # an address is only for messages
        return socket.gethostname()


def _picklable(exc: Exception) -> Exception:
    """`exc` if it survives pickling (to reach the driver as itself), else a RuntimeError."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# -- the shared cache ------------------------------------------------------------------------


class SharedCache:
    """A `Cache` folder on the head node, served to every driver of the cluster (a Ray actor).

    Entries move as tars with their sha256; the folder itself keeps the local cache's guarantees
    (entries appear by one rename under the lock, every file hashed in `.entry.json` and
    checked on each read), so a driver killed mid-transfer leaves nothing half-stored.
    """

    def __init__(self, root: str) -> None:
        self.cache = Cache(Path(os.path.expanduser(root)))

    def present(self, keys: list[str]) -> list[str]:
        """The keys that have an intact entry."""
        return [key for key in keys if self.cache.get(key) is not None]

    def fetch(self, key: str) -> tuple[str, bytes] | None:
        """(sha256 of the tar, the tar) of the entry for `key`, or None."""
        path = self.cache.get(key)
        if path is None:
            return None
        packed = pack_folder(path)
        return bytes_digest(packed), packed

    def store(self, key: str, node_id: str, kind: str, digest: str, packed: bytes) -> None:
        """Commit a tar that a task produced, unless the key is already there."""
        if bytes_digest(packed) != digest:
            raise OSError(f"output of '{node_id}' reached the shared cache damaged")
        if self.cache.entry_path(key).is_dir():
            return
        staged = self.cache.staging_dir()
        try:
            unpack_folder(packed, staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        self.cache.put(key, staged, node_id=node_id, kind=kind)

    def where(self) -> tuple[str, str]:
        """(the head's address, the folder)."""
        return _node_address(), str(self.cache.root)


def shared_cache_actor(root: str) -> Any:
    """The cluster's actor for the shared cache folder `root`, created on the head node by the
    first driver that asks; one actor per folder, so drivers naming one folder share it."""
    actor = ray.remote(SharedCache).options(
        name=f"synapse-cache-{bytes_digest(root.encode())[:16]}",
        namespace=_NAMESPACE,
        lifetime="detached",  # outlives the driver that created it: the next build reuses it
        get_if_exists=True,
        num_cpus=0,
        resources={_HEAD_RESOURCE: 0.001},  # the head outlives workers; its disk holds entries
        max_concurrency=8,
    )
    return actor.remote(root)


# -- folders as bytes ------------------------------------------------------------------------


def pack_folder(folder: Path) -> bytes:
    """The regular files under `folder` as an uncompressed tar (sorted, no owners or times), the
    cache's own `.entry.json` left out: the receiver writes its own."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel == ENTRY_FILE:
                continue
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buffer.getvalue()


def unpack_folder(packed: bytes, folder: Path) -> None:
    """Extract a `pack_folder` tar into `folder` (created); only plain files inside it."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:") as tar:
        tar.extractall(folder, filter="data")


def _commit(cache: Cache, key: str, packed: bytes, node: Node) -> Path:
    staged = cache.staging_dir()
    try:
        unpack_folder(packed, staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return cache.put(key, staged, node_id=node.id, kind=node.kind)


__all__ = [
    "DEFAULT_SHARED_CACHE",
    "ClusterExposed",
    "ClusterUnavailable",
    "Placement",
    "RayExecutor",
    "SharedCache",
    "call_with_resources",
    "pack_folder",
    "task_options",
    "unpack_folder",
]
