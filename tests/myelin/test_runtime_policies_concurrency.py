"""Many threads calling many sessions of one model: every output checked, no global lock held
while a call runs, one session's calls serialized."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import myelin
from tests.models import mlp_reference
from tests.myelin.runtime_policies_models import build_chain, chain_reference

RTOL = 1e-5  # fp32 against numpy


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.fixture(scope="module")
def chain_mln(tmp_path_factory):
    """Synchronous entrypoints (`cancellable = false`): a call then stays inside IREE's invoke
    for its whole run, which is what the lock test below observes."""
    return build_chain(
        tmp_path_factory.mktemp("chain-concurrency"), "\n[runtime]\ncancellable = false\n"
    )


def test_soak_16_threads_200_calls_random_shapes_on_8_sessions(mlp_mln, mlp_weights):
    """16 threads x 200 calls, two threads per session, under a memory budget that admits only
    a few calls at once: every result matches numpy and the budget is never overrun."""
    model = myelin.Instance().load(mlp_mln, memory_budget=64 * 1024)
    sessions = [model.session() for _ in range(8)]
    errors: list[BaseException] = []
    checked = [0] * 16

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        session = sessions[t % len(sessions)]
        forward, hidden = session.resolve("forward"), session.resolve("hidden")
        try:
            for _ in range(200):
                x = rng.standard_normal((int(rng.integers(1, 65)), 16)).astype(np.float32)
                h_ref, y_ref = mlp_reference(mlp_weights, x)
                if rng.random() < 0.5:
                    assert rel_err(forward(x), y_ref) < RTOL
                else:
                    assert rel_err(hidden(x), h_ref) < RTOL
                checked[t] += 1
        except BaseException as e:  # re-raised by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    print(
        f"soak: {sum(checked)} calls checked in {elapsed:.2f} s; budget peak "
        f"{model.budget.peak_in_flight} B of {model.budget.limit - model.budget.parameter_bytes}"
    )
    assert not errors, errors[:3]
    assert sum(checked) == 16 * 200
    assert model.budget.in_flight == 0
    assert 0 < model.budget.peak_in_flight <= model.budget.limit - model.budget.parameter_bytes
    model.close()


class RecordingContext:
    """A VM context that records when each invoke enters and leaves IREE."""

    def __init__(
        self, context, log: list, tag: str, on_enter: threading.Event | None = None
    ) -> None:
        self._context, self._log, self._tag = context, log, tag
        self._on_enter = on_enter

    def invoke(self, function, args, results) -> None:
        entered = time.perf_counter()
        if self._on_enter is not None:
            self._on_enter.set()
        try:
            self._context.invoke(function, args, results)
        finally:
            self._log.append((self._tag, entered, time.perf_counter()))


def test_no_global_lock_while_a_call_runs(chain_mln):
    """While one session is inside IREE with a long call, calls of other sessions of the same
    model (under a memory budget, so admission runs too) enter IREE as well. The device queue
    may still order their work; what matters is that no lock of ours keeps them out."""
    model = myelin.Instance().load(chain_mln, memory_budget="1GiB")
    slow = model.session()
    fast = [model.session() for _ in range(3)]
    log: list[tuple[str, float, float]] = []
    # Wait for the slow call to be inside IREE, not for a fixed time: on a loaded CI machine
    # preparing its 32 MiB input alone took longer than a 50 ms sleep.
    slow_entered = threading.Event()
    slow._context = RecordingContext(slow._context, log, "slow", on_enter=slow_entered)
    for i, s in enumerate(fast):
        s._context = RecordingContext(s._context, log, f"fast{i}")
    big = np.random.default_rng(0).standard_normal((32768, 256)).astype(np.float32)
    small = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)

    def run_slow() -> None:
        slow.call("forward", big)

    def run_fast(session) -> None:
        assert rel_err(session.call("forward", small), chain_reference(small)) < 1e-5

    thread = threading.Thread(target=run_slow)
    thread.start()
    assert slow_entered.wait(timeout=60)
    others = [threading.Thread(target=run_fast, args=(s,)) for s in fast]
    for t in others:
        t.start()
    for t in [*others, thread]:
        t.join()
    ((_, slow_in, slow_out),) = [e for e in log if e[0] == "slow"]
    entered_meanwhile = [tag for tag, t_in, _ in log if tag != "slow" and slow_in < t_in < slow_out]
    print(
        f"{len(entered_meanwhile)} of 3 calls entered IREE during a {slow_out - slow_in:.2f} s "
        "call of another session"
    )
    assert len(entered_meanwhile) == 3
    assert model.budget.in_flight == 0
    model.close()


def test_one_session_serializes_its_calls(chain_mln):
    """Two threads on one session: the calls do not overlap, and both results are right."""
    model = myelin.Instance().load(chain_mln)
    session = model.session()
    x = np.random.default_rng(2).standard_normal((512, 256)).astype(np.float32)
    session.call("forward", x[:1])  # warm
    spans: list[tuple[float, float]] = []
    results: list[np.ndarray] = []

    def run() -> None:
        start = time.perf_counter()
        results.append(session.call("forward", x))
        spans.append((start, time.perf_counter()))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = chain_reference(x)
    assert all(rel_err(r, want) < 1e-5 for r in results)
    (a0, a1), (b0, b1) = sorted(spans, key=lambda s: s[1])
    single = min(a1 - a0, b1 - b0)
    assert b1 - b0 > 1.5 * single, "the second call did not wait for the first"
    model.close()
