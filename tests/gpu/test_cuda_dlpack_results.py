"""Device results that export DLPack on a GPU: `torch.from_dlpack(y)` views the memory MyeLiN
allocated (cuMemAlloc) without a copy, and the views outlive the result, the session and the
model. Artifact: `dlpack.mln` (benchmarks/gpu/dlpack, built by benchmarks/gpu/prepare.py)."""

from __future__ import annotations

import gc

import pytest
from gpu_helpers import artifact

import myelin
from myelin.runtime.result_storage import FREED_DEVICE_MEMORY, live_capsules

N = 128 * 2**20  # the static entrypoint's float16 elements: 256 MiB


@pytest.fixture(scope="module")
def torch(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.fixture()
def model(artifacts, torch):
    loaded = myelin.Instance().load(artifact(artifacts, "dlpack.mln"), variant="cuda")
    yield loaded
    loaded.close()


def test_a_device_result_is_viewed_by_torch_in_the_memory_myelin_allocated(model, torch):
    x = torch.randn(N, dtype=torch.float16, device="cuda")
    with model.session() as s:
        y = s.call("negate", x, output="dlpack")
        t = torch.from_dlpack(y)
        assert y.storage_pointer is not None
        assert t.data_ptr() == y.storage_pointer  # no copy: the storage itself
        assert t.data_ptr() != x.data_ptr()
        assert torch.equal(t, -x)


def test_dynamic_results_export_from_the_second_call_of_an_input_shape(model, torch):
    x = torch.randn(4096, dtype=torch.float16, device="cuda")
    with model.session() as s:
        first = s.call("negate_dyn", x, output="dlpack")
        with pytest.raises(BufferError, match="first call with these input shapes"):
            torch.from_dlpack(first)
        second = s.call("negate_dyn", x, output="dlpack")
        t = torch.from_dlpack(second)
        assert t.data_ptr() == second.storage_pointer
        assert torch.equal(t, -x)


def test_views_outlive_the_result_the_session_and_the_model(artifacts, torch):
    gc.collect()
    before = live_capsules()
    model = myelin.Instance().load(artifact(artifacts, "dlpack.mln"), variant="cuda")
    x = torch.randn(N, dtype=torch.float16, device="cuda")
    with model.session() as s:
        kept = torch.from_dlpack(s.call("negate", x, output="dlpack"))  # the result dropped
        y = s.call("negate", x, output="dlpack")
        view = torch.from_dlpack(y)
        del view, y  # the view first, then the result
    model.close()
    gc.collect()
    noise = torch.randn(N, dtype=torch.float16, device="cuda")  # would reuse freed memory
    assert torch.equal(kept, -x)
    assert live_capsules() == before + 1
    del noise
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    del kept
    gc.collect()
    torch.cuda.synchronize()
    assert live_capsules() == before
    # The default allocator caches: the dropped block is kept for the next result of its size
    # until released (as a failed cuMemAlloc would); then it goes back to the driver.
    FREED_DEVICE_MEMORY.release()
    assert torch.cuda.mem_get_info()[0] - free >= N * 2  # the 256 MiB went back to the driver


REUSE = """
import sys, torch, myelin
model = myelin.Instance(cuda_allocator="caching").load(sys.argv[1], variant="cuda")
x = torch.randn(1 << 20, dtype=torch.float16, device="cuda")
with model.session() as s:
    s.call("negate_dyn", x, output="dlpack")  # learns the shape
    first = s.call("negate_dyn", x, output="dlpack")
    pointer = first.storage_pointer
    t = torch.from_dlpack(first)
    y = torch.empty_like(x)
    for _ in range(50):  # queued work that reads the view when it is dropped
        torch.add(t, 1, out=y)
    del t, first
    again = s.call("negate_dyn", x, output="dlpack")
    assert again.storage_pointer == pointer, "the dropped block was not reused"
    assert torch.equal(torch.from_dlpack(again), -x)
    assert torch.equal(y, -x + 1), "the reused block was written while torch still read it"
print("ok")
"""


def test_with_the_caching_allocator_a_dropped_results_block_is_reused_in_order(artifacts, torch):
    """cuda_allocator is per process: the check runs in a process of its own."""
    import subprocess
    import sys

    path = artifact(artifacts, "dlpack.mln")
    done = subprocess.run(
        [sys.executable, "-c", REUSE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


BOUNDS = """
import torch
from myelin.runtime.result_storage import FREED_DEVICE_MEMORY, KDL_CUDA, Storage
torch.zeros(1, device="cuda")  # the primary context
n, kept = 1 << 20, FREED_DEVICE_MEMORY.BLOCKS_PER_SIZE
blocks = [Storage(n, KDL_CUDA, reuse=True) for _ in range(kept + 2)]
del blocks  # each gives its block back: only `kept` of one size stay reserved
assert FREED_DEVICE_MEMORY.cached_bytes() == kept * n, FREED_DEVICE_MEMORY.cached_bytes()
assert FREED_DEVICE_MEMORY.release() == kept * n
assert FREED_DEVICE_MEMORY.cached_bytes() == 0
print("ok")
"""


def test_kept_blocks_are_bounded_per_size_and_released_on_demand(torch):
    """A model with dynamic result shapes makes many sizes: the memory kept for reuse must not
    grow without bound, and a failed allocation can take it back (`release`)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", BOUNDS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
