"""Cancellation and deadlines: cooperative, at dispatch boundaries; a stopped call raises
Cancelled (DeadlineExceeded for a timeout) and the session's next call works and is right."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import myelin
from myelin.errors import Cancelled, DeadlineExceeded, MemoryBudgetExceeded
from tests.myelin.runtime_policies_models import build_chain, chain_reference, when_inside_iree

# Big enough that one call runs for about a second on an idle 2-vCPU VM (2048 rows took 77 ms
# there, too short for the timings below): the tests cancel 50 ms into it.
BIG = np.random.default_rng(0).standard_normal((32768, 256)).astype(np.float32)
SMALL = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.fixture(scope="module")
def sync_mln(tmp_path_factory):
    """Built with `[runtime] cancellable = false`: synchronous entrypoints (no fences)."""
    return build_chain(tmp_path_factory.mktemp("chain-sync"), "\n[runtime]\ncancellable = false\n")


@pytest.fixture(scope="module")
def async_mln(tmp_path_factory):
    """The default build: entrypoints use IREE's async-external (fences) ABI."""
    return build_chain(tmp_path_factory.mktemp("chain-async"))


@pytest.fixture(scope="module")
def big_call_s(async_mln) -> float:
    model = myelin.Instance().load(async_mln)
    with model.session() as s:
        s.call("forward", SMALL)
        start = time.perf_counter()
        s.call("forward", BIG)
        return time.perf_counter() - start


def assert_usable(session) -> None:
    assert rel_err(session.call("forward", SMALL), chain_reference(SMALL)) < 1e-5


def test_the_async_artifact_really_uses_fences(async_mln, sync_mln):
    for path, is_async in ((async_mln, True), (sync_mln, False)):
        model = myelin.Instance().load(path)
        with model.session() as s:
            assert s.resolve("forward")._async is is_async
            assert_usable(s)


def test_cancel_stops_an_async_call_while_the_device_runs(async_mln, big_call_s):
    model = myelin.Instance().load(async_mln)
    session = model.session()
    assert_usable(session)
    when_inside_iree(session, threading.Timer(0.05, session.cancel).start)
    start = time.perf_counter()
    with pytest.raises(
        Cancelled, match=r"cancelled by Session\.cancel\(\) while the device ran it"
    ):
        session.call("forward", BIG)
    waited = time.perf_counter() - start
    print(f"cancelled after {waited * 1e3:.0f} ms of a {big_call_s * 1e3:.0f} ms call")
    assert waited < big_call_s / 2  # it did not wait for the device to finish
    assert_usable(session)  # ordered after the abandoned work, and correct
    assert rel_err(session.call("forward", BIG), chain_reference(BIG)) < 1e-5


def test_timeout_raises_deadline_exceeded_and_the_session_stays_usable(async_mln, big_call_s):
    model = myelin.Instance().load(async_mln)
    session = model.session()
    start = time.perf_counter()
    with pytest.raises(DeadlineExceeded, match=r"timeout of 0\.03 s ran out") as info:
        session.call("forward", BIG, timeout=0.03)
    assert isinstance(info.value, Cancelled)
    assert time.perf_counter() - start < big_call_s / 2
    assert_usable(session)
    assert_usable(session)  # a generous timeout is no obstacle
    y = session.call("forward", SMALL, timeout=30)
    assert rel_err(y, chain_reference(SMALL)) < 1e-5


def test_an_abandoned_call_keeps_its_memory_reserved_until_the_device_is_done(async_mln):
    """The budget admits one big call at a time: after a cancel the next big call waits for
    the abandoned work to finish instead of overrunning the budget."""
    model = myelin.Instance().load(async_mln)
    session = model.session()
    need = model.call_need("forward", [BIG]).total
    model.close()
    model = myelin.Instance().load(async_mln, memory_budget=need + need // 2 + 2**20)
    session = model.session()
    when_inside_iree(session, threading.Timer(0.05, session.cancel).start)
    with pytest.raises(Cancelled):
        session.call("forward", BIG)
    assert model.budget.in_flight == need  # still held by the device work
    assert rel_err(session.call("forward", BIG), chain_reference(BIG)) < 1e-5
    assert model.budget.in_flight == 0
    assert model.budget.peak_in_flight == need


def test_cancel_reaches_a_call_waiting_for_its_session(sync_mln):
    """A synchronous call cannot be interrupted inside IREE, but a call queued behind it on the
    same session stops at once, and the running one raises when it returns."""
    model = myelin.Instance().load(sync_mln)
    session = model.session()
    assert_usable(session)
    outcome: dict[str, object] = {}

    def run(tag: str, x: np.ndarray) -> None:
        start = time.perf_counter()
        try:
            session.call("forward", x)
            outcome[tag] = "returned"
        except Cancelled as e:
            outcome[tag] = e
        outcome[tag + "_s"] = time.perf_counter() - start

    inside = when_inside_iree(session)
    running = threading.Thread(target=run, args=("running", BIG))
    running.start()
    assert inside.wait(timeout=60)
    queued = threading.Thread(target=run, args=("queued", SMALL))
    queued.start()
    time.sleep(0.2)  # the queued call starts waiting; the running one lasts about a second
    session.cancel()
    queued.join()
    running.join()
    assert isinstance(outcome["queued"], Cancelled)
    assert "while waiting for the session" in str(outcome["queued"])
    assert outcome["queued_s"] < outcome["running_s"]
    assert isinstance(outcome["running"], Cancelled)
    assert "a synchronous entrypoint stops once it returns" in str(outcome["running"])
    assert_usable(session)


def test_cancel_only_affects_calls_already_started(sync_mln):
    model = myelin.Instance().load(sync_mln)
    session = model.session()
    session.cancel()
    assert_usable(session)


def test_a_deadline_also_bounds_waiting_for_memory(sync_mln):
    """A call that fits the budget only after others finish waits; its timeout still holds."""
    model = myelin.Instance().load(sync_mln)
    need = model.call_need("forward", [BIG]).total
    model.close()
    model = myelin.Instance().load(sync_mln, memory_budget=need + 2**20)
    busy, waiting = model.session(), model.session()
    inside = when_inside_iree(busy)  # its memory is reserved by then
    thread = threading.Thread(target=busy.call, args=("forward", BIG))
    thread.start()
    assert inside.wait(timeout=60)
    with pytest.raises(DeadlineExceeded, match="while waiting for memory budget"):
        waiting.call("forward", BIG, timeout=0.05)
    thread.join()
    assert_usable(waiting)
    with pytest.raises(MemoryBudgetExceeded):
        waiting.call("forward", np.concatenate([BIG, BIG]))
    assert model.budget.in_flight == 0


def test_bad_timeouts_are_refused(sync_mln):
    model = myelin.Instance().load(sync_mln)
    with model.session() as session, pytest.raises(ValueError, match="timeout must be"):
        session.call("forward", SMALL, timeout=-1)
