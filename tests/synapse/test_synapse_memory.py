"""The memory budget: nodes that declare temporary memory run in batches that fit it."""

import threading

import pytest
from synapse_helpers import ConcatJob, MemoryMeter, MeteredJob

from synapse import Executor, Node, Plan, PlanError

MiB = 2**20


def weights_plan(
    meter: MemoryMeter,
    sizes_mib: list[int],
    *,
    extra_free: int = 0,
    barrier: threading.Barrier | None = None,
) -> Plan:
    nodes = [
        Node(f"weights:{i}", MeteredJob(meter, barrier=barrier), memory=size * MiB)
        for i, size in enumerate(sizes_mib)
    ]
    nodes += [Node(f"compile:{i}", MeteredJob(meter)) for i in range(extra_free)]
    return Plan(nodes)


def test_memory_nodes_run_in_batches_under_the_budget(tmp_path):
    meter = MemoryMeter()
    plan = weights_plan(meter, [30, 30, 30, 30, 20])
    Executor(None, jobs=8, workdir=tmp_path, memory_budget=64 * MiB).run(plan)
    assert meter.peak <= 64 * MiB
    assert meter.max_running == 2  # 30 + 30 fit, a third 30 does not; 30 + 20 would too


def test_without_a_budget_memory_is_only_bounded_by_jobs(tmp_path):
    meter = MemoryMeter()
    plan = weights_plan(meter, [30, 30, 30, 30], barrier=threading.Barrier(4))
    Executor(None, jobs=8, workdir=tmp_path).run(plan)
    assert meter.peak == 120 * MiB  # the test above could fail: all four overlap here


def test_a_node_larger_than_the_budget_runs_alone_and_others_still_run(tmp_path):
    meter = MemoryMeter()
    plan = weights_plan(meter, [100, 10, 10], extra_free=2)
    results = Executor(None, jobs=8, workdir=tmp_path, memory_budget=64 * MiB).run(plan)
    assert all(r.status == "built" for r in results.values())
    assert meter.peak == 100 * MiB  # the big one never shares the budget with the small ones


def test_memory_is_a_hint_not_part_of_the_key():
    plain = Node("w", ConcatJob("w"))
    hinted = Node("w", ConcatJob("w"), memory=5 * MiB)
    executor = Executor(None)
    assert executor.keys(Plan([plain])) == executor.keys(Plan([hinted]))
    assert "mem=5.0MiB" in Plan([hinted]).describe()


def test_negative_memory_is_rejected():
    with pytest.raises(PlanError, match="memory must be a byte count"):
        Node("w", ConcatJob("w"), memory=-1)
