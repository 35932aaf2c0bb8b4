"""Device results in memory MyeLiN allocates (storage twins `f$into`), on the CPU (a device with
`result_storage = true`; CUDA devices have it by default): the build's twins, the result-shape
rule, zero-copy export to torch and the lifetimes. The same path on a
GPU (cuMemAlloc memory, torch CUDA tensors) is tests/gpu/test_cuda_dlpack_results.py."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import myelin
from myelin.runtime.result_storage import KDL_CPU, Storage, dlpack_capsule, live_capsules
from myelin.signature import STORAGE_TWIN_SUFFIX
from plex.builder import build

GRAPH = """
func.func @neg(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %y = arith.negf %x : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
func.func @rows(%x: tensor<?x4xf32>, %w: tensor<4xf32>) -> (tensor<?x4xf32>, tensor<4xf32>) {
  %c0 = arith.constant 0 : index
  %d = tensor.dim %x, %c0 : tensor<?x4xf32>
  %e = tensor.empty(%d) : tensor<?x4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %w : tensor<?x4xf32>, tensor<4xf32>) outs(%e : tensor<?x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<?x4xf32>
  %w2 = arith.addf %w, %w : tensor<4xf32>
  return %y, %w2 : tensor<?x4xf32>, tensor<4xf32>
}
func.func @chain(%x: tensor<?x16xf32>, %w: tensor<16x16xf32>) -> tensor<?x16xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %d = tensor.dim %x, %c0 : tensor<?x16xf32>
  %e = tensor.empty(%d) : tensor<?x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x16xf32>) -> tensor<?x16xf32>
  %h = linalg.matmul ins(%x, %w : tensor<?x16xf32>, tensor<16x16xf32>)
      outs(%f : tensor<?x16xf32>) -> tensor<?x16xf32>
  %y = linalg.matmul ins(%h, %w : tensor<?x16xf32>, tensor<16x16xf32>)
      outs(%f : tensor<?x16xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}
func.func @same(%x: tensor<8xf32>) -> tensor<8xf32> {
  return %x : tensor<8xf32>
}
func.func @scale_into(%x: tensor<4xf32>, %out: tensor<4xf32> {iree.abi.output = 0 : index})
    -> tensor<4xf32> {
  %two = arith.constant dense<2.0> : tensor<4xf32>
  %y = arith.mulf %x, %two : tensor<4xf32>
  return %y : tensor<4xf32>
}
func.func @count(%x: tensor<4xf32>) -> i32 {
  %n = arith.constant 4 : i32
  return %n : i32
}
"""


def _write_package(root, *, result_storage: bool) -> None:
    """The graph as a one-device CPU app in `root`, with or without storage twins."""
    (root / "g.mlir").write_text(GRAPH)
    (root / "plex.toml").write_text('[package]\nname = "s"\n\n[graph.g]\nsource = "g.mlir"\n')
    storage = "result_storage = true\n" if result_storage else ""
    (root / "app.toml").write_text(
        '[app]\nname = "s"\npackages = ["."]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
        f'cpu = "generic"\n{storage}'
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    _write_package(root, result_storage=True)
    loaded = myelin.Instance().load(build(root / "app.toml", root / "s.mln").output)
    yield loaded
    loaded.close()


def _function(session, name):
    return next(m for m in session._modules if getattr(m, "name", None) == "g").lookup_function(
        name
    )


def test_a_cpu_device_gets_no_twins_unless_it_asks(tmp_path):
    _write_package(tmp_path, result_storage=False)
    plain = myelin.Instance().load(build(tmp_path / "app.toml", tmp_path / "s.mln").output)
    with plain.session() as s:
        assert _function(s, "neg" + STORAGE_TWIN_SUFFIX) is None
        y = s.call("neg", np.ones((4, 8), np.float32), output="dlpack")
        assert y.storage_pointer is None  # IREE's host memory, which exports as it is
    plain.close()


def test_the_build_adds_a_twin_that_takes_storage_for_each_result(model):
    with model.session() as s:
        twin = _function(s, "rows" + STORAGE_TWIN_SUFFIX)
        declaration = twin.reflection["iree.abi.declaration"]
    assert "%input2: !hal.buffer_view {myelin.result = 0 : index}" in declaration
    assert "%input3: !hal.buffer_view {myelin.result = 1 : index}" in declaration
    assert "%input4: !hal.buffer {myelin.transients" in declaration  # the call's transients


def _vm_function(model, tmp_path, name: str) -> str:
    """The VM code of function `name` in the model's module, as iree-dump-module prints it."""
    from pathlib import Path

    import iree._runtime_libs as libs

    (record,) = model.variant_record.modules
    path = tmp_path / "g.vmfb"
    path.write_bytes(bytes(model._reader.section_view(record.section)))
    dump = Path(libs.__file__).parent / "iree-dump-module"
    text = subprocess.run([dump, path], capture_output=True, text=True, check=True).stdout
    body = text.split(f"vm.func @{name}(", 1)[1]
    return body.split("\nvm.export", 1)[0]


def test_a_twin_call_allocates_nothing_on_the_device_queue(model, tmp_path):
    """The twin takes its results' memory and its transients from the caller: no
    queue.alloca (which waits on the host for the call's wait fence) and no queue.dealloca
    (which waits on the host for the call's work), where the entrypoint itself has both."""
    plain = _vm_function(model, tmp_path, "chain")
    assert "hal.device.queue.alloca" in plain and "hal.device.queue.dealloca" in plain
    twin = _vm_function(model, tmp_path, "chain" + STORAGE_TWIN_SUFFIX)
    assert "hal.device.queue.execute" in twin
    assert "hal.device.queue.alloca" not in twin and "hal.device.queue.dealloca" not in twin


def test_out_on_an_entrypoint_without_storage_arguments_goes_through_its_twin(model):
    """The caller's device memory takes the result, the session's buffer the transients: a
    serving loop that passes the same storage every call allocates nothing per call."""
    import iree.runtime as rt

    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    with model.session() as s:
        storage = rt.asdevicearray(s._device, np.zeros((5, 16), np.float32))
        for _ in range(2):
            y = s.call("chain", x, w, out=storage)
            assert y is storage
            np.testing.assert_allclose(storage.to_host(), x @ w @ w, rtol=1e-5, atol=1e-5)
        wrong = rt.asdevicearray(s._device, np.zeros((5, 8), np.float32))
        with pytest.raises(myelin.InputError, match=r"out= for result .* is \[5, 8\]"):
            s.call("chain", x, w, out=wrong)
        with pytest.raises(myelin.InputError, match="must be a device array"):
            s.call("chain", x, w, out=np.zeros((5, 16), np.float32))
        with pytest.raises(myelin.InputError, match="out= has 2 tensor"):
            s.call("chain", x, w, out=(storage, storage))


def test_a_spinning_session_returns_the_same_results(model):
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with model.session(spin_us=300) as s:
        for _ in range(3):
            np.testing.assert_array_equal(s.call("neg", x, output="dlpack").to_host(), -x)
        assert s.resolve("neg")._wait.expected_s is not None  # async: the policy waited
    with pytest.raises(ValueError, match=r"spin_us must be microseconds in \[0, 1000000\]"):
        model.session(spin_us=-5)


def test_transient_memory_is_sized_per_input_shape_kept_and_grown(model):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    with model.session() as s:
        call = s.resolve("chain")
        memory = call._transients
        assert memory is not None and memory.nbytes == 0
        small = None
        for m in (3, 3, 3, 40, 40, 3):
            x = rng.standard_normal((m, 16)).astype(np.float32)
            y = s.call("chain", x, w, output="dlpack")
            np.testing.assert_allclose(np.asarray(y.to_host()), x @ w @ w, rtol=1e-5, atol=1e-5)
            if small is None and memory.nbytes:
                small = memory.buffer(0)  # taken by the first call that ran the twin
        assert y.storage_pointer is not None  # the twin ran (the shape was learned)
        assert 0 < small.byte_length() < memory.nbytes
        assert memory.nbytes >= 40 * 16 * 4  # grown for the larger shape: its intermediate
        assert memory.buffer(0) is not small  # the larger buffer replaced the first
        assert memory.buffer(1) is memory.buffer(memory.nbytes)  # and stays, call after call


def test_the_held_transient_buffer_counts_against_the_memory_budget(model):
    """Between twin calls the session keeps its transient buffer: under a memory budget its
    bytes stay counted until the session closes, and a call does not count them twice."""
    budgeted = myelin.Instance().load(model.path, memory_budget="1MiB")
    budget = budgeted.budget
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    with budgeted.session() as s:
        memory = s.resolve("chain")._transients
        for m in (3, 3, 40, 40):  # a shape's first call runs `chain` itself, the next its twin
            x = rng.standard_normal((m, 16)).astype(np.float32)
            y = s.call("chain", x, w, output="dlpack")
            np.testing.assert_allclose(np.asarray(y.to_host()), x @ w @ w, rtol=1e-5, atol=1e-5)
            assert budget.in_flight == memory.nbytes  # no call runs: only the held buffer
        assert y.storage_pointer is not None and memory.nbytes >= 40 * 16 * 4
    assert budget.in_flight == 0  # given back with the session
    budgeted.close()


def test_twins_are_no_entrypoints_and_only_tensor_results_get_one(model):
    assert not any(STORAGE_TWIN_SUFFIX in name for name in model.entrypoints)
    with model.session() as s:
        assert _function(s, "neg" + STORAGE_TWIN_SUFFIX) is not None
        assert _function(s, "count" + STORAGE_TWIN_SUFFIX) is None  # a scalar result
        assert _function(s, "scale_into" + STORAGE_TWIN_SUFFIX) is None  # has storage already
        assert _function(s, "same" + STORAGE_TWIN_SUFFIX) is None  # returns its argument


def test_a_result_that_is_an_argument_stays_in_the_arguments_memory(model):
    """No twin, so no copy into storage: on a GPU the result aliases the imported tensor and
    exports as it is (benchmarks/probes/gpu/kernels_h200.py, `identity`); on a CPU the argument
    itself is IREE's copy of the host array."""
    torch = pytest.importorskip("torch")
    x = torch.arange(8, dtype=torch.float32)
    with model.session() as s:
        y = s.call("same", x, output="dlpack")
        assert y.storage_pointer is None
        assert torch.equal(torch.from_dlpack(y), x)


def test_a_static_result_is_written_into_myelin_memory_that_torch_views_in_place(model):
    torch = pytest.importorskip("torch")
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with model.session() as s:
        y = s.call("neg", x, output="dlpack")
        assert y.storage_pointer is not None
        t = torch.from_dlpack(y)
        assert t.data_ptr() == y.storage_pointer  # the memory MyeLiN allocated: no copy
        np.testing.assert_array_equal(t.numpy(), -x)
        np.testing.assert_array_equal(s.call("neg", x), -x)  # numpy results as before


def test_device_results_stay_in_iree_memory_unless_dlpack_is_asked(model):
    """output="device" is the fast path (no allocation, no import per result): the result is
    IREE's, which a GPU cannot export, and the error names output="dlpack"."""
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with model.session() as s:
        y = s.call("neg", x, output="device")
        assert y.storage_pointer is None
        assert 'output="dlpack"' in y.not_exported
        np.testing.assert_array_equal(np.asarray(y.to_host()), -x)


def test_dynamic_result_shapes_are_learned_by_the_first_call_of_each_input_shape(model):
    x3, x5, w = np.ones((3, 4), np.float32), np.ones((5, 4), np.float32), np.arange(4.0, 8.0)
    w = w.astype(np.float32)
    with model.session() as s:
        call = s.resolve("rows")
        assert call.storage_shapes((x3, w)) is None
        first = s.call("rows", x3, w, output="dlpack")
        assert [o.storage_pointer for o in first] == [None, None]  # IREE's memory
        assert call.storage_shapes((x3, w)) == ((3, 4), (4,))
        second = s.call("rows", x3, w, output="dlpack")
        assert all(o.storage_pointer is not None for o in second)
        np.testing.assert_array_equal(second[0].to_host(), x3 * w)
        np.testing.assert_array_equal(second[1].to_host(), w + w)
        other = s.call("rows", x5, w, output="dlpack")  # a new input shape: learned again
        assert other[0].storage_pointer is None and tuple(other[0].shape) == (5, 4)
        assert call.storage_shapes((x5, w)) == ((5, 4), (4,))


def test_a_torch_view_outlives_the_result_the_session_and_the_model(tmp_path):
    torch = pytest.importorskip("torch")
    _write_package(tmp_path, result_storage=True)
    gc.collect()
    before = live_capsules()
    model = myelin.Instance().load(build(tmp_path / "app.toml", tmp_path / "s.mln").output)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with model.session() as s:
        kept = torch.from_dlpack(s.call("neg", x, output="dlpack"))  # result dropped at once
        y = s.call("neg", x + 1, output="dlpack")
        dropped_first = torch.from_dlpack(y)
        del dropped_first  # the torch tensor first, then the result
        del y
    model.close()
    gc.collect()
    _ = [np.full((4, 8), 7.0, np.float32) for _ in range(8)]  # reuse freed memory, if any
    np.testing.assert_array_equal(kept.numpy(), -x)
    assert live_capsules() == before + 1  # the storage `kept` views, and nothing else
    del kept
    gc.collect()
    assert live_capsules() == before


def test_an_unconsumed_capsule_frees_its_storage_when_dropped():
    gc.collect()
    before = live_capsules()
    capsule = dlpack_capsule(Storage(64, KDL_CPU), (4, 4), np.dtype(np.float32))
    assert live_capsules() == before + 1
    del capsule
    assert live_capsules() == before


# Memory whose release runs Python that takes the capsule table's lock again on the same thread,
# as a CUDA Storage's __del__ can (its allocations can start a garbage collection that deletes
# another capsule). Before the owner was dropped outside the lock, this hung.
_REENTRANT_RELEASE = textwrap.dedent(
    """
    import numpy as np
    from myelin.runtime.result_storage import KDL_CPU, dlpack_capsule, live_capsules

    class Memory:
        def __init__(self):
            self.host = np.empty(64, np.uint8)
            self.pointer, self.device_type = self.host.ctypes.data, KDL_CPU

        def __del__(self):
            print("left", live_capsules())

    capsule = dlpack_capsule(Memory(), (16,), np.dtype(np.float32))
    del capsule
    """
)


def test_a_release_that_runs_python_touching_the_capsules_does_not_deadlock():
    result = subprocess.run(
        [sys.executable, "-c", _REENTRANT_RELEASE], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["left", "0"]


def test_dlpack_type_codes_of_result_dtypes():
    from myelin.runtime.result_storage import _dl_dtype

    ml_dtypes = pytest.importorskip("ml_dtypes")
    codes = {
        np.float16: (2, 16),
        np.float32: (2, 32),
        ml_dtypes.bfloat16: (4, 16),
        np.int8: (0, 8),
        np.uint32: (1, 32),
        np.bool_: (6, 8),
    }
    for dtype, (code, bits) in codes.items():
        got = _dl_dtype(np.dtype(dtype))
        assert (got.code, got.bits, got.lanes) == (code, bits, 1), dtype
    with pytest.raises(TypeError, match="no DLPack type code"):
        _dl_dtype(np.dtype(np.complex64))
