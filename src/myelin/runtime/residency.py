"""Weight residency: what happens to the parameter pages of the .mln mapping between calls.

IREE reads parameters straight from our read-only mmap (zero-copy on CPU; the source of the
upload on GPUs), so residency is a matter of telling the kernel what we expect, with madvise on
the parameter byte ranges. No copies, no threads, no custom I/O engine:

- `resident`: populate the page tables at load (MADV_POPULATE_READ, else WILLNEED) so every
  call finds its weights mapped; with `lock=True` also mlock them where the system allows.
- `streamed`: after the last call in flight ends (and after load), MADV_COLD then MADV_DONTNEED:
  the pages leave this process (RSS drops) and go to the front of the kernel's reclaim list; a
  later call faults in only the pages it touches.
- `prefetch`: like `streamed`, and before each call MADV_WILLNEED on the parameters that
  entrypoint reads (recorded in the .mln), so the kernel reads them ahead while the call starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
from collections.abc import Iterable, Mapping

from myelin.mln import RESIDENCY_MODES

# Linux values; Python's mmap module does not name them.
MADV_COLD = 20
MADV_POPULATE_READ = 22
PAGE = mmap.PAGESIZE

ParameterKey = tuple[str, str]


def _page_runs(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Page-aligned (start, length) runs covering the byte ranges, adjacent ones merged."""
    spans = sorted(
        (off - off % PAGE, -(-(off + length) // PAGE) * PAGE) for off, length in ranges if length
    )
    runs: list[list[int]] = []
    for start, end in spans:
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [(start, end - start) for start, end in runs]


class ParameterResidency:
    """Applies one residency policy to the parameter ranges of one loaded variant."""

    def __init__(
        self,
        mapping: mmap.mmap,
        ranges: Mapping[ParameterKey, tuple[int, int]],
        policy: str,
        *,
        lock: bool = False,
    ) -> None:
        if policy not in RESIDENCY_MODES:
            raise ValueError(f"unknown residency {policy!r}; expected one of {RESIDENCY_MODES}")
        self.policy = policy
        self.locked = False
        self._mapping = mapping
        self._ranges = dict(ranges)
        self._all_runs = _page_runs(self._ranges.values())
        self._in_flight = 0
        self._counter = threading.Lock()
        self._lock_requested = lock

    @property
    def parameter_bytes(self) -> int:
        return sum(length for _, length in self._ranges.values())

    def on_load(self) -> None:
        if self.policy == "resident":
            for start, length in self._all_runs:
                if not self._advise(MADV_POPULATE_READ, start, length):
                    self._advise(mmap.MADV_WILLNEED, start, length)
            if self._lock_requested:
                self.locked = self._mlock()
        else:
            self._drop()

    def before_call(self, parameters: Iterable[ParameterKey] | None) -> None:
        with self._counter:
            self._in_flight += 1
        if self.policy == "prefetch":
            keys = self._ranges if parameters is None else parameters
            ranges = [self._ranges[k] for k in keys if k in self._ranges]
            for start, length in _page_runs(ranges):
                self._advise(mmap.MADV_WILLNEED, start, length)

    def after_call(self) -> None:
        with self._counter:
            self._in_flight -= 1
            last = self._in_flight == 0
        if last and self.policy != "resident":
            self._drop()

    def after_upload(self) -> None:
        """A new VM context has read what it copies (on GPUs, every parameter)."""
        if self.policy != "resident":
            with self._counter:
                idle = self._in_flight == 0
            if idle:
                self._drop()

    def _drop(self) -> None:
        for start, length in self._all_runs:
            self._advise(MADV_COLD, start, length)  # reclaim these first...
            self._advise(mmap.MADV_DONTNEED, start, length)  # ...and unmap them from us now

    def _advise(self, option: int, start: int, length: int) -> bool:
        try:
            self._mapping.madvise(option, start, length)
            return True
        except (OSError, ValueError):  # older kernels lack COLD / POPULATE_READ
            return False

    def _mlock(self) -> bool:
        libc_name = ctypes.util.find_library("c")
        if not libc_name or not self._all_runs:
            return False
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        base = _address_of(self._mapping)
        for start, length in self._all_runs:
            if libc.mlock(ctypes.c_void_p(base + start), ctypes.c_size_t(length)) != 0:
                errno = ctypes.get_errno()
                self._unlock(libc, base)
                if errno in (1, 11, 12):  # EPERM, EAGAIN, ENOMEM: not allowed here
                    return False
                raise OSError(errno, os.strerror(errno))
        return True

    def _unlock(self, libc: ctypes.CDLL, base: int) -> None:
        libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        for start, length in self._all_runs:
            libc.munlock(ctypes.c_void_p(base + start), ctypes.c_size_t(length))


def _address_of(mapping: mmap.mmap) -> int:
    import numpy as np

    view = np.frombuffer(mapping, dtype=np.uint8, count=1)
    try:
        return int(view.ctypes.data)
    finally:
        del view
