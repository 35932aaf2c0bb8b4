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
    assert devices.DeviceRegistry()._allocators("cuda") is None  # "pool": IREE's default


def test_an_unknown_allocator_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="cuda_allocator must be one of 'pool', 'caching'"):
        myelin.Instance(cuda_allocator="arena")


def test_a_second_allocation_mode_in_one_process_is_refused(monkeypatch):
    """IREE reads the CUDA allocation mode once, when the driver starts: a registry asking for
    another mode afterwards gets a DeviceUnavailable naming both, not a silent default."""
    monkeypatch.setitem(devices._DRIVER_ALLOCATOR, "cuda", "pool")
    with pytest.raises(myelin.DeviceUnavailable, match="created in this process for cuda_alloc"):
        devices.DeviceRegistry(cuda_allocator="caching")._driver("cuda")
