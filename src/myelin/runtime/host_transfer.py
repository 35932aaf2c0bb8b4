"""Reading a device buffer into host memory: in place where the host may map it, else through a
host-visible staging buffer filled by a queue copy.

Why two paths: a buffer the host can map (a CPU device's, or host-visible memory allocated with
MAPPING) is read without a copy on the device; a GPU's device-local memory, and on Vulkan every
buffer IREE allocates for a dispatch result (allowed usage TRANSFER|DISPATCH_STORAGE, even where
the memory itself is host-visible, as on Mesa's lavapipe), cannot be mapped: IREE refuses with
PERMISSION_DENIED "operation requires MAPPING_SCOPED". Those are copied on the device's queue
into a host-visible buffer allocated for the read, then mapped. IREE 3.13's own
`DeviceArray.to_host` is not used for that: where the allocator claims it can import host memory
(Vulkan with VK_EXT_external_memory_host, lavapipe's included) it imports a numpy array, which
Vulkan refuses unless it is aligned to minImportedHostPointerAlignment (4096 on lavapipe).

A staging buffer is host memory the device can write (pinned memory on CUDA): allocating one
and a semaphore per read cost about 1.5 ms on an H100, ten times the GPU time of a whole
decode step of a two-layer 7B-shaped model. A caller that reads the same sizes again (an
entrypoint's results, call after call) passes `StagingBuffers`, which keeps them for reuse.
"""

from __future__ import annotations

import threading
from typing import Any

import iree.runtime as rt
import numpy as np

_HOST_VISIBLE = int(rt.MemoryType.HOST_VISIBLE)
_MAPPING_SCOPED = int(rt.BufferUsage.MAPPING_SCOPED)
_STAGING_MEMORY = int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)
_STAGING_USAGE = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED)


def host_mappable(buffer: rt.HalBuffer) -> bool:
    """Whether the host may map `buffer`: host-visible memory that was allocated for mapping."""
    return (
        bool(buffer.memory_type() & _HOST_VISIBLE)
        and (buffer.allowed_usage() & _MAPPING_SCOPED) == _MAPPING_SCOPED
    )


class _Staging:
    """One staging buffer and the semaphore its copies signal (the next value to wait for)."""

    __slots__ = ("buffer", "semaphore", "value")

    def __init__(self, device: rt.HalDevice, size: int) -> None:
        self.buffer = device.allocator.allocate_buffer(
            memory_type=_STAGING_MEMORY, allowed_usage=_STAGING_USAGE, allocation_size=size
        )
        self.semaphore = device.create_semaphore(0)
        self.value = 0


class StagingBuffers:
    """Staging buffers of one device kept for reuse, by size. Thread-safe: a buffer is taken
    for the whole of one read, so concurrent reads of one size each get their own. At most
    `KEEP` buffers of a size are kept; the owner (a resolved entrypoint) drops them with it."""

    KEEP = 2

    def __init__(self, device: rt.HalDevice) -> None:
        self.device = device
        self._free: dict[int, list[_Staging]] = {}
        self._lock = threading.Lock()

    def take(self, size: int) -> _Staging:
        with self._lock:
            kept = self._free.get(size)
            if kept:
                return kept.pop()
        return _Staging(self.device, size)

    def give(self, staging: _Staging, size: int) -> None:
        with self._lock:
            kept = self._free.setdefault(size, [])
            if len(kept) < self.KEEP:
                kept.append(staging)


def read_to_host(
    device: rt.HalDevice,
    view: rt.HalBufferView,
    dtype: Any,
    staging: StagingBuffers | None = None,
) -> np.ndarray:
    """A fresh numpy array (`dtype`) holding `view`'s contents, owning its memory: it outlives
    the HAL buffer and its device (at interpreter exit, or after the model is closed).
    `staging`: where to take (and give back) the staging buffer a device-local read needs."""
    return HostRead(device, view, dtype, staging).result()


class HostRead:
    """A read of `view` into host memory, started when made and finished by `result()`: a
    buffer the host can map is read then; any other is copied on the device's queue into a
    staging buffer at once, and `result()` waits for that copy. Started behind queued work on a
    queue that runs in submission order (a CUDA device's), the copy reads what that work
    wrote, and the host can queue more before waiting for it (myelin.runtime.pending)."""

    __slots__ = ("_dtype", "_entry", "_shape", "_size", "_staging", "_value", "_view")

    def __init__(
        self,
        device: rt.HalDevice,
        view: rt.HalBufferView,
        dtype: Any,
        staging: StagingBuffers | None = None,
    ) -> None:
        self._view, self._dtype, self._shape = view, dtype, view.shape
        self._staging = staging
        self._entry: _Staging | None = None
        self._value: np.ndarray | None = None
        self._size = 0
        if host_mappable(view.get_buffer()):
            return
        source = view.get_buffer()
        self._size = size = source.byte_length()
        entry = staging.take(size) if staging is not None else _Staging(device, size)
        entry.value += 1
        device.queue_copy(source, entry.buffer, [], [(entry.semaphore, entry.value)])
        self._entry = entry

    def result(self) -> np.ndarray:
        """The contents as a fresh numpy array (waiting for the copy, if one was queued)."""
        if self._value is None:
            self._value = self._read()
        return self._value

    def _read(self) -> np.ndarray:
        entry = self._entry
        if entry is not None:
            entry.semaphore.wait(entry.value)
        mapped = (self._view if entry is None else entry.buffer).map()
        try:
            return np.array(mapped.asarray(self._shape, self._dtype), copy=True)
        finally:
            del mapped
            if entry is not None:
                self._entry = None
                if self._staging is not None:
                    self._staging.give(entry, self._size)
