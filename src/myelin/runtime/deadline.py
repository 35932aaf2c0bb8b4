"""When a waiting call must stop: its timeout ran out, or its session was cancelled.

One type for every wait of the runtime: a call waiting for its session, for memory budget
(myelin.runtime.admission) or for its fence (myelin.runtime.waiting), and `PendingCall.result`.
Each blocks in slices of at most CHECK_INTERVAL_S and checks its Deadline between them, so a
cancel or a timeout is seen within that interval wherever the call waits.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

from myelin.errors import Cancelled, DeadlineExceeded

# How often a waiting call looks at its cancel flag and deadline: the cancellation latency.
CHECK_INTERVAL_S = 0.02

# What a timeout that ran out says, by what waited: {name}, {timeout}, {where}.
_CALL_LATE = (
    "{name}: its timeout of {timeout:g} s ran out {where}; "
    "give it a longer timeout or smaller inputs"
)
_RESULT_LATE = (
    "{name}: the submitted call was not done within {timeout:g} s "
    "(it is still pending: ask result() again)"
)


class Deadline:
    """One wait's stop conditions: `timeout` seconds from now, and, with `session`,
    `Session.cancel()`. `check()` raises when the waiter must stop, `slice_s()` is the longest
    it may block now; `where` names the call's current step, for the message."""

    __slots__ = ("_late", "at", "generation", "name", "session", "timeout", "where")

    def __init__(
        self, name: str, timeout: float | None, session: Any = None, late: str = _CALL_LATE
    ) -> None:
        # `not timeout >= 0` also refuses NaN, whose deadline would never run out.
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(f"{name}: timeout must be a number of seconds >= 0, got {timeout!r}")
        self.name = name
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout
        # Session.cancel() bumps the session's generation; a call stops when it changed.
        self.session = session
        self.generation = session._generation if session is not None else 0
        self.where = "before it started"
        self._late = late

    @classmethod
    def for_result(cls, name: str, timeout: float | None) -> Deadline:
        """`PendingCall.result(timeout)`'s: the timeout only (the call stays pending)."""
        return cls(name, timeout, late=_RESULT_LATE)

    def check(self) -> None:
        session = self.session
        if session is not None and session._generation != self.generation:
            raise Cancelled(
                f"{self.name}: cancelled by Session.cancel() {self.where}; "
                "the session is still usable"
            )
        if self.at is not None and time.monotonic() >= self.at:
            raise DeadlineExceeded(
                self._late.format(name=self.name, timeout=self.timeout, where=self.where)
            )

    def slice_s(self) -> float:
        if self.at is None:
            return CHECK_INTERVAL_S
        return max(0.0, min(CHECK_INTERVAL_S, self.at - time.monotonic()))
