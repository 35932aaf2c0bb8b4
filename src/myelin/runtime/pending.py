"""Submitted calls: `ResolvedCall.submit` hands a call to the device and returns at once, so a
serving loop keeps the device busy while it prepares the next call, as torch's asynchronous
launches do. Results are read through the `PendingCall`, which waits for them.

How a submission is ordered (IREE 3.13, checked on the H200 and on `local-task`):
- On CUDA, where the build recorded the call as one queue execution (the entrypoint's
  `schedule.executes`), a submission waits for nothing and signals its own value on the
  session's submission timeline. Chained on the previous call's signal instead, IREE's
  `queue.alloca` (synchronous allocations, which the caching allocator runs on) waits for that
  signal on the host inside the invocation, so a GEMV's invoke took ~140 us, the whole kernel,
  and nothing overlapped; unchained it takes 6-29 us. Order still holds: IREE issues every
  queue operation of a CUDA device on one stream, in submission order, and a one-execution
  call's own waits are met on the host before the invocation returns (docs/runtime.md,
  "Submitted calls").
- Elsewhere (`local-task`; CUDA calls of several executions) a submission chains on the
  session's call timeline as a call does: the task queue runs unchained submissions
  concurrently, and out of order they would fail the timeline (`semaphore already signaled
  past`). Chained, its invoke returns in microseconds on `local-task`.

A session holds at most `MAX_IN_FLIGHT` submissions; one more waits for the oldest first. The
session keeps every submission's arguments and results alive until it is done, whatever the
caller drops, and `Session.close()` waits for them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any

import iree.runtime as rt
import numpy as np

from myelin.errors import DeadlineExceeded, MyelinError
from myelin.runtime._iree_private import buffer_view_of
from myelin.runtime.deadline import Deadline
from myelin.runtime.host_transfer import HostRead, read_to_host
from myelin.runtime.sinks import converted
from myelin.runtime.waiting import FenceWait

# Most submissions of one session in flight at once: enough to keep a GPU fed many calls ahead
# (a call costs the host ~10 us to submit), few enough that a runaway loop cannot queue up the
# device's memory in results nobody reads.
MAX_IN_FLIGHT = 64

_NOT_YET = object()


class PendingCall:
    """One submitted call. `result()` waits for it and returns what `call` with the same
    `output` would have: DeviceTensors for submit's default `output="device"`, numpy arrays for
    `output="numpy"`; `done()` says whether the device has finished. Read a result before
    passing it to another call: a pending call's results are not handed out before they are
    written."""

    __slots__ = (
        "_ahead",
        "_call",
        "_error",
        "_keep",
        "_lock",
        "_results",
        "_signal",
        "_sink",
        "_value",
        "name",
    )

    def __init__(
        self,
        call: Any,
        sink: Any,
        signal: rt.HalFence | None,
        results: Any,
        keep: tuple[Any, ...],
    ) -> None:
        self.name = call.name
        self._call = call  # the ResolvedCall
        self._sink = sink  # converts the results (myelin.runtime.sinks)
        self._signal = signal  # None: already complete (its results are in `_results`)
        self._results = results
        self._keep = keep  # arguments and inputs the device reads until the signal
        self._value: Any = _NOT_YET
        self._ahead: list[Any] | None = None  # `ahead`'s DeviceTensors
        self._error: MyelinError | None = None
        # Two threads may read one result (the caller and a closing session): one converts.
        self._lock = threading.Lock()

    @classmethod
    def completed(cls, call: Any, value: Any) -> PendingCall:
        """A call that ran to completion when it was submitted (an entrypoint that cannot be
        submitted asynchronously: see `ResolvedCall.submit`)."""
        pending = cls(call, None, None, None, ())
        pending._value = value
        return pending

    def done(self) -> bool:
        """Whether the results are ready (or the call failed): `result()` will not wait."""
        if self._value is not _NOT_YET or self._error is not None or self._signal is None:
            return True
        try:
            return bool(self._signal.wait(timeout=0))
        except Exception:  # failed on the device: result() raises it
            return True

    def result(self, timeout: float | None = None) -> Any:
        """The call's results (one value, or a tuple), once the device has written them.
        `timeout` (seconds): raise DeadlineExceeded if they are not ready by then; the call
        stays pending and `result()` can be asked again."""
        if self._value is _NOT_YET and self._error is None:
            self._wait(timeout)
            self._finish()
        if self._error is not None:
            raise self._error
        return self._value

    def ahead(self, index: int) -> Any:
        """Result `index` (a DeviceTensor) now, before the device has written it, to pass as
        an input to a later call or submission of the same session: the device runs them
        after this one, in the order they were submitted (the module's docstring), so it reads
        the result written. Read it on the host only through `read` or `result()`."""
        if self._value is not _NOT_YET or self._error is not None or self._signal is None:
            value = self.result()
            return value[index] if isinstance(value, tuple) else value
        if self._ahead is None:
            self._ahead = converted(self._call, self._results, False)
        return self._ahead[index]

    def read(self, index: int) -> Any:
        """Start reading result `index` to the host; the returned read's `result()` gives it
        as a numpy array. On a CUDA submission that waits for nothing the copy is queued now,
        right behind the call, so the host can submit more work before it waits: a generator
        reads step n's tokens while the device runs step n + 1. Elsewhere the read waits for
        this call first. Call `result()` on this PendingCall before the read's, so that a
        timeout or a failed call is reported as a call's are."""
        call = self._call
        if self._value is _NOT_YET and self._signal is not None and call._unchained:
            view = self._results.get_as_object(index, rt.HalBufferView)
            return HostRead(call._device, view, call._out_dtypes[index], call._staging)
        return _ReadAfterCall(self, index)

    def _wait(self, timeout: float | None) -> None:
        """Wait as the session's calls do (FenceWait: polling first under `spin_us`), in
        blocking slices checking a Deadline, until `timeout`."""
        signal = self._signal
        if signal is None:  # another thread read it meanwhile
            return
        deadline = Deadline.for_result(self.name, timeout)
        try:
            FenceWait(self._call._session.spin_s).wait(signal, deadline.slice_s, deadline.check)
        except DeadlineExceeded:
            raise
        except Exception as e:  # the device failed it: the results never come
            with self._lock:
                if self._error is None and self._value is _NOT_YET:
                    self._error = self._call._device_failure(e)
                    self._release()

    def _finish(self) -> None:
        """Convert the results once the device is done, and let go of what it read."""
        with self._lock:
            if self._error is not None or self._value is not _NOT_YET:
                return
            try:
                outs = self._sink.deliver(self._results, None, None)
                self._value = outs[0] if len(outs) == 1 else tuple(outs)
            finally:
                self._release()

    def _release(self) -> None:
        self._signal = None
        self._results = None
        self._ahead = None
        self._keep = ()

    def _settle(self) -> None:
        """Wait for the device without raising (a closing session): the results stay readable."""
        with contextlib.suppress(MyelinError):
            self.result()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<PendingCall {self.name}: {state}>"


class _ReadAfterCall:
    """`PendingCall.read` where no copy can be queued behind the call: waits for the call,
    then reads the result (mapped where the host can map it, else through a staging copy)."""

    __slots__ = ("_index", "_pending", "_value")

    def __init__(self, pending: PendingCall, index: int) -> None:
        self._pending, self._index = pending, index
        self._value: np.ndarray | None = None

    def result(self) -> np.ndarray:
        if self._value is None:
            value = self._pending.result()
            value = value[self._index] if isinstance(value, tuple) else value
            if isinstance(value, np.ndarray):
                self._value = value
            else:
                call = self._pending._call
                dtype = call._out_dtypes[self._index]
                self._value = read_to_host(
                    call._device, buffer_view_of(value), dtype, call._staging
                )
        return self._value


class InFlight:
    """The submissions of one session that may still run on the device, oldest first."""

    def __init__(self) -> None:
        self._calls: deque[PendingCall] = deque()

    def add(self, pending: PendingCall) -> None:
        self._calls.append(pending)

    def make_room(self) -> None:
        """Forget the submissions that are done; past `MAX_IN_FLIGHT`, wait for the oldest."""
        calls = self._calls
        while calls and calls[0].done():  # its PendingCall keeps the results for the caller
            calls.popleft()
        while len(calls) >= MAX_IN_FLIGHT:
            calls.popleft()._settle()

    def settle(self) -> None:
        """Wait for every submission (a closing session)."""
        while self._calls:
            self._calls.popleft()._settle()

    def __len__(self) -> int:
        return len(self._calls)
