"""The plain lane of a call (`ResolvedCall._call_plain`): an entrypoint with nothing to do per
call beyond the checks (no index ranges, no memory budget, resident weights) skips the rest of
the call path. It must give the full path's results and keep every check that protects the
user; a busy session or any other case takes the full path."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import myelin
from myelin.errors import DeadlineExceeded, InputError
from myelin.runtime.session import ResolvedCall
from myelin.runtime.tensors import DeviceTensor

X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


@pytest.fixture
def model(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    yield model
    model.close()


@pytest.fixture
def lane_calls(monkeypatch):
    """How many calls went through the plain lane."""
    taken = []
    original = ResolvedCall._call_plain

    def counted(self, *args):
        taken.append(self.name)
        return original(self, *args)

    monkeypatch.setattr(ResolvedCall, "_call_plain", counted)
    return taken


def test_the_plain_lane_gives_the_full_paths_results(model, lane_calls):
    with model.session() as session:
        forward = session.resolve("forward")
        assert forward._plain
        lane = forward(X)
        on_device = forward(X, output="device")
        assert len(lane_calls) == 2
        forward._plain = False  # the full path, for comparison
        full = forward(X)
        assert len(lane_calls) == 2
    np.testing.assert_array_equal(lane, full)
    assert isinstance(on_device, DeviceTensor)
    assert on_device.dtype == np.float32 and tuple(on_device.shape) == (2, 8)
    np.testing.assert_array_equal(np.asarray(on_device.to_host()), full)


def test_device_arrays_from_a_call_take_the_lane_again(model, lane_calls):
    with model.session() as session:
        hidden = session.resolve("hidden")
        h = hidden(X, output="device")
        again = hidden(X, output="device")
        np.testing.assert_array_equal(np.asarray(h.to_host()), np.asarray(again.to_host()))
    assert lane_calls == ["hidden", "hidden"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (X.astype(np.float64), "float64"),
        (X[:, :15].copy(), "15"),
        (X[None], "rank|dimension|dims"),
    ],
)
def test_the_lane_keeps_the_checks(model, lane_calls, bad, message):
    with model.session() as session:
        with pytest.raises(InputError, match=message):
            session.call("forward", bad)
        assert session.call("forward", X).shape == (2, 8)  # still usable
    assert lane_calls == ["forward"]  # the bad call never reached it


def test_a_memory_budget_takes_the_full_path(mlp_mln, lane_calls):
    model = myelin.Instance().load(mlp_mln, memory_budget=64 * 1024)
    try:
        with model.session() as session:
            forward = session.resolve("forward")
            assert not forward._plain
            assert forward(X).shape == (2, 8)
    finally:
        model.close()
    assert lane_calls == []


def test_a_busy_session_waits_its_turn_on_the_full_path(model):
    with model.session() as session:
        forward = session.resolve("forward")
        errors = []

        def call() -> None:
            try:
                forward(X, timeout=0.05)
            except DeadlineExceeded as e:
                errors.append(str(e))

        with session._lock:  # another call holds the session
            thread = threading.Thread(target=call)
            thread.start()
            thread.join()
        assert len(errors) == 1 and "while waiting for the session" in errors[0]
        assert forward(X).shape == (2, 8)
