"""The MyeLiN runtime on real compiled models: numerics, input validation, variants."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import myelin
from tests.models import mlp_reference, shlo_reference

RTOL = 1e-5  # fp32 against numpy: same math, different summation order


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.fixture(scope="module")
def mlp_model(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    yield model
    model.close()


@pytest.mark.parametrize("batch", [1, 3, 17, 64])
def test_two_dynamic_batch_entrypoints_match_numpy(mlp_model, mlp_weights, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    hidden, out = mlp_reference(mlp_weights, x)
    with mlp_model.session() as s:
        y = s.call("forward", x)
        h = s.resolve("hidden")(x)
    assert y.shape == (batch, 8) and h.shape == (batch, 32)
    assert rel_err(y, out) < RTOL
    assert rel_err(h, hidden) < RTOL


def test_inline_stablehlo_constants_become_parameters(shlo_mln):
    model = myelin.Instance().load(shlo_mln)
    params = {(p["scope"], p["key"]): p for p in model.manifest["parameters"]}
    # W (2 KiB) becomes a parameter; b (64 B) is below the 256 B threshold and stays inline.
    assert [p["shape"] for p in params.values()] == [[32, 16]]
    assert all(scope == "shlo.shlo" for scope, _ in params)
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    with model.session() as s:
        assert rel_err(s.call("forward", x), shlo_reference(x)) < RTOL
        k = np.array(2.5, dtype=np.float32)
        x2 = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_allclose(s.call("scale", x2, k), x2 * 2.5, rtol=1e-6)


def test_weights_live_in_parameters_not_in_the_module(shlo_mln):
    from myelin.mln import MlnReader

    with MlnReader(shlo_mln) as r:
        module = next(s for s in r.sections.values() if s.kind == "module")
        (param,) = [s for s in r.sections.values() if s.kind == "parameter"]
        weights = bytes(r.section_view(param.name))
        module_bytes = bytes(r.section_view(module.name))
    assert len(weights) == 32 * 16 * 4
    assert weights[:64] not in module_bytes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros((2, 16), np.float64),), "argument 'x' has dtype float64, expected float32"),
        ((np.zeros((2, 15), np.float32),), "argument 'x' has size 15 in dimension 1, expected 16"),
        ((np.zeros((16,), np.float32),), "argument 'x' has rank 1"),
        ((), "missing argument(s) 'x'"),
        ((np.zeros((2, 16), np.float32), np.zeros(3)), "extra argument"),
        (("text",), "argument 'x' has type str"),
    ],
)
def test_bad_inputs_are_one_clear_error_naming_the_argument(mlp_model, args, message):
    with mlp_model.session() as s, pytest.raises(myelin.InputError) as info:
        s.call("forward", *args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_entrypoint_suggests_the_close_one(mlp_model):
    with mlp_model.session() as s, pytest.raises(myelin.EntrypointNotFound, match="forward"):
        s.call("forwrd", np.zeros((1, 16), np.float32))


class DLPackOnly:
    """A tensor that only speaks DLPack (as torch/jax CPU tensors do)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_inputs_and_device_outputs_chain(mlp_model, mlp_weights):
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    hidden, _ = mlp_reference(mlp_weights, x)
    with mlp_model.session() as s:
        h = s.call("hidden", DLPackOnly(x))
        assert rel_err(h, hidden) < RTOL
        on_device = s.call("forward", x, output="device")
        assert not isinstance(on_device, np.ndarray)
        assert rel_err(np.asarray(on_device.to_host()), mlp_reference(mlp_weights, x)[1]) < RTOL


def test_device_arrays_take_the_fast_check_and_wrong_ones_the_worded_error(
    mlp_model, mlp_weights, monkeypatch
):
    """A device result passed back in skips the full input check (it reads the buffer view's
    element type and shape instead: what a 14-input GPU call paid 0.2-0.4 ms for); a device
    array of the wrong dtype or shape still gets the full check's error."""
    import iree.runtime as rt

    from myelin.runtime import session as session_module

    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    with mlp_model.session() as s:
        call = s.resolve("forward")
        device = call._device
        h = s.call("hidden", x, output="device")  # (3, 32), on the entrypoint's device
        calls = []
        monkeypatch.setattr(session_module, "check_inputs", lambda *a: calls.append(a) or None)
        dx = rt.asdevicearray(device, x)
        assert call._fast_arguments((dx,)) == [dx._buffer_view]  # packed as its buffer view
        y = call(dx)
        assert rel_err(y, mlp_reference(mlp_weights, x)[1]) < RTOL
        assert calls == []  # the fast check took it
        monkeypatch.undo()
        assert call._fast_arguments((h,)) is None  # wrong width: 32 where forward takes 16
        with pytest.raises(myelin.InputError, match="size 32 in dimension 1, expected 16"):
            call(h)
        wrong = rt.asdevicearray(device, x.astype(np.float16))
        with pytest.raises(myelin.InputError, match="dtype float16, expected float32"):
            call(wrong)


def test_a_checked_device_array_is_remembered_weakly_and_only_itself(mlp_model, mlp_weights):
    """The fast check remembers a device array that passed (a serving loop passes the same
    weights every call), without keeping it or its buffer alive, and never for another array
    at that input."""
    import gc

    import iree.runtime as rt

    x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
    with mlp_model.session() as s:
        call = s.resolve("forward")
        dx = rt.asdevicearray(call._device, x)
        for _ in range(2):  # checked, then remembered: the same answer
            assert rel_err(call(dx), mlp_reference(mlp_weights, x)[1]) < RTOL
        assert [ref() for ref, _ in call._passed.values()] == [dx]
        held = [v for entry in call._passed.values() for v in entry]
        assert not [v for v in held if isinstance(v, (rt.HalBufferView, rt.HalBuffer))]
        h = s.call("hidden", x, output="device")  # another array, wrong width
        with pytest.raises(myelin.InputError, match="size 32 in dimension 1, expected 16"):
            call(h)
        del dx
        gc.collect()
        assert [ref() for ref, _ in call._passed.values()] == [None]  # not kept alive


def test_sessions_run_concurrently_from_threads(mlp_model, mlp_weights):
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            with mlp_model.session() as s:
                call = s.resolve("forward")
                for _ in range(20):
                    x = rng.standard_normal((int(rng.integers(1, 9)), 16)).astype(np.float32)
                    assert rel_err(call(x), mlp_reference(mlp_weights, x)[1]) < RTOL
        except BaseException as e:  # collected and re-raised by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_closed_session_refuses_calls(mlp_model):
    s = mlp_model.session()
    call = s.resolve("forward")
    s.close()
    with pytest.raises(myelin.MyelinError, match="closed"):
        call(np.zeros((1, 16), np.float32))


def test_device_result_alive_at_exit_does_not_crash(mlp_mln):
    """A device array still held when Python exits, after its model and instance are gone."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import numpy as np, myelin
        inst = myelin.Instance()
        model = inst.load({str(mlp_mln)!r})
        session = model.session()
        kept = session.call("forward", np.ones((2, 16), np.float32), output="device")
        session.close(); model.close(); del inst, model, session
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 0
