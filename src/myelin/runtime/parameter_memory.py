"""The memory of a loaded file's parameters as IREE sees it: a file handle whose Python side is
released under the GIL, on a Python thread.

Why: IREE 3.13's `FileHandle.wrap_memory(obj)` keeps `obj` (a reference and a Py_buffer) until
the last holder of the handle lets go, and its release callback drops them without taking the
GIL. With zero-copy parameters the HAL buffers imported from the handle hold it, and the last of
those can be an IREE task worker retiring a call after the call returned and the model was
closed. `obj` then goes on that worker: when it is the mmap, its deallocation "saves" the thread
state that happens to be current (the main thread's, if it holds the GIL) around munmap, and two
threads run Python at once; the process segfaults later, in the main thread, on an ordinary
line (seen in a full test run; the core's native stack has an `iree-worker` thread in
`mmap_object_dealloc`). With no Python thread holding the GIL it aborts instead ("PyEval_SaveThread:
the function must be called with the GIL held").

The workaround, at IREE's public API: IREE wraps a proxy (a memoryview of the mapping) that only
this module holds besides IREE. A worker's release then only decrements the proxy's reference
count, never to zero, so nothing is freed and no Python code runs there; the proxy, and the
mapping behind it, is dropped here, under the GIL, once IREE's references are gone. `collect()`
finds those by reading each proxy's count from its object header: taking a reference to read it
(`sys.getrefcount`) would be a second unlocked write to the same count as the worker's.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Sequence
from typing import Any

import iree.runtime as rt

from myelin.mln import PARAMETER_PAGE, SectionEntry, align_up

# id(proxy) -> proxy. A proxy is only ever stored and deleted: iterating the values, or keeping
# one anywhere else, would change its count while an IREE worker may be changing it too.
_PROXIES: dict[int, memoryview] = {}
_LOCK = threading.Lock()
# The count of a proxy that only _PROXIES holds.
_ONLY_OURS = 1


def parameter_pages(sections: Sequence[SectionEntry], file_size: int) -> tuple[int, int]:
    """The bytes [start, end) of a file to wrap for parameters in these sections: their whole
    pages (PARAMETER_PAGE), cut at the end of the file.

    Why whole pages: a device imports host memory only in pages, and a memory file that IREE's
    Vulkan driver cannot import it reads through host-side staging, whose completions two IREE
    threads report at once: IREE 3.13's queue then signals its wakeup semaphore out of order,
    which Mesa's lavapipe answers with VK_ERROR_DEVICE_LOST for the rest of the process (seen
    within a few dozen model loads). Imported pages are read by queue copies, with no staging.
    Files written before the manifest moved onto a page may end inside the last one: then the
    import fails as before and IREE stages, still correct where no race strikes.
    """
    if not sections:
        return 0, file_size
    start = min(s.offset for s in sections) // PARAMETER_PAGE * PARAMETER_PAGE
    end = align_up(max(s.offset + s.length for s in sections), PARAMETER_PAGE)
    return start, min(end, file_size)


def wrap_mapping(mapping: Any, start: int = 0, end: int | None = None) -> rt.FileHandle:
    """A read-only IREE file handle over bytes [start, end) of `mapping` (an mmap), zero-copy,
    whose Python side is never released by an IREE thread."""
    collect()
    proxy = memoryview(mapping)[start:end]
    handle = rt.FileHandle.wrap_memory(proxy, readable=True, writable=False)
    with _LOCK:
        _PROXIES[id(proxy)] = proxy
    return handle


def _count(address: int) -> int:
    """The reference count in the header of the object at `address` (CPython: its first field)."""
    return ctypes.c_ssize_t.from_address(address).value


def _header_is_readable() -> bool:
    """Whether `_count` reads this interpreter's counts (not so where the header is laid out
    otherwise, as in free-threaded builds: there proxies are kept for the process instead)."""
    probe = memoryview(b"")
    return _count(id(probe)) == sys.getrefcount(probe) - 1


_READABLE = _header_is_readable()


def collect() -> int:
    """Drop every proxy IREE has let go of (on this thread, under the GIL); how many went."""
    if not _READABLE:
        return 0
    with _LOCK:
        released = [a for a in list(_PROXIES) if _count(a) == _ONLY_OURS]
        for address in released:
            del _PROXIES[address]  # the proxy goes here; the mapping with its last view
    return len(released)


def held() -> int:
    """How many wrapped mappings IREE may still hold (for tests of the lifetimes)."""
    with _LOCK:
        return len(_PROXIES)
