"""`Instance(cuda_allocator=...)`, without a GPU: what each choice asks IREE for, and bad values.
The effect on call overhead is measured on the H200 (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

import myelin
from myelin.runtime import devices


def test_the_caching_allocator_is_asked_for_cuda_devices_only():
    caching = devices.DeviceRegistry(cuda_allocator="caching")
    assert caching._allocators("cuda") == ["caching"]
    assert caching._allocators("local-task") is None
    assert devices.DeviceRegistry(cuda_allocator="pool")._allocators("cuda") is None  # IREE's


def test_the_default_is_a_bounded_caching_allocator():
    default = devices.DeviceRegistry()
    assert default.cuda_allocator == devices.DEFAULT_CUDA_ALLOCATOR == "caching:4G;64"
    assert default._allocators("cuda") == [f"caching:device_local=*;{4 * 2**30};64"]


def test_an_unknown_allocator_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="cuda_allocator must be 'pool', 'caching' or 'caching:"):
        myelin.Instance(cuda_allocator="arena")


def test_a_bounded_caching_allocator_becomes_iree_s_spec():
    assert devices.caching_spec("pool") is None
    assert devices.caching_spec("caching") == "caching"  # unbounded
    assert devices.caching_spec("caching:8G") == f"caching:device_local=*;{8 * 2**30};64"
    assert devices.caching_spec("caching:1048576;4") == "caching:device_local=*;1048576;4"
    bounded = devices.DeviceRegistry(cuda_allocator="caching:512m;8")
    assert bounded._allocators("cuda") == [f"caching:device_local=*;{512 * 2**20};8"]
    assert bounded._allocators("local-task") is None and bounded.caches_cuda_memory
    assert not devices.DeviceRegistry(cuda_allocator="pool").caches_cuda_memory


@pytest.mark.parametrize("bad", ["caching:", "caching:8X", "caching:-1", "caching:1G;x", "cach:1G"])
def test_a_malformed_bound_is_refused_with_the_form(bad):
    with pytest.raises(ValueError, match=r"caching:<capacity>\[;<free count>\]"):
        myelin.Instance(cuda_allocator=bad)


def test_a_zero_bound_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="use 'pool' for no caching"):
        myelin.Instance(cuda_allocator="caching:0")


def test_iree_takes_the_bounded_spec_on_a_device():
    """IREE parses the spec when the device is created (local-task here: the same allocator
    code as CUDA); a spec it cannot parse fails there."""
    import iree.runtime as rt

    spec = devices.caching_spec("caching:1M;4")
    assert str(rt.get_driver("local-task").create_default_device(allocators=[spec]))


def test_a_second_allocation_mode_in_one_process_is_refused(monkeypatch):
    """IREE reads the CUDA allocation mode once, when the driver starts: a registry asking for
    another mode afterwards gets a DeviceUnavailable naming both, not a silent default."""
    monkeypatch.setitem(devices._DRIVER_ALLOCATOR, "cuda", "pool")
    with pytest.raises(myelin.DeviceUnavailable, match="created in this process for cuda_alloc"):
        devices.DeviceRegistry(cuda_allocator="caching")._driver("cuda")
