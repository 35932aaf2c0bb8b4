"""Memory admission: know what a call will allocate before it runs, and refuse what cannot fit.

The need of a call is derived from the compiled module, not measured: at build time PLeX reads
each entrypoint's Stream IR (`myelin.compiler.stream_analysis`) and records its transient and
result bytes as a formula of the input dims. Here the runtime evaluates the formula for the
actual inputs, adds the bytes it uploads, and reserves the sum against the variant's budget.

Python and numpy only: it runs on devices that have only `iree-base-runtime` and numpy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from myelin.errors import ArtifactError, MemoryBudgetExceeded, MemoryNeedUnknown
from myelin.mln import MAX_COUNT, MemoryRecord, size_formula_json
from myelin.runtime.deadline import Deadline
from myelin.size_formulas import SizeExpr, compile_size


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class FootprintFormula:
    """An entrypoint's memory formulas (its MemoryRecord), compiled once so that every budgeted
    call only evaluates them."""

    transient: SizeExpr | None
    results: SizeExpr | None
    parameters: tuple[tuple[str, str], ...]
    unknown: str | None

    def __post_init__(self) -> None:
        compiled = None
        if self.unknown is None and self.transient is not None and self.results is not None:
            compiled = (compile_size(self.transient), compile_size(self.results))
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def from_record(cls, record: MemoryRecord | None) -> FootprintFormula:
        """The plan of an entrypoint's checked record (the reader validated every formula
        against the entrypoint's inputs); None: the build recorded none."""
        if record is None:
            return cls(
                None,
                None,
                (),
                "the artifact records no memory plan (built by an older PLeX); rebuild it",
            )
        return cls(
            transient=size_formula_json(record.transient),
            results=size_formula_json(record.results),
            parameters=record.parameters or (),
            unknown=record.unknown,
        )

    def need(self, entrypoint: str, values: Sequence[Any]) -> CallNeed:
        """What a call with these inputs needs: the bytes we upload (numpy inputs; device
        arrays are already there) plus its transient and result allocations."""
        compiled = self._compiled  # type: ignore[attr-defined]
        if compiled is None:
            raise MemoryNeedUnknown(
                f"{entrypoint}: its memory need is unknown ({self.unknown}); "
                "remove [runtime] memory or load with memory_budget=None to run it unbudgeted"
            )
        shapes = [getattr(v, "shape", None) for v in values]
        uploaded = sum(v.nbytes for v in values if type(v) is np.ndarray)
        transient = _bytes(entrypoint, "transient", compiled[0], shapes)
        results = _bytes(entrypoint, "result", compiled[1], shapes)
        return CallNeed(uploaded, transient, results)


def _bytes(entrypoint: str, what: str, formula: Callable, shapes: list) -> int:
    """A formula's bytes for these shapes, which a build never makes negative or beyond what an
    int64 holds: such a value would bypass the budget (negative) or sink it, so the artifact's
    plan is refused instead."""
    n = formula(shapes)
    if 0 <= n <= MAX_COUNT:
        return n
    problem = "is negative" if n < 0 else "exceeds 2^63 - 1"
    dims = ", ".join("scalar" if s is None else "x".join(map(str, s)) for s in shapes)
    raise ArtifactError(
        f"{entrypoint}: the artifact's memory plan gives {what} bytes that {problem} for inputs "
        f"{dims}; a build never records such a formula: the file is damaged or crafted, rebuild it"
    )


class CallNeed:
    """What one call needs, in bytes, before it runs (parameters are the variant's, counted
    once per loaded variant, not per call)."""

    __slots__ = ("inputs", "results", "total", "transient")

    def __init__(self, inputs: int, transient: int, results: int) -> None:
        self.inputs = inputs
        self.transient = transient
        self.results = results
        self.total = inputs + transient + results

    def __repr__(self) -> str:
        return f"CallNeed(inputs={self.inputs}, transient={self.transient}, results={self.results})"

    def describe(self) -> str:
        return (
            f"inputs {format_bytes(self.inputs)} + transient {format_bytes(self.transient)}"
            f" + results {format_bytes(self.results)}"
        )


class AdmissionBudget:
    """The bytes one loaded variant may use: its parameters plus every call in flight.

    A call whose need alone cannot fit is refused at once; one that fits once other calls finish
    waits for them (its deadline and cancellation still apply). The lock is held only to count,
    never while a call runs.
    """

    def __init__(self, limit: int, parameter_bytes: int, what: str) -> None:
        self.limit = limit
        self.parameter_bytes = parameter_bytes
        self.available = limit - parameter_bytes  # what calls in flight may hold together
        self._in_flight = 0
        self._waiting = 0
        self.peak_in_flight = 0  # the most bytes calls have held at once (for tests and tuning)
        self._cond = threading.Condition(threading.Lock())
        if parameter_bytes > limit:
            raise MemoryBudgetExceeded(
                f"{what}: its parameters need {format_bytes(parameter_bytes)} but the memory "
                f"budget is {format_bytes(limit)}; raise [runtime] memory or load with a larger "
                "memory_budget"
            )

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def reserve(self, need: CallNeed, what: str, deadline: Deadline) -> Reservation:
        """Take `need.total` bytes; while it waits for other calls to finish, `deadline.check()`
        raises when the caller is cancelled or out of time."""
        total = need.total
        if total > self.available:
            raise MemoryBudgetExceeded(
                f"{what}: needs {format_bytes(total)} ({need.describe()}) but the memory budget "
                f"leaves {format_bytes(self.available)} after "
                f"{format_bytes(self.parameter_bytes)} of parameters (budget "
                f"{format_bytes(self.limit)}); use smaller inputs or raise [runtime] memory"
            )
        with self._cond:
            if self._in_flight + total > self.available:
                self._waiting += 1
                try:
                    while self._in_flight + total > self.available:
                        deadline.check()
                        self._cond.wait(deadline.slice_s())
                finally:
                    self._waiting -= 1
            self._in_flight += total
            if self._in_flight > self.peak_in_flight:
                self.peak_in_flight = self._in_flight
        return Reservation(self, total, need.transient)

    def _release(self, reservation: Reservation) -> None:
        with self._cond:
            if reservation.released:
                return
            reservation.released = True
            self._in_flight -= reservation.need
            if self._waiting:
                self._cond.notify_all()

    def _give_back(self, reservation: Reservation, nbytes: int) -> None:
        with self._cond:
            if reservation.released or nbytes <= 0:
                return
            reservation.need -= nbytes
            self._in_flight -= nbytes
            if self._waiting:
                self._cond.notify_all()


class Reservation:
    """Bytes one call holds. `held_by_device` marks a call abandoned by cancel whose device
    work still runs: whoever waits for that work releases it."""

    __slots__ = ("budget", "held_by_device", "need", "released", "transient")

    def __init__(self, budget: AdmissionBudget, need: int, transient: int = 0) -> None:
        self.budget = budget
        self.need = need
        self.transient = transient  # the part of `need` that is the call's transient memory
        self.held_by_device = False
        self.released = False

    def release(self) -> None:
        self.budget._release(self)

    def give_back_transient(self) -> None:
        """The call's transients live in a buffer its session holds (and counts) between
        calls (myelin.runtime.transients): the call itself no longer needs those bytes."""
        nbytes, self.transient = self.transient, 0
        self.budget._give_back(self, nbytes)
