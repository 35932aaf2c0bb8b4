"""The CUDA driver calls the runtime makes itself (through libcuda, which IREE's CUDA
driver has loaded already): nothing here is needed on a machine without a GPU."""

from __future__ import annotations

import ctypes
import functools

# CUDA's legacy default stream handle (CU_STREAM_LEGACY) and DLPack's device type for it.
CU_STREAM_LEGACY = 1
KDL_CUDA = 2


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def synchronize_legacy_stream() -> None:
    """Wait on the host until the legacy default stream is idle.

    A DLPack producer (torch) orders its pending work before the stream the consumer names; IREE
    runs on streams of its own that the legacy stream does not order, so the import waits here
    for the producer's work instead: a tensor IREE reads is never one still being written."""
    status = _libcuda().cuStreamSynchronize(ctypes.c_void_p(CU_STREAM_LEGACY))
    if status != 0:
        raise RuntimeError(f"cuStreamSynchronize(CU_STREAM_LEGACY) failed with CUDA error {status}")


# CUresult values the peer-access setup tells apart.
CUDA_SUCCESS = 0
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704


def enable_peer_access(first: int, second: int) -> str | None:
    """Let GPUs `first` and `second` (CUDA ordinals) read each other's memory; None when they
    can, else the reason for people.

    IREE 3.13's CUDA HAL runs every device on its GPU's primary context and never enables peer
    access (its HIP HAL does), so without this a copy between two GPUs' buffers is staged through
    host memory by the CUDA driver. Enabling it on the primary contexts IREE uses is a CUDA-level
    setting at IREE's boundary: no IREE object is touched."""
    cuda = _libcuda()
    devices = []
    for ordinal in (first, second):
        device = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != CUDA_SUCCESS:
            return f"CUDA has no GPU {ordinal}"
        devices.append(device)
    for a, b in ((0, 1), (1, 0)):
        can = ctypes.c_int()
        status = cuda.cuDeviceCanAccessPeer(ctypes.byref(can), devices[a], devices[b])
        if status != CUDA_SUCCESS or not can.value:
            return (
                f"GPU {(first, second)[a]} cannot access the memory of GPU {(first, second)[b]} "
                "(no peer-to-peer path between them, cuDeviceCanAccessPeer)"
            )
    contexts = []
    try:
        for device in devices:
            context = ctypes.c_void_p()
            status = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
            if status != CUDA_SUCCESS:
                return f"cuDevicePrimaryCtxRetain failed with CUDA error {status}"
            contexts.append((device, context))
        for (_, current), (_, peer) in ((contexts[0], contexts[1]), (contexts[1], contexts[0])):
            if cuda.cuCtxPushCurrent_v2(current) != CUDA_SUCCESS:
                return "cuCtxPushCurrent failed"
            try:
                status = cuda.cuCtxEnablePeerAccess(peer, 0)
            finally:
                cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            if status not in (CUDA_SUCCESS, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                return f"cuCtxEnablePeerAccess failed with CUDA error {status}"
        return None
    finally:
        for device, _ in contexts:  # IREE holds its own reference on each primary context
            cuda.cuDevicePrimaryCtxRelease_v2(device)


@functools.cache
def _primary_context(ordinal: int) -> ctypes.c_void_p:
    """GPU `ordinal`'s primary context, retained for the life of the process: the context IREE's
    CUDA HAL (and torch) run on, so memory allocated in it is usable by both."""
    cuda = _libcuda()
    if cuda.cuInit(0) != CUDA_SUCCESS:
        raise RuntimeError("cuInit failed")
    device = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != CUDA_SUCCESS:
        raise RuntimeError(f"CUDA has no GPU {ordinal}")
    context = ctypes.c_void_p()
    status = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    if status != CUDA_SUCCESS:
        raise RuntimeError(f"cuDevicePrimaryCtxRetain failed with CUDA error {status}")
    return context


def device_alloc(nbytes: int, ordinal: int = 0) -> int:
    """`nbytes` of device memory on GPU `ordinal` (cuMemAlloc in its primary context)."""
    cuda = _libcuda()
    pointer = ctypes.c_uint64()
    if cuda.cuCtxPushCurrent_v2(_primary_context(ordinal)) != CUDA_SUCCESS:
        raise RuntimeError("cuCtxPushCurrent failed")
    try:
        status = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes))
    finally:
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    if status != CUDA_SUCCESS:
        raise MemoryError(f"cuMemAlloc of {nbytes} bytes failed with CUDA error {status}")
    return pointer.value


def device_free(pointer: int, ordinal: int = 0) -> None:
    """Free memory from `device_alloc`. Errors are ignored: this runs from deleters, possibly
    at interpreter exit after the driver has shut down, where nothing is left to free."""
    cuda = _libcuda()
    if cuda.cuCtxPushCurrent_v2(_primary_context(ordinal)) != CUDA_SUCCESS:
        return
    try:
        cuda.cuMemFree_v2(ctypes.c_uint64(pointer))
    finally:
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


_CU_EVENT_DISABLE_TIMING = 2


def record_legacy_event(ordinal: int = 0) -> int | None:
    """An event recorded on the legacy default stream of GPU `ordinal`: it completes once all
    work issued before it on that stream and on every blocking stream (torch's default stream
    among them) has finished. None when CUDA refuses (then the caller must not reuse memory)."""
    cuda = _libcuda()
    event = ctypes.c_void_p()
    if cuda.cuCtxPushCurrent_v2(_primary_context(ordinal)) != CUDA_SUCCESS:
        return None
    try:
        if cuda.cuEventCreate(ctypes.byref(event), _CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS:
            return None
        if cuda.cuEventRecord(event, ctypes.c_void_p(CU_STREAM_LEGACY)) != CUDA_SUCCESS:
            cuda.cuEventDestroy_v2(event)
            return None
        return event.value
    finally:
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def wait_and_destroy_event(event: int, ordinal: int = 0) -> None:
    """Block the host until `event` (from record_legacy_event) has completed, then free it."""
    cuda = _libcuda()
    if cuda.cuCtxPushCurrent_v2(_primary_context(ordinal)) != CUDA_SUCCESS:
        raise RuntimeError("cuCtxPushCurrent failed")
    try:
        status = cuda.cuEventSynchronize(ctypes.c_void_p(event))
        cuda.cuEventDestroy_v2(ctypes.c_void_p(event))
    finally:
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    if status != CUDA_SUCCESS:
        raise RuntimeError(f"cuEventSynchronize failed with CUDA error {status}")
