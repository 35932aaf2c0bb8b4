"""Result storage MyeLiN allocates itself, so that device results export DLPack.

IREE 3.13's CUDA allocator exports (`HalDevice.create_dlpack_capsule`) only buffers it imported;
a result IREE allocated itself cannot reach torch without a copy. So, for `output="device"`,
the runtime allocates each result's memory (`cuMemAlloc` on a GPU, aligned host memory on a CPU
device), wraps it in a DLPack capsule of its own, imports that into a HAL buffer view
(`HalDevice.from_dlpack_capsule`, IREE's public import) and passes it to the entrypoint's storage
twin (`f$into`, myelin.compiler.storage_twins), which writes the result into it. The result's
buffer is then imported memory, which IREE exports.

Lifetime: a `Storage` frees its memory when the last reference goes. The capsule IREE imports
holds one (dropped by the DLManagedTensor deleter IREE calls when it releases the buffer);
IREE's exported capsule holds the buffer, so a torch tensor made from a result keeps the memory
alive after the result, the session and the model are gone.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

from myelin.runtime._cuda import (
    KDL_CUDA,
    device_alloc,
    device_free,
    record_legacy_event,
    wait_and_destroy_event,
)

KDL_CPU = 1
# IREE's heap allocator imports host memory aligned to 64 bytes only.
_HOST_ALIGNMENT = 64


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]

# DLPack's type codes by numpy kind (kDLInt, kDLUInt, kDLFloat, kDLBool); bfloat16 is its own.
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}
_BFLOAT = 4


def _dl_dtype(dtype: np.dtype) -> _DLDataType:
    return _DLDataType(*_dl_type_code(dtype))


@functools.cache
def _dl_type_code(dtype: np.dtype) -> tuple[int, int, int]:
    if dtype.name == "bfloat16":
        return (_BFLOAT, 16, 1)
    if dtype.kind not in _CODES:
        raise TypeError(f"dtype {dtype} has no DLPack type code")
    return (_CODES[dtype.kind], dtype.itemsize * 8, 1)


# Capsules alive (not yet deleted), by the address of their DLManagedTensor: each entry holds
# the struct, its shape array and the owner whose memory it points to.
_LIVE: dict[int, tuple[Any, ...]] = {}
_LIVE_LOCK = threading.Lock()


def _forget(address: int) -> None:
    """Drop the entry of a deleted capsule. Its owner goes outside the lock: a Storage's
    __del__ runs Python (allocations, so a garbage collection that can delete other capsules,
    which take this lock again on the same thread)."""
    with _LIVE_LOCK:
        entry = _LIVE.pop(address, None)
    del entry


@_DELETER
def _delete(managed: Any) -> None:
    """The DLManagedTensor deleter (called by the consumer: IREE, when it releases the buffer)."""
    _forget(ctypes.addressof(managed.contents))


# Prototypes of our own over the C API: setting argtypes on `ctypes.pythonapi.X` would change
# them for every other user of that shared object (IREE's compiler bindings among them). The
# destructor gets the dying capsule as a raw pointer: as a py_object, ctypes would take a new
# reference to an object whose count is already zero (and free it twice).
_PyCapsule_New = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_CAPSULE_NAME = b"dltensor"


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule: int) -> None:
    """A capsule dropped unconsumed (still named "dltensor") deletes its tensor itself."""
    if _PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        _forget(_PyCapsule_GetPointer(capsule, _CAPSULE_NAME))


_DESTRUCTOR_ADDRESS = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value


def dlpack_capsule(storage: Storage, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A DLPack capsule ("dltensor", unversioned: what IREE 3.13 imports) over `storage`,
    contiguous, of `shape` and `dtype`; it keeps `storage` alive until its deleter runs."""
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = _DLManagedTensor()
    managed.dl_tensor.data = storage.pointer
    managed.dl_tensor.device = _DLDevice(storage.device_type, 0)
    managed.dl_tensor.ndim = len(shape)
    managed.dl_tensor.dtype = _dl_dtype(dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))
    managed.dl_tensor.shape = dims
    managed.dl_tensor.strides = None  # compact row-major
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    with _LIVE_LOCK:
        _LIVE[address] = (managed, dims, storage)
    return _PyCapsule_New(address, _CAPSULE_NAME, _DESTRUCTOR_ADDRESS)


def live_capsules() -> int:
    """How many capsules MyeLiN made are not yet deleted (for tests of the lifetimes)."""
    with _LIVE_LOCK:
        return len(_LIVE)


class _FreedDeviceMemory:
    """Device memory of dropped results kept for the next result of the same size, with
    `Instance(cuda_allocator="caching")`: cuMemAlloc and cuMemFree of a large block cost
    about as much as the call itself (256 MiB on the H200: docs/benchmarks.md), and a steady
    stream of calls needs the same sizes again. As with IREE's caching allocator and torch's,
    the memory stays reserved by the process.

    Order: torch drops a tensor (and calls the DLPack deleter) while kernels it queued may
    still read it. cuMemFree waits for those; a reused block must too. So a block is given
    back with an event on the legacy default stream (after all work queued on blocking
    streams, torch's default stream included) and taken only once that event completed.

    Bounds: at most BLOCKS_PER_SIZE blocks are kept per size (a model with dynamic result
    shapes makes many sizes, each of which would otherwise stay reserved), and an allocation
    that fails gives every kept block back to the driver and tries once more."""

    BLOCKS_PER_SIZE = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, list[tuple[int, int]]] = {}  # size -> [(pointer, event)]

    def take(self, nbytes: int) -> int | None:
        with self._lock:
            blocks = self._blocks.get(nbytes)
            if not blocks:
                return None
            pointer, event = blocks.pop()
        wait_and_destroy_event(event)
        return pointer

    def give(self, nbytes: int, pointer: int) -> None:
        event = record_legacy_event()
        if event is None:  # no way to order the reuse: free it
            device_free(pointer)
            return
        with self._lock:
            blocks = self._blocks.setdefault(nbytes, [])
            if len(blocks) < self.BLOCKS_PER_SIZE:
                blocks.append((pointer, event))
                return
        wait_and_destroy_event(event)  # enough of this size kept: back to the driver
        device_free(pointer)

    def release(self) -> int:
        """Give every kept block back to the driver (once its event completed); the bytes."""
        with self._lock:
            kept, self._blocks = self._blocks, {}
        freed = 0
        for nbytes, blocks in kept.items():
            for pointer, event in blocks:
                wait_and_destroy_event(event)
                device_free(pointer)
                freed += nbytes
        return freed

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(n * len(b) for n, b in self._blocks.items())


FREED_DEVICE_MEMORY = _FreedDeviceMemory()


def _alloc(nbytes: int, reuse: bool) -> int:
    """cuMemAlloc; when it fails and blocks are kept for reuse, free those and try again."""
    try:
        return device_alloc(nbytes)
    except MemoryError:
        if not reuse or not FREED_DEVICE_MEMORY.release():
            raise
        return device_alloc(nbytes)


class Storage:
    """One allocation for one result: device memory (`cuMemAlloc`) or aligned host memory,
    freed when the object is (or, with `reuse`, kept in FREED_DEVICE_MEMORY)."""

    __slots__ = ("__weakref__", "_host", "_reuse", "device_type", "nbytes", "pointer")

    def __init__(self, nbytes: int, device_type: int, *, reuse: bool = False) -> None:
        self.nbytes = nbytes
        self.device_type = device_type
        self._host: np.ndarray | None = None
        self._reuse = reuse and device_type == KDL_CUDA
        if device_type == KDL_CUDA:
            size = max(nbytes, 1)
            cached = FREED_DEVICE_MEMORY.take(size) if self._reuse else None
            self.pointer = cached if cached is not None else _alloc(size, self._reuse)
        else:
            raw = np.empty(nbytes + _HOST_ALIGNMENT, np.uint8)
            offset = (-raw.ctypes.data) % _HOST_ALIGNMENT
            self._host = raw
            self.pointer = raw.ctypes.data + offset

    def __del__(self) -> None:
        if self.device_type == KDL_CUDA and getattr(self, "pointer", None):
            if self._reuse:
                FREED_DEVICE_MEMORY.give(max(self.nbytes, 1), self.pointer)
            else:
                device_free(self.pointer)
            self.pointer = 0
