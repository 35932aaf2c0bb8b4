import gc
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from synapse_helpers import (
    CompileJob,
    ComposeJob,
    ConcatJob,
    FailJob,
    ImportJob,
    InspectJob,
    Recorder,
    WaitForCancelJob,
    diamond_plan,
)

from synapse import BuildFailed, Cache, Executor, Node, Output, Plan, explain


def run(cache, plan, **kw):
    events = []
    results = Executor(cache, salt="iree=test", on_event=events.append, **kw).run(plan)
    return results, events


def statuses(results):
    return {node_id: r.status for node_id, r in results.items()}


def test_first_build_then_all_hits_then_only_the_changed_branch(tmp_path):
    cache = Cache(tmp_path / "cache")
    recorder = Recorder()
    first, _ = run(cache, diamond_plan(recorder=recorder))
    assert set(recorder.runs) == {"resolve", "import", "weights", "compile", "compose"}
    assert (first["compose"].out_dir / "out.txt").read_text() == "(x (c (i (r)) (w (r))))"
    assert explain(first) == [
        "resolve  built: no cache entry (first build)",
        "import   built: no cache entry (first build)",
        "weights  built: no cache entry (first build)",
        "compile  built: no cache entry (first build)",
        "compose  built: not cacheable",
    ]

    recorder = Recorder()
    second, events = run(cache, diamond_plan(recorder=recorder))
    assert recorder.runs == ["compose"]  # the uncached node always runs
    assert statuses(second) == {**dict.fromkeys(first, "hit"), "compose": "built"}
    plan_event = events[0]
    assert (plan_event.kind, plan_event.total, plan_event.hits) == ("plan", 5, 0)
    assert events[-1].kind == "done" and events[-1].hits == 4 and events[-1].done == 5

    recorder = Recorder()
    third, _ = run(cache, diamond_plan({"import": "i2"}, recorder=recorder))
    assert sorted(recorder.runs) == ["compile", "compose", "import"]
    assert (third["compose"].out_dir / "out.txt").read_text() == "(x (c (i2 (r)) (w (r))))"
    assert explain(third) == [
        "resolve  hit",
        "import   rebuilt: input 'source' changed",  # the job field's name
        "weights  hit",
        "compile  rebuilt: dependency 'import' changed",
        "compose  built: not cacheable",
    ]
    # Going back to the first source is a hit again: entries are content-addressed.
    fourth, _ = run(cache, diamond_plan())
    assert statuses(fourth)["compile"] == "hit"


def test_tool_version_salt_rebuilds_everything(tmp_path):
    cache = Cache(tmp_path / "cache")
    Executor(cache, salt="iree=3.13.0").run(diamond_plan())
    results = Executor(cache, salt="iree=3.14.0").run(diamond_plan())
    assert results["resolve"].reason == "tool versions changed (salt)"
    assert results["import"].reason == (
        "dependency 'resolve' changed; tool versions changed (salt)"
    )


def test_preview_runs_nothing_and_says_what_would_run(tmp_path):
    cache = Cache(tmp_path / "cache")
    run(cache, diamond_plan())
    recorder = Recorder()
    preview = Executor(cache, salt="iree=test").preview(diamond_plan({"weights": "w2"}, recorder))
    assert recorder.runs == []
    assert explain(preview) == [
        "resolve  hit",
        "import   hit",
        "weights  will rebuild: input 'source' changed",
        "compile  will rebuild: dependency 'weights' changed",
        "compose  will build: not cacheable",
    ]


def test_corrupt_cached_file_is_discarded_and_rebuilt(tmp_path):
    cache = Cache(tmp_path / "cache")
    first, _ = run(cache, diamond_plan())
    cached_file = first["compile"].out_dir / "out.txt"
    cached_file.write_text(cached_file.read_text().upper())  # same size, other content
    recorder = Recorder()
    second, events = run(cache, diamond_plan(recorder=recorder))
    assert sorted(recorder.runs) == ["compile", "compose"]
    assert second["compile"].reason == "corrupt cache entry discarded"
    assert explain(second)[3] == "compile  rebuilt: corrupt cache entry discarded"
    [discard] = [e for e in events if e.kind == "cache" and e.status == "discarded"]
    assert discard.node_id == "compile"
    assert discard.message == "corrupt cache entry discarded: file 'out.txt' content changed"
    assert (second["compose"].out_dir / "out.txt").read_text() == "(x (c (i (r)) (w (r))))"


def test_failing_step_raises_build_failed_and_caches_nothing_of_it(tmp_path):
    cache = Cache(tmp_path / "cache")
    error = ValueError("no such op: stablehlo.frobnicate")
    plan = Plan(
        [
            Node("import", ImportJob("i")),
            Node("compile", FailJob(error, partial="partial.vmfb", deps=(Output("import"),))),
            Node("compose", ComposeJob("x", (Output("compile"),))),
        ]
    )
    with pytest.raises(BuildFailed) as caught:
        Executor(cache).run(plan)
    failed = caught.value
    assert failed.node_id == "compile" and failed.error is error and failed.__cause__ is error
    assert "build node 'compile' failed: ValueError: no such op" in str(failed)
    assert statuses(failed.results) == {
        "import": "built",
        "compile": "failed",
        "compose": "skipped",
    }
    assert failed.results["compose"].reason == "not run: 'compile' failed"
    assert [e.node_id for e in cache.ls()] == ["import"]
    assert list((cache.root / "tmp").iterdir()) == []


def test_failure_cancels_running_siblings_and_discards_their_output(tmp_path):
    cache = Cache(tmp_path / "cache")
    sibling_saw_cancel, started = threading.Event(), threading.Event()
    plan = Plan(
        [
            Node("slow", WaitForCancelJob(started=started, saw_cancel=sibling_saw_cancel)),
            Node("fail", FailJob(RuntimeError("boom"), wait_for=started)),
        ]
    )
    with pytest.raises(BuildFailed) as caught:
        Executor(cache, jobs=2).run(plan)
    assert sibling_saw_cancel.is_set()
    assert statuses(caught.value.results) == {"slow": "cancelled", "fail": "failed"}
    assert cache.ls() == [] and list((cache.root / "tmp").iterdir()) == []


def test_keyboard_interrupt_in_a_step_cleans_up_and_is_reraised(tmp_path):
    cache = Cache(tmp_path / "cache")
    sibling_saw_cancel, sibling_started = threading.Event(), threading.Event()
    plan = Plan(
        [
            Node("ok", ImportJob("ok")),
            Node("slow", WaitForCancelJob(started=sibling_started, saw_cancel=sibling_saw_cancel)),
            Node(
                "interrupted",
                FailJob(
                    KeyboardInterrupt(),
                    partial="partial",
                    deps=(Output("ok"),),
                    wait_for=sibling_started,
                ),
            ),
            Node("after", ComposeJob("a", (Output("interrupted"),))),
        ]
    )
    events = []
    with pytest.raises(KeyboardInterrupt):
        Executor(cache, jobs=3, on_event=events.append).run(plan)
    assert sibling_saw_cancel.is_set()
    assert [e.node_id for e in cache.ls()] == ["ok"]
    assert list((cache.root / "tmp").iterdir()) == []
    assert events[-1].kind == "done" and events[-1].status == "interrupted"
    assert "after" not in {e.node_id for e in events if e.kind == "start"}


@pytest.mark.parametrize("jobs", [1, 2])
def test_independent_nodes_overlap_only_when_jobs_allow(tmp_path, jobs):
    recorder = Recorder()
    plan = Plan(
        [
            Node("compile:a", CompileJob("a", recorder=recorder, sleep_s=0.3)),
            Node("compile:b", CompileJob("b", recorder=recorder, sleep_s=0.3)),
        ]
    )
    Executor(Cache(tmp_path / "cache"), jobs=jobs).run(plan)
    (a_start, a_end), (b_start, b_end) = recorder.spans["compile:a"], recorder.spans["compile:b"]
    overlap = a_start < b_end and b_start < a_end
    assert overlap is (jobs == 2)
    assert recorder.max_active == jobs


def test_jobs_bounds_concurrency(tmp_path):
    recorder = Recorder()
    plan = Plan(
        [Node(f"n{i}", CompileJob(str(i), recorder=recorder, sleep_s=0.1)) for i in range(6)]
    )
    Executor(None, jobs=3, workdir=tmp_path).run(plan)
    assert recorder.max_active == 3


def test_without_cache_outputs_live_as_long_as_the_results(tmp_path):
    results = Executor(None, workdir=tmp_path).run(diamond_plan())
    assert all(r.status == "built" for r in results.values())
    assert explain(results)[0] == "resolve  built: no cache configured"
    compose_out = results["compose"].out_dir
    assert compose_out.is_relative_to(tmp_path)
    assert (compose_out / "out.txt").read_text() == "(x (c (i (r)) (w (r))))"
    one = results["compose"]
    del results
    gc.collect()
    assert compose_out.exists()  # a NodeResult still refers to the run's scratch folder
    del one
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_steps_can_log_and_see_their_dependencies(tmp_path):
    plan = Plan([Node("a", ConcatJob("a")), Node("b", InspectJob(Output("a")))])
    started = time.time()
    results, events = run(Cache(tmp_path / "c"), plan)
    [log] = [e for e in events if e.kind == "log"]
    assert (log.node_id, log.message) == ("b", "deps: ['a']")
    assert log.key == results["b"].key and log.time >= started


def test_ctrl_c_while_waiting_cancels_running_steps(tmp_path):
    """A real SIGINT reaches the main thread, which is waiting on the pool."""
    cache = Cache(tmp_path / "cache")
    saw_cancel = threading.Event()
    plan = Plan([Node("compile", WaitForCancelJob(saw_cancel=saw_cancel, sigint_after_s=0.1))])
    # Native libraries loaded by earlier tests (LLVM in the IREE compiler) may have taken over
    # SIGINT at the C level; put Python's own handler back for this test, as the CLI process has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Executor(cache, jobs=1).run(plan)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert saw_cancel.is_set()
    assert cache.ls() == [] and list((cache.root / "tmp").iterdir()) == []


def test_a_run_removes_temporary_folders_of_dead_processes_only(tmp_path):
    """Leftovers of a build killed outright (staging in the cache, scratch in the workdir) go
    at the next run; a live process's folders stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())
    cache, workdir = Cache(tmp_path / "cache"), tmp_path / "work"
    folders = {
        "dead staging": tmp_path / "cache" / "tmp" / f"{host}-{dead.pid}-abc",
        "live staging": tmp_path / "cache" / "tmp" / f"{host}-{os.getppid()}-abc",
        "dead scratch": workdir / f"synapse-run-{host}-{dead.pid}-abc",
        "live scratch": workdir / f"synapse-run-{host}-{os.getppid()}-abc",
    }
    for folder in folders.values():
        (folder / "half-written").mkdir(parents=True)
    run(cache, diamond_plan(), workdir=workdir)
    assert {what: path.exists() for what, path in folders.items()} == {
        "dead staging": False,
        "live staging": True,
        "dead scratch": False,
        "live scratch": True,
    }
