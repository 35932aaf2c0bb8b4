"""One route per call (docs/runtime.md, "How a call runs"): every output kind and `out=` go
through the same steps, with or without the guard (memory budget, residency), and every wait
(the session's lock, a submission's turn, `PendingCall.result`) checks one kind of Deadline.
Results against numpy's float32 MLP at 1e-5."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import myelin
from myelin.errors import Cancelled

X = np.random.default_rng(11).standard_normal((3, 16)).astype(np.float32)


def reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    hidden = np.maximum(x @ w["w1"] + w["b1"], 0)
    return hidden @ w["w2"] + w["b2"]


@pytest.mark.parametrize("budget", [None, "1MiB"], ids=["plain", "guarded"])
def test_each_sink_gives_the_same_results_with_and_without_the_guard(mlp_mln, mlp_weights, budget):
    model = myelin.Instance().load(mlp_mln, memory_budget=budget)
    try:
        with model.session() as session:
            forward = session.resolve("forward")
            assert forward._plain is (budget is None)
            want = reference(X, mlp_weights)
            np.testing.assert_allclose(forward(X), want, rtol=1e-5, atol=1e-5)
            for output in ("device", "dlpack"):
                y = forward(X, output=output)
                np.testing.assert_allclose(np.asarray(y.to_host()), want, rtol=1e-5, atol=1e-5)
            if budget is not None:
                assert model.budget.in_flight == 0  # each call gave its reservation back
    finally:
        model.close()


def test_a_submission_waiting_for_a_busy_session_stops_on_cancel(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    try:
        with model.session() as session:
            forward = session.resolve("forward")
            assert forward._async and forward._plain  # submits without waiting
            errors: list[str] = []
            waiting = threading.Event()

            def submit() -> None:
                waiting.set()
                try:
                    forward.submit(X)
                except Cancelled as e:
                    errors.append(str(e))

            with session._lock:  # another call holds the session
                thread = threading.Thread(target=submit)
                thread.start()
                waiting.wait()
                while thread.is_alive() and not errors:
                    session.cancel()
                    thread.join(0.05)
            thread.join()
            assert len(errors) == 1 and "while waiting for the session" in errors[0]
            assert tuple(forward.submit(X).result().shape) == (3, 8)  # still usable
    finally:
        model.close()


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1"])
def test_a_result_timeout_is_checked_as_a_calls_is(mlp_mln, timeout):
    model = myelin.Instance().load(mlp_mln)
    try:
        with model.session() as session:
            pending = session.submit("forward", X)
            with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
                pending.result(timeout=timeout)
            with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
                session.call("forward", X, timeout=timeout)
            assert tuple(pending.result(timeout=60).shape) == (3, 8)
    finally:
        model.close()
