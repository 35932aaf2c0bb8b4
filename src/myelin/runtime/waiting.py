"""How a call waits for its signal fence: blocking, or blocking then spinning (hybrid).

Why: a blocked waiter is woken by IREE's completion thread through the OS, which costs tens to
hundreds of microseconds after the GPU is done (docs/runtime.md, "Overhead"); a spinning waiter
sees the fence as soon as IREE signals it but burns a CPU core while it waits. The hybrid policy
blocks until shortly before the call is expected to finish (the previous call of the same
entrypoint's wait, a good guess for a serving loop), then polls the fence for at most
`spin_s` past that point, then blocks again. Every blocking wait is at most `slice_s` long (a
Deadline's slice: myelin.runtime.deadline), so the caller's cancel and deadline checks keep
their latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class FenceWait:
    """The wait policy of one entrypoint in one session. `spin_s` 0 means block only."""

    spin_s: float = 0.0
    expected_s: float | None = None  # the last wait's length: when the next is expected done

    def wait(self, fence: Any, slice_s: Callable[[], float], check: Callable[[], None]) -> None:
        """Return once `fence` is signalled; `check()` between blocking slices (it raises to
        stop); `slice_s()` the longest a blocking wait may take now."""
        if self.spin_s <= 0:  # block only: nothing to time
            while not fence.wait(timeout=int(slice_s() * 1e9)):
                check()
            return
        start = time.perf_counter()
        lead = (self.expected_s or 0.0) - self.spin_s  # block this long first
        while lead > 0 and time.perf_counter() - start < lead:
            left = lead - (time.perf_counter() - start)
            if fence.wait(timeout=int(min(left, slice_s()) * 1e9)):
                return self._done(start)
            check()
        until = time.perf_counter() + 2 * self.spin_s
        while time.perf_counter() < until:
            if fence.wait(timeout=0):
                return self._done(start)
        while not fence.wait(timeout=int(slice_s() * 1e9)):
            check()
        self._done(start)

    def _done(self, start: float) -> None:
        self.expected_s = time.perf_counter() - start
