"""The two CUDA driver calls the runtime makes itself (through libcuda, which IREE's CUDA
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
