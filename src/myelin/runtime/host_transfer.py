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
"""

from __future__ import annotations

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


def read_to_host(device: rt.HalDevice, view: rt.HalBufferView, dtype: Any) -> np.ndarray:
    """A fresh numpy array (`dtype`) holding `view`'s contents, owning its memory: it outlives
    the HAL buffer and its device (at interpreter exit, or after the model is closed)."""
    if host_mappable(view.get_buffer()):
        mapped = view.map()
        try:
            return np.array(mapped.asarray(view.shape, dtype), copy=True)
        finally:
            del mapped
    source = view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=_STAGING_MEMORY,
        allowed_usage=_STAGING_USAGE,
        allocation_size=source.byte_length(),
    )
    semaphore = device.create_semaphore(0)
    device.queue_copy(source, staging, [], [(semaphore, 1)])
    semaphore.wait(1)
    mapped = staging.map()
    try:
        return np.array(mapped.asarray(view.shape, dtype), copy=True)
    finally:
        del mapped
