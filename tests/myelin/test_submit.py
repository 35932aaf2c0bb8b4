"""Submitted calls (`ResolvedCall.submit`, myelin.runtime.pending) on the CPU (`local-task`):
a stream of submissions gives every call's own results, in order with plain calls, bounded in
flight, checked like a call, and a closing session waits for them. Results against numpy's
float32 MLP (tolerance 1e-5) and bit-equal to the same call made synchronously."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import myelin
from myelin.errors import InputError
from myelin.runtime.pending import MAX_IN_FLIGHT, PendingCall
from myelin.runtime.session import SessionClosed
from myelin.runtime.tensors import DeviceTensor

RNG = np.random.default_rng(7)
INPUTS = [RNG.standard_normal((n, 16)).astype(np.float32) for n in (1, 3, 8, 2, 5)]


@pytest.fixture
def model(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    yield model
    model.close()


def reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    hidden = np.maximum(x @ w["w1"] + w["b1"], 0)
    return hidden @ w["w2"] + w["b2"]


def test_a_stream_of_submissions_gives_each_calls_results(model, mlp_weights):
    with model.session() as session:
        forward = session.resolve("forward")
        assert forward._async and forward._plain  # what submits without waiting
        pending = [forward.submit(x) for x in INPUTS * 4]
        assert all(isinstance(p, PendingCall) for p in pending)
        for p, x in zip(pending, INPUTS * 4, strict=True):
            y = p.result()
            assert isinstance(y, DeviceTensor)
            np.testing.assert_allclose(
                np.asarray(y.to_host()), reference(x, mlp_weights), rtol=1e-5, atol=1e-5
            )
            np.testing.assert_array_equal(np.asarray(y.to_host()), forward(x))
            assert p.done() and p.result() is y  # read once, kept


def test_a_result_ahead_and_a_read_give_the_calls_results(model, mlp_weights):
    """`ahead` hands a result out before it is written (as the next call's input) and `read`
    starts its copy to the host: once the call is done both hold the call's results."""
    with model.session() as session:
        forward = session.resolve("forward")
        pending = forward.submit(INPUTS[2])
        ahead, read = pending.ahead(0), pending.read(0)
        assert isinstance(ahead, DeviceTensor)
        pending.result()
        expected = forward(INPUTS[2])
        np.testing.assert_array_equal(read.result(), expected)
        np.testing.assert_array_equal(np.asarray(ahead.to_host()), expected)
        np.testing.assert_allclose(
            expected, reference(INPUTS[2], mlp_weights), rtol=1e-5, atol=1e-5
        )


def test_numpy_results_and_plain_calls_in_between(model, mlp_weights):
    with model.session() as session:
        first = session.submit("forward", INPUTS[0], output="numpy")
        plain = session.call("hidden", INPUTS[1])
        second = session.submit("hidden", INPUTS[2], output="numpy")
        np.testing.assert_allclose(
            first.result(timeout=60), reference(INPUTS[0], mlp_weights), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_array_equal(second.result(), session.call("hidden", INPUTS[2]))
        assert plain.shape == (3, 32)


def test_submissions_in_flight_are_bounded(model, mlp_weights):
    x = INPUTS[2]
    want = reference(x, mlp_weights)
    with model.session() as session:
        forward = session.resolve("forward")
        pending = []
        for _ in range(MAX_IN_FLIGHT * 2 + 5):
            pending.append(forward.submit(x))
            assert len(session._in_flight) <= MAX_IN_FLIGHT
        for p in pending:
            np.testing.assert_allclose(np.asarray(p.result().to_host()), want, atol=1e-5)


def test_a_submission_is_checked_like_a_call(model):
    with model.session() as session:
        with pytest.raises(InputError, match="16"):
            session.submit("forward", np.zeros((2, 15), np.float32))
        with pytest.raises(ValueError, match="'device' or 'numpy'"):
            session.submit("forward", INPUTS[0], output="dlpack")
        assert tuple(session.submit("forward", INPUTS[0]).result().shape) == (1, 8)  # usable


def test_an_entrypoint_off_the_plain_lane_runs_at_once(model, mlp_weights):
    """A model with a memory budget or non-resident weights holds memory only while a call
    runs: its submission runs to completion and is done when it returns."""
    with model.session() as session:
        forward = session.resolve("forward")
        forward._plain = False  # as a budgeted model's entrypoint is
        p = forward.submit(INPUTS[3], output="numpy")
        assert p.done() and len(session._in_flight) == 0
        np.testing.assert_allclose(p.result(), reference(INPUTS[3], mlp_weights), atol=1e-5)


def test_closing_waits_for_submissions_and_keeps_their_results(model, mlp_weights):
    session = model.session()
    pending = [session.submit("forward", x) for x in INPUTS]
    session.close()
    assert len(session._in_flight) == 0
    for p, x in zip(pending, INPUTS, strict=True):
        assert p.done()
        np.testing.assert_allclose(
            np.asarray(p.result().to_host()), reference(x, mlp_weights), atol=1e-5
        )
    with pytest.raises(SessionClosed, match="closed"):
        session.submit("forward", INPUTS[0])


def test_two_threads_reading_one_result_get_the_same_object(model):
    with model.session() as session:
        for _ in range(20):
            p = session.submit("forward", INPUTS[2])
            got = []
            readers = [
                threading.Thread(target=lambda p=p, got=got: got.append(p.result()))
                for _ in range(3)
            ]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            assert len(got) == 3 and got[0] is got[1] is got[2]
