"""Steps in worker processes (`Node(isolate=True)`): a crash in native code, `sys.exit` or
`os._exit` in a step is one error naming the node, the cache stays consistent, workers are kept
for the run, and a stopping build kills a running worker instead of waiting for it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from synapse import BuildFailed, Cache, Executor, Node, Plan
from synapse.errors import StepCrashed
from tests.synapse.isolation_helpers import WorkJob


def _node(name: str, what: str, isolate: bool = True) -> Node:
    return Node(name, WorkJob(what, tag=name), isolate=isolate)


def _check_cache(cache: Cache) -> list[str]:
    """Node ids of the committed entries, each checked against its .entry.json."""
    return sorted(e.node_id for e in cache.ls() if cache.get(e.key) is not None)


@pytest.mark.parametrize(
    ("what", "how"),
    [
        ("segfault", "died from SIGSEGV (signal 11)"),
        ("os_exit", "died from exit code 5"),
        ("exit", "the step called sys.exit(3)"),
    ],
)
def test_a_crashing_step_is_one_error_naming_the_node(tmp_path: Path, what: str, how: str) -> None:
    cache = Cache(tmp_path / "cache")
    plan = Plan([_node("fine", "ok"), _node("bad", what)])
    with pytest.raises(BuildFailed) as caught:
        Executor(cache, jobs=1).run(plan)
    assert caught.value.node_id == "bad"
    assert isinstance(caught.value.error, StepCrashed)
    assert how in str(caught.value)
    assert "'bad'" in str(caught.value)
    # the node that finished is committed and intact; nothing of the crashed one, no staging
    assert _check_cache(cache) == ["fine"]
    assert list((tmp_path / "cache" / "tmp").glob("*")) == [] or all(
        p.name.startswith("trash") for p in (tmp_path / "cache" / "tmp").iterdir()
    )


def test_a_step_error_keeps_its_type_and_the_worker_is_reused(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    nodes = [_node(f"n{i}", "ok") for i in range(4)]
    results = Executor(cache, jobs=1).run(Plan(nodes))
    pids = {(results[n.id].out_dir / "pid").read_text() for n in nodes}
    assert len(pids) == 1 and pids != {str(os.getpid())}  # one worker for the run, not us
    with pytest.raises(BuildFailed) as caught:
        Executor(cache, jobs=1).run(Plan([_node("r", "raise")]))
    assert type(caught.value.error) is ValueError
    assert str(caught.value.error) == "bad input in r"


def test_a_fresh_process_step_runs_in_a_worker_of_its_own(tmp_path: Path) -> None:
    """A step that sets process-wide state neither takes a used worker nor leaves its own to a
    later step; the others still share theirs."""
    cache = Cache(tmp_path / "cache")
    fresh = Node("f", WorkJob("ok", tag="f"), isolate=True, fresh_process=True)
    nodes = [_node("a", "ok"), fresh, _node("b", "ok"), _node("c", "ok")]
    results = Executor(cache, jobs=1).run(Plan(nodes))
    pid = {n.id: (results[n.id].out_dir / "pid").read_text() for n in nodes}
    assert pid["a"] == pid["b"] == pid["c"] != pid["f"]
    assert str(os.getpid()) not in pid.values()


def test_logs_and_warnings_come_back_from_the_worker(tmp_path: Path) -> None:
    events = []
    plan = Plan([_node("l", "log"), _node("w", "warn")])
    with pytest.warns(UserWarning, match="careful with w"):
        Executor(Cache(tmp_path / "cache"), jobs=1, on_event=events.append).run(plan)
    assert [e.message for e in events if e.kind == "log"] == ["half way through l"]


def test_a_stopping_build_kills_a_running_worker(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    plan = Plan([_node("slow", "sleep"), _node("bad", "raise")])
    start = time.monotonic()
    with pytest.raises(BuildFailed) as caught:
        Executor(cache, jobs=2).run(plan)
    assert time.monotonic() - start < 30  # the 60 s step was killed, not awaited
    assert caught.value.results["slow"].status == "cancelled"
    assert _check_cache(cache) == []


def test_isolate_false_runs_in_this_process(tmp_path: Path) -> None:
    results = Executor(Cache(tmp_path / "cache"), jobs=1, isolate=False).run(
        Plan([_node("here", "ok")])
    )
    assert (results["here"].out_dir / "pid").read_text() == str(os.getpid())
