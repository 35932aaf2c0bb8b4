"""`plex build --executor ray` on a real 3-node Ray cluster on loopback: a head that runs no tasks
and two workers of one CPU each (distinct custom resources; worker b offers one stand-in GPU),
object stores capped at 100 MB. Real builds of examples/sharded with two variants through IREE.

The cluster is `ray.cluster_utils.Cluster` with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps
every address on 127.0.0.1 (Ray otherwise swaps loopback for the machine's external address);
`test_every_connection_stays_on_loopback` checks that. A SIGALRM deadline bounds the module, and
the fixture always shuts the cluster down.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import pytest

from plex.builder import build
from plex.builder.versions import code_digest
from synapse import Cache, Event, Job, Node, NodeContext, Plan, step
from tests.plex.build_helpers import EXAMPLES, REPO, copy_example

pytestmark = pytest.mark.slow

MODULE_DEADLINE_S = 900  # cluster start (~25 s here), four builds, one restart of a worker
OBJECT_STORE_BYTES = 100_000_000

TWO_VARIANTS = """\
[app]
name = "sharded-two"
packages = ["{package}"]

[devices.generic]
target = "llvm-cpu"
cpu = "generic"

[devices.host]
target = "llvm-cpu"
cpu = "host"

[[variant]]
name = "generic"
devices = ["generic"]

[[variant]]
name = "host"
devices = ["host"]
"""


@dataclass
class LoopbackCluster:
    cluster: object
    workers: dict[str, object]  # "a" / "b" -> ray's node handle

    @property
    def address(self) -> str:
        return self.cluster.address

    def worker_of(self, placement: str) -> str:
        """ "a" or "b" for a placement string `address/node-id-prefix/pidN`."""
        prefix = placement.split("/")[1]
        return next(n for n, w in self.workers.items() if w.node_id.startswith(prefix))


def _on_deadline(signum: int, frame: object) -> None:
    raise TimeoutError(f"the Ray cluster tests ran past {MODULE_DEADLINE_S} s")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LoopbackCluster]:
    environment = pytest.MonkeyPatch()  # restored after the module: later tests see no change
    environment.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on 127.0.0.1
    environment.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers at niceness 15: beside any other work on the machine (a benchmark,
    # another test run) the steps would get a few percent of a core and a 4 s build took 70 s.
    # At 0 they share the CPU as the driver does, and the module's time is its own.
    environment.setenv("RAY_worker_niceness", "0")
    # The GCS declares a node dead after 5 failed health checks, one every 3 s by default: the
    # killed worker's tasks waited 15 s to be retried. A failed check is a refused connection or
    # a 10 s timeout, not the period, so checking each second only notices the death sooner.
    environment.setenv("RAY_health_check_period_ms", "1000")
    # Workers import this module for its test job (a step is found by its module's name, and
    # pytest imports this file by its folder).
    paths = [str(REPO), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    environment.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    import ray
    from ray.cluster_utils import Cluster

    previous = signal.signal(signal.SIGALRM, _on_deadline)
    signal.alarm(MODULE_DEADLINE_S)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,  # the head serves the cluster (and the shared cache), runs no steps
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES,
        },
    )
    try:
        workers = {
            "a": cluster.add_node(
                num_cpus=1, resources={"builder_a": 1}, object_store_memory=OBJECT_STORE_BYTES
            ),
            "b": cluster.add_node(
                num_cpus=1,
                num_gpus=1,  # a stand-in GPU: the resource rules are tested, no GPU code runs
                resources={"builder_b": 1},
                object_store_memory=OBJECT_STORE_BYTES,
            ),
        }
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="synapse", log_to_driver=False)
        yield LoopbackCluster(cluster, workers)
    finally:
        ray.shutdown()
        cluster.shutdown()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        environment.undo()


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sharded-two")
    path = folder / "app.toml"
    path.write_text(TWO_VARIANTS.format(package=(EXAMPLES / "sharded").as_posix()))
    return path


@pytest.fixture(scope="module")
def local_mln(app, tmp_path_factory) -> bytes:
    """The same app built by the local executor: the bytes every cluster build must equal."""
    folder = tmp_path_factory.mktemp("local")
    build(app, folder / "local.mln", cache_dir=folder / "cache", executor="local")
    return (folder / "local.mln").read_bytes()


def _workers_by_node(events: list[Event]) -> dict[str, str]:
    return {e.node_id: e.worker for e in events if e.kind == "finish" and e.status == "built"}


def test_cluster_build_equals_local_build_and_uses_both_workers(
    ray_cluster, app, local_mln, tmp_path, monkeypatch
):
    monkeypatch.setenv("PLEX_CLUSTER_CACHE", str(tmp_path / "shared-1"))
    events: list[Event] = []
    result = build(
        app, tmp_path / "ray.mln", cache_dir=tmp_path / "cache", executor="ray",
        on_event=events.append,
    )  # fmt: skip
    assert (tmp_path / "ray.mln").read_bytes() == local_mln
    where = _workers_by_node(events)
    # every cacheable node ran as a task and says where; compose ran here, in the driver
    assert {n for n, r in result.results.items() if r.status == "built"} == set(where)
    assert where.pop("compose") == ""
    assert all(where.values()), where
    ran_on = {node: ray_cluster.worker_of(w) for node, w in where.items()}
    assert set(ran_on.values()) == {"a", "b"}, ran_on
    compiles = [n for n in ran_on if n.startswith("compile:")]
    assert len(compiles) == 4  # two shards x two variants


def test_every_connection_stays_on_loopback(ray_cluster):
    """Every socket of this test's cluster (its nodes' processes, their workers, this driver)
    listens and talks on 127.0.0.1. Other Ray clusters on the machine are not this test's."""
    ours = _cluster_pids(ray_cluster)
    listening = _listening_ports_of(ours)
    out = subprocess.run(["ss", "-Htnp"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        local, peer = line.split()[3:5]
        if _pids_of(line) & ours or local.rsplit(":", 1)[-1] in listening:
            assert _loopback(local) and _loopback(peer), line


def _loopback(address: str) -> bool:
    return address.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))


def _pids_of(ss_line: str) -> set[int]:
    return {int(pid) for pid in re.findall(r"pid=(\d+)", ss_line)}


def _cluster_pids(cluster: LoopbackCluster) -> set[int]:
    """This process and every process of the cluster's nodes, with all their descendants (the
    raylets' workers and agents)."""
    nodes = [cluster.cluster.head_node, *cluster.cluster.worker_nodes]
    roots = {os.getpid()} | {
        info.process.pid
        for node in nodes
        for infos in node.all_processes.values()
        for info in infos
    }
    children: dict[int, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    pids, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.add(pid)
            todo.extend(children.get(pid, ()))
    return pids


def _listening_ports_of(pids: set[int]) -> set[str]:
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        if _pids_of(line) & pids:
            local = line.split()[3]
            assert _loopback(local), line
            ports.add(local.rsplit(":", 1)[-1])
    assert ports
    return ports


def test_a_second_driver_reuses_the_first_drivers_results(ray_cluster, app, local_mln, tmp_path):
    """Two driver processes, two local caches, one cluster: the second builds only the .mln."""
    for attempt in range(3):
        code_before = code_digest.__wrapped__()
        first, second = _two_drivers(ray_cluster, app, tmp_path / f"attempt{attempt}", local_mln)
        if code_digest.__wrapped__() == code_before:
            break
        # PLeX's sources changed between the drivers (keys cover them): not this test's subject
    assert "9 step(s) ran, 0 cache hit(s)" in first.stderr, first.stderr
    assert " on 127.0.0.1/" in first.stderr  # plain progress names each step's worker
    # the second driver: every cacheable node from the shared cache, only compose ran
    assert "1 step(s) ran, 8 cache hit(s)" in second.stderr, second.stderr
    explained = [line.split() for line in second.stdout.splitlines() if line.strip()]
    assert {words[0]: words[1] for words in explained if words[0] != "compose"} == {
        words[0]: "hit" for words in explained if words[0] != "compose"
    }
    # the shared folder is an ordinary synapse cache on the head node, every entry intact
    shared = Cache(tmp_path / f"attempt{attempt}" / "shared")
    assert len(shared.ls()) == 8
    assert all(shared.get(entry.key) is not None for entry in shared.ls())


def _two_drivers(
    cluster: LoopbackCluster, app: Path, folder: Path, expected: bytes
) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "PLEX_CLUSTER_CACHE": str(folder / "shared")}
    runs = []
    for name in ("first", "second"):
        out = folder / name
        command = [
            sys.executable, "-m", "plex", "build", str(app), "-o", str(out / "app.mln"),
            "--cache", str(out / "cache"), "--executor", f"ray={cluster.address}",
            "--explain", "--progress", "plain",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert (out / "app.mln").read_bytes() == expected
        runs.append(done)
    return runs


@dataclass(frozen=True)
class TimingTrialJob(Job):
    """Stands in for a tuning trial that times a candidate on a GPU: it claims the GPU and no
    CPU, and records when it held it."""

    kind: ClassVar[str] = "trial"
    step_module: ClassVar[str] = __name__
    resources: ClassVar = MappingProxyType({"GPU": 1, "CPU": 0})
    candidate: int


@step(TimingTrialJob)
def run_trial(job: TimingTrialJob, ctx: NodeContext) -> None:
    start = time.time()
    time.sleep(1.0)
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    (ctx.out_dir / "held").write_text(f"{start} {time.time()} {gpus}")


def test_gpu_trials_run_one_per_gpu_at_a_time(ray_cluster, tmp_path):
    from synapse import RayExecutor

    plan = Plan([Node(f"trial:{i}", TimingTrialJob(i)) for i in range(3)])
    executor = RayExecutor(Cache(tmp_path / "cache"), shared_cache=None)
    results = executor.run(plan)
    held = []
    for node_id, result in results.items():
        start, end, gpus = (result.out_dir / "held").read_text().split()
        held.append((float(start), float(end)))
        assert gpus == "0", "Ray hands the trial its GPU"
        assert ray_cluster.worker_of(str(executor.placements[node_id])) == "b"  # the GPU's node
    held.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(held)), held


def test_tune_builds_candidates_as_tasks_and_times_them_on_the_gpu_worker(
    ray_cluster, tmp_path, monkeypatch
):
    """`plex tune --executor ray` on the CPU path: candidate compiles run as cluster tasks, each
    batch's timing is a task claiming the (stand-in) GPU, so it runs on worker b; the results
    land in the one tuning database the driver writes."""
    pytest.importorskip("nevergrad")
    from plex.tune import tune

    monkeypatch.setenv("PLEX_CLUSTER_CACHE", str(tmp_path / "shared"))
    app = copy_example("mlp", tmp_path / "mlp")
    lines: list[str] = []
    result = tune(
        app, "cpu", tmp_path / "tuned", trials=2, batch=2, max_dispatches=1, rounds=2,
        dims=["*=32"], cache_dir=tmp_path / "cache", log=lines.append, executor="ray",
    )  # fmt: skip
    timed = [line.rsplit(" ", 1)[-1] for line in lines if " on worker " in line]
    assert len(timed) >= 2, lines  # the batch and the final comparison
    assert {ray_cluster.worker_of(worker) for worker in timed} == {"b"}
    built = [e for e in Cache(tmp_path / "shared").ls() if e.kind == "tune-candidate"]
    assert len(built) >= 3  # the reference, the batch's candidates, the tuned build: as tasks
    [entry] = json.loads((tmp_path / "tuned" / "tuning.json").read_text())["entries"].values()
    assert sum(t["status"] == "ok" for t in entry["trials"]) >= 1
    assert result.outputs_equal


@dataclass(frozen=True)
class SleepOrFailJob(Job):
    """A step that sleeps `seconds`, then raises if `fail`: a stand-in for a long compile."""

    kind: ClassVar[str] = "sleep"
    step_module: ClassVar[str] = __name__
    seconds: float
    fail: bool = False


@step(SleepOrFailJob)
def run_sleep_or_fail(job: SleepOrFailJob, ctx: NodeContext) -> None:
    time.sleep(job.seconds)
    if job.fail:
        raise ValueError("candidate 3 does not compile")
    (ctx.out_dir / "slept").write_text(str(job.seconds))


def test_a_failed_task_names_its_node_and_worker(ray_cluster, tmp_path):
    from synapse import BuildFailed, RayExecutor

    events: list[Event] = []
    plan = Plan([Node("compile:bad", SleepOrFailJob(0.0, fail=True), heavy=True)])
    executor = RayExecutor(Cache(tmp_path / "cache"), shared_cache=None, on_event=events.append)
    with pytest.raises(BuildFailed) as failed:
        executor.run(plan)
    assert failed.value.node_id == "compile:bad"
    assert isinstance(failed.value.__cause__, ValueError)  # the step's own exception, not Ray's
    (error,) = [e for e in events if e.kind == "error"]
    assert error.message.startswith(
        "ValueError: candidate 3 does not compile (on worker 127.0.0.1/"
    )
    assert ray_cluster.worker_of(error.worker) in ("a", "b")
    assert Cache(tmp_path / "cache").ls() == []


@dataclass(frozen=True)
class PidJob(Job):
    """Writes the pid of the worker process that ran it."""

    kind: ClassVar[str] = "pid"
    step_module: ClassVar[str] = __name__
    tag: str


@step(PidJob)
def run_pid(job: PidJob, ctx: NodeContext) -> None:
    (ctx.out_dir / "pid").write_text(str(os.getpid()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_fresh_process_task_runs_in_a_worker_that_exits_after_it(ray_cluster, tmp_path):
    """A node whose step sets process-wide state (Node.fresh_process: a compile with IREE's
    global tuning library) leaves no worker behind for a later task; others keep theirs."""
    from synapse import RayExecutor

    plan = Plan(
        [
            Node("compile:kept", PidJob("kept"), heavy=True),
            Node("compile:fresh", PidJob("fresh"), heavy=True, fresh_process=True),
        ]
    )
    executor = RayExecutor(Cache(tmp_path / "cache"), shared_cache=None)
    results = executor.run(plan)
    pid = {n: int((results[n].out_dir / "pid").read_text()) for n in results}
    deadline = time.monotonic() + 30
    while _alive(pid["compile:fresh"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid["compile:fresh"])
    assert _alive(pid["compile:kept"])


def test_ctrl_c_cancels_running_tasks_instead_of_waiting(ray_cluster, tmp_path):
    from synapse import RayExecutor

    plan = Plan([Node(f"compile:{i}", SleepOrFailJob(120.0 + i), heavy=True) for i in range(2)])
    events: list[Event] = []
    executor = RayExecutor(Cache(tmp_path / "cache"), shared_cache=None, on_event=events.append)
    # Ctrl-C once both tasks run (their start, not a fixed delay: a loaded machine takes
    # seconds to submit): a real SIGINT, which wakes the main thread's wait as a key press does.
    pressed: list[float] = []

    def press_ctrl_c_when_both_run() -> None:
        deadline = time.monotonic() + 120
        while sum(e.kind == "start" for e in list(events)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c_when_both_run, daemon=True).start()
    # Native libraries loaded by earlier tests of the session (LLVM in the IREE compiler) take
    # over SIGINT at the C level; put Python's own handler back, as the CLI process has it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            executor.run(plan)
    finally:
        signal.signal(signal.SIGINT, previous)
    # About 0.2 s; the bound tells a cancelled 120 s task from an awaited one (docs/cluster.md).
    assert time.monotonic() - pressed[0] < 60, "the 120 s steps were cancelled, not awaited"
    assert [e.status for e in events if e.kind == "done"] == ["interrupted"]
    assert Cache(tmp_path / "cache").ls() == []


def test_a_worker_killed_mid_build_still_gives_the_same_artifact(
    ray_cluster, app, local_mln, tmp_path, monkeypatch
):
    """Worker a is removed right after it finished its first import (its object store holds that
    output, and tasks are running or queued): the lost tasks and objects are rebuilt on b."""
    monkeypatch.setenv("PLEX_CLUSTER_CACHE", str(tmp_path / "shared-3"))
    events: list[Event] = []
    killed = threading.Event()

    def on_event(event: Event) -> None:
        events.append(event)
        if (
            not killed.is_set()
            and event.kind == "finish"
            and event.worker
            and ray_cluster.worker_of(event.worker) == "a"
        ):
            killed.set()
            threading.Thread(target=_remove_worker_a, args=(ray_cluster,)).start()

    build(
        app, tmp_path / "ray.mln", cache_dir=tmp_path / "cache", executor="ray", on_event=on_event
    )
    assert killed.is_set()
    assert (tmp_path / "ray.mln").read_bytes() == local_mln
    kill_index = next(i for i, e in enumerate(events) if e.worker and e.kind == "finish")
    after = _workers_by_node(events[kill_index + 1 :])
    after.pop("compose", None)
    assert "b" in {ray_cluster.worker_of(w) for w in after.values()}, "b took over"
    # a node added back keeps the module's cluster at two workers for any later test
    ray_cluster.workers["a"] = ray_cluster.cluster.add_node(
        num_cpus=1, resources={"builder_a": 1}, object_store_memory=OBJECT_STORE_BYTES
    )


def _remove_worker_a(cluster: LoopbackCluster) -> None:
    cluster.cluster.remove_node(cluster.workers["a"], allow_graceful=False)


def test_task_resources_follow_the_node():
    from synapse._ray import LIGHT_STEP_CPUS, task_options

    @dataclass(frozen=True)
    class Plain(Job):
        kind: ClassVar[str] = "plain"

    heavy = task_options(Node("c", Plain(), heavy=True, memory=2**20))
    assert (heavy["num_cpus"], heavy["memory"]) == (1.0, 2**20)
    assert task_options(Node("w", Plain()))["num_cpus"] == LIGHT_STEP_CPUS
    trial = task_options(Node("t", TimingTrialJob(0)))
    assert (trial["num_cpus"], trial["num_gpus"]) == (0, 1)
    assert "resources" not in trial and trial["retry_exceptions"] is False
