"""API misuse gets a typed error that says what to do, never a bare StopIteration or a silently
ignored argument."""

from __future__ import annotations

import numpy as np
import pytest

import myelin
from myelin.runtime.session import SessionClosed

X = np.ones((2, 16), np.float32)


@pytest.fixture
def model(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    yield model
    model.close()


def test_call_after_session_close_says_the_session_is_closed(model):
    session = model.session()
    session.close()
    with pytest.raises(SessionClosed, match=r"forward: the session is closed .*model\.session\(\)"):
        session.call("forward", X)


def test_resolved_call_after_session_close_says_the_session_is_closed(model):
    session = model.session()
    forward = session.resolve("forward")
    assert forward(X).shape == (2, 8)
    session.close()
    with pytest.raises(SessionClosed, match="forward: the session is closed"):
        forward(X)


def test_call_after_model_close_says_the_session_is_closed(model):
    session = model.session()
    model.close()
    with pytest.raises(SessionClosed, match="forward: the session is closed"):
        session.call("forward", X)


def test_unknown_output_kind_is_refused(model):
    with model.session() as session:
        with pytest.raises(
            ValueError, match="output must be one of 'numpy', 'device', 'dlpack', got 'gpu'"
        ):
            session.call("forward", X, output="gpu")
        assert session.call("forward", X, output="numpy").shape == (2, 8)  # still usable


@pytest.mark.parametrize("timeout", [float("nan"), -1, "5", True])
def test_timeout_that_is_not_seconds_is_refused(model, timeout):
    with (
        model.session() as session,
        pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"),
    ):
        session.call("forward", X, timeout=timeout)


def test_valid_timeouts_still_run(model):
    with model.session() as session:
        for timeout in (0.0 + 60, np.float32(60), 60, float("inf")):
            assert session.call("forward", X, timeout=timeout).shape == (2, 8)
