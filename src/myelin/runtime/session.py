"""Sessions and calls: one IREE VM context per session, holding every shard module of the variant.

Concurrency contract:
- Different sessions (of one model or of several) run calls concurrently from different threads.
  IREE releases the GIL while it invokes and while we wait on its fences, and no lock of ours is
  held across sessions while a call runs: the admission budget and the residency counter take
  their locks only to count.
- Calls on one session are serialized by the session's lock (IREE does not document a VM context
  as thread-safe). A second thread calling a busy session waits its turn; its timeout and
  `Session.cancel()` still apply while it waits.
- A submitted call (`submit`) holds the lock only while it is handed to the device; its
  results are read without it, from any thread (myelin.runtime.pending).

Cancellation contract (cooperative; nothing is interrupted inside IREE):
- `Session.cancel()` cancels every call of the session that has started and not yet returned;
  calls made afterwards run normally. `call(..., timeout=s)` gives one call a deadline.
- A call checks at each boundary: before it waits for the session, while it waits for the
  session or for memory budget, before it dispatches, and, for entrypoints compiled with the
  async (coarse-fences) ABI, every 20 ms while the device runs. A synchronous entrypoint cannot
  be interrupted once dispatched: a cancel or deadline that arrives meanwhile is raised when the
  invocation returns, and its results are dropped.
- A stopped call raises `Cancelled` (`DeadlineExceeded` for a timeout). Work already submitted
  to the device finishes in the background (IREE cannot abort a submitted command buffer); the
  session's next call is queue-ordered after it, and its memory reservation is released when it
  completes. The session stays usable.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Literal, get_args

import iree.runtime as rt
import numpy as np

from myelin.dtypes import numpy_dtype
from myelin.errors import Cancelled, MyelinError
from myelin.runtime._iree_private import (
    InvokeContext,
    accepted_element_types,
    argument_packer,
    buffer_view_of,
    device_of,
)
from myelin.runtime.admission import Reservation
from myelin.runtime.deadline import CHECK_INTERVAL_S, Deadline
from myelin.runtime.host_transfer import StagingBuffers
from myelin.runtime.pending import InFlight, PendingCall
from myelin.runtime.result_storage import KDL_CPU, KDL_CUDA
from myelin.runtime.sinks import Bound, CallerStorage, IreeResults, OwnStorage, StorageTwin
from myelin.runtime.tensors import (
    NO_STORAGE_TWIN,
    DeviceTensor,
    as_host_array,
    check_dim_limits,
    check_index_ranges,
    check_inputs,
    dim_limits,
    index_checks,
    output_arguments,
    shared_dims,
    with_output_arguments,
)
from myelin.runtime.waiting import FenceWait
from myelin.signature import STORAGE_TWIN_SUFFIX

# "numpy": host arrays. "device": results stay on their device, in memory IREE allocates (the
# fastest way to chain calls). "dlpack": the same, but in memory MyeLiN allocates where the
# entrypoint has a storage twin, which exports DLPack on a GPU (`torch.from_dlpack(y)`, no
# copy); it costs an allocation and an import per result and call (docs/runtime.md).
OutputKind = Literal["numpy", "device", "dlpack"]
OUTPUT_KINDS: tuple[str, ...] = get_args(OutputKind)

# Looked up once: per-call attribute lookups add up on a call that costs tens of microseconds.
_DEVICE_ARRAY = rt.DeviceArray
_NDARRAY = np.ndarray
_VARIANT_LIST = rt.VmVariantList
_CREATE_FENCE = rt.HalFence.create_at
_NO_WAIT = rt.HalFence  # HalFence(1): a fence with no timepoints, met from the start
# What a synchronous invocation returns as its signal: it is done when the invocation returns.
_MET = rt.HalFence(1)

# Drivers whose results MyeLiN can put in memory of its own (DLPack device type of that memory).
_STORAGE_DRIVERS = {"cuda": KDL_CUDA, "local-task": KDL_CPU, "local-sync": KDL_CPU}
# Most (input, array) pairs a resolved call remembers as checked; past it the memory starts over.
_PASSED_ENTRIES = 256


class CallError(MyelinError):
    """IREE failed while running a call whose inputs passed validation."""


class SessionClosed(MyelinError):
    """A call on a session after `Session.close()` or `Model.close()`: its VM context is gone."""


class Session:
    def __init__(self, model: Any, *, spin_us: float = 0.0) -> None:
        self.model = model
        # Async calls block on their fence (0), or block and then poll it for up to this long
        # around the time the previous call took (myelin.runtime.waiting).
        if not (isinstance(spin_us, (int, float)) and 0 <= spin_us <= 1e6):
            raise ValueError(
                f"spin_us must be microseconds in [0, 1000000] (0: block), got {spin_us!r}"
            )
        self.spin_s = spin_us / 1e6
        self._lock = threading.Lock()  # serializes this session's calls
        self._generation = 0  # bumped by cancel(); a call remembers the value it started with
        devices, modules = model._context_modules()
        self._device = devices[0]
        try:
            self._context = rt.VmContext(model._vm_instance, modules=modules)
        except Exception as e:
            raise CallError(
                f"{model.path.name}: cannot create a VM context for variant "
                f"'{model.variant_name}': {str(e).splitlines()[0]}"
            ) from e
        self._modules = modules
        self._resolved: dict[str, ResolvedCall] = {}
        self._closed = False
        # Async (coarse-fences) calls chain on a timeline per device: call k waits for value k
        # and signals k + 1, so a call abandoned by cancel still orders the next one after it.
        self._timelines: dict[int, list[Any]] = {}  # id(device) -> [semaphore, value]
        # CUDA submissions (`submit`) signal values of a timeline of their own and wait for
        # nothing (myelin.runtime.pending says why); the calls still in flight.
        self._submissions: dict[int, list[Any]] = {}
        self._in_flight = InFlight()

    def resolve(self, name: str) -> ResolvedCall:
        """A reusable handle for one entrypoint (looks the function up once)."""
        if self._closed:
            raise self._closed_error(name)
        resolved = self._resolved.get(name)
        if resolved is None:
            resolved = ResolvedCall(self, name)
            self._resolved[name] = resolved
        return resolved

    def call(
        self,
        name: str,
        *inputs: Any,
        output: OutputKind = "numpy",
        timeout: float | None = None,
        out: Any = None,
    ) -> Any:
        """Run entrypoint `name`. Returns one value, or a tuple for several results.

        `timeout` (seconds) bounds the whole call, waiting for the session and for memory
        included; when it runs out the call raises DeadlineExceeded (see the module docstring
        for where a call can stop).

        `out` (one tensor, or a tuple) is storage for results the entrypoint writes into a
        caller's buffer: arguments its source marks `{iree.abi.output = N : index}`. The call
        returns those objects themselves, written; on a GPU this skips the result allocation.
        """
        return self.resolve(name)(*inputs, output=output, timeout=timeout, out=out)

    def submit(
        self, name: str, *inputs: Any, output: Literal["device", "numpy"] = "device"
    ) -> PendingCall:
        """Start entrypoint `name` on the device and return at once; `result()` on the returned
        PendingCall waits for its results (ResolvedCall.submit)."""
        return self.resolve(name).submit(*inputs, output=output)

    def _closed_error(self, name: str) -> SessionClosed:
        return SessionClosed(
            f"{name}: the session is closed (by Session.close() or Model.close()); "
            "open a new one with model.session()"
        )

    def cancel(self) -> None:
        """Cancel the calls of this session that have started and not returned (any thread)."""
        # Unlocked on purpose: a call only compares the value with the one it started with, and
        # two racing cancels that lose an increment still change it.
        self._generation += 1

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._in_flight.settle()  # the device still reads their arguments
            held = [
                (*r._transients.let_go(), r._transients.device)
                for r in self._resolved.values()
                if r._transients is not None
            ]
            self._resolved.clear()
            self._context = None
            self._modules = []
        for buffer, reservation, device in held:
            if reservation is not None:
                self._release_after_last_call(device, reservation, buffer)
        self.model._forget(self)

    def _release_after_last_call(
        self, device: rt.HalDevice, reservation: Reservation, buffer: Any
    ) -> None:
        """Give back a held buffer's bytes once the last call this session submitted to the
        device is done with it (a cancelled call's work may still run)."""
        timeline = self._timelines.get(id(device))
        if timeline is None or timeline[0].query() >= timeline[1]:
            reservation.release()
        else:
            last = rt.HalFence.create_at(timeline[0], timeline[1])
            _release_when_done(last, reservation, (buffer,))

    def _fences(self, device: rt.HalDevice) -> tuple[rt.HalFence, rt.HalFence]:
        timeline = self._timelines.get(id(device))
        if timeline is None:
            timeline = self._timelines[id(device)] = [device.create_semaphore(0), 0]
        semaphore, value = timeline
        timeline[1] = value + 1
        return _CREATE_FENCE(semaphore, value), _CREATE_FENCE(semaphore, value + 1)

    def _submission_fences(
        self, device: rt.HalDevice, unchained: bool
    ) -> tuple[rt.HalFence, rt.HalFence]:
        """A submission's fences: unchained (CUDA, one queue execution) nothing to wait for and
        the next value of the submission timeline; else the call timeline's, as a call's."""
        if not unchained:
            return self._fences(device)
        timeline = self._submissions.get(id(device))
        if timeline is None:
            timeline = self._submissions[id(device)] = [device.create_semaphore(0), 0]
        timeline[1] += 1
        return _NO_WAIT(1), _CREATE_FENCE(timeline[0], timeline[1])

    def _drop_timeline(self, device: rt.HalDevice) -> None:
        """After a failed submission (its signal value will never come, or the semaphore has
        failed for good), start the device's timelines afresh."""
        self._timelines.pop(id(device), None)
        self._submissions.pop(id(device), None)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ResolvedCall:
    """One entrypoint bound to a session: validated inputs in, numpy (or device arrays) out."""

    def __init__(self, session: Session, name: str) -> None:
        entry = session.model.entrypoint(name)
        module = next(m for m in session._modules if getattr(m, "name", None) == entry.module)
        model = session.model
        self.name = entry.name
        self.signature = entry.signature
        self._entry = entry
        self._session = session
        self._function = module.lookup_function(entry.function)
        self._async = self._function.reflection.get("iree.abi.model") == "coarse-fences"
        self._wait = FenceWait(session.spin_s)  # how an async call waits for its fence
        self._packer = argument_packer()
        self._out_dtypes = [
            numpy_dtype(t.dtype) if not t.is_scalar else None for t in self.signature.outputs
        ]
        self._memory = entry.memory
        self._parameters = entry.memory.parameters or None
        # Arguments that are result storage ({iree.abi.output = N}): (argument, result) pairs.
        self._output_args = output_arguments(self._function.reflection.get("iree.abi.declaration"))
        # The device the entrypoint runs on: its arguments are uploaded there, results live there.
        self._device = model.hal_device(entry.device) if entry.device else session._device
        registry = getattr(model, "registry", None)
        # CUDA DLPack tensors are imported in place only onto a CUDA device.
        driver = registry.driver_of(self._device) if registry is not None else None
        on_cuda = driver == "cuda"
        self._cuda = self._device if on_cuda else None
        # Staging buffers for reading results to numpy, kept for the next call's same sizes.
        self._staging = StagingBuffers(self._device)

        # Binding (step 3). Per input: (position, dtype, rank, ((axis, size), ...) of static
        # dims, HAL element type) for the fast check; None for scalars. The full check
        # (check_inputs) converts what the fast one refuses, and words the error.
        self._expected = [
            None
            if t.is_scalar
            else (
                i,
                numpy_dtype(t.dtype),
                len(t.shape or ()),
                tuple((a, d) for a, d in enumerate(t.shape or ()) if d is not None),
                # HAL element types taken; None: no element type, the full check
                accepted_element_types(numpy_dtype(t.dtype)),
            )
            for i, t in enumerate(self.signature.inputs)
        ]
        # Dynamic dims that share a name, as ((input, axis), ...) groups, for the fast check.
        self._equal_dims = [members for _, members in shared_dims(self.signature.inputs)]
        # Integer inputs that index a table, with the [lo, hi) the build found (IREE reads out
        # of bounds, or faults, on any other value).
        self._index_checks = index_checks(self.signature.inputs)
        # Dynamic dims past whose largest size the graph would read outside a table.
        self._dim_limits = dim_limits(self.signature.inputs)
        # Device arrays that passed the fast check, by (input, id), with their shape: a serving
        # loop passes the same weights every call, and a buffer view's element type and shape
        # never change. Only a weak reference: the memory holds no buffer alive, and it tells a
        # live array from a new one that reuses a dead one's id.
        self._passed: dict[tuple[int, int], tuple[weakref.ref, Any]] = {}

        # Result sinks (step 2), made once. The storage twin (`f$into`, built next to `f`):
        # results written into memory MyeLiN allocates, which exports DLPack, or into the
        # caller's `out=`. None: an older build, or results it cannot take storage for
        # (myelin.compiler.result_storage).
        twin_function = module.lookup_function(entry.function + STORAGE_TWIN_SUFFIX)
        storage_kind = _STORAGE_DRIVERS.get(driver or "") if twin_function is not None else None
        twin = (
            StorageTwin(
                self,
                module,
                twin_function,
                storage_kind,
                # With cuda_allocator="caching", result storage reuses dropped results' memory.
                reuse=bool(getattr(registry, "caches_cuda_memory", False)),
            )
            if storage_kind is not None
            else None
        )
        self._twin = twin
        self._transients = twin.transients if twin is not None else None
        self._sinks = {
            "numpy": IreeResults(self, to_host=True),
            "device": IreeResults(self, to_host=False),
            "dlpack": OwnStorage(self, twin)
            if twin is not None
            else IreeResults(self, to_host=False, not_exported=NO_STORAGE_TWIN),
        }
        # out= through the entrypoint's own output arguments, else through its twin.
        out_twin = twin if not self._output_args and twin is not None and twin.pairs else None
        into_caller = CallerStorage(self, out_twin, to_host=False)
        self._caller_sinks = {
            "numpy": CallerStorage(self, out_twin, to_host=True),
            "device": into_caller,
            "dlpack": into_caller,
        }

        # The guard (step 5): the memory budget and the weights' residency, which the model
        # fixes at load. A plain entrypoint (`_plain`) has neither: nothing to guard.
        self._budget = model.budget
        self._residency = model.residency if model.residency.policy != "resident" else None
        self._plain = self._budget is None and self._residency is None

        # A CUDA submission waits for nothing where the call is one queue execution, whose own
        # waits IREE meets on the host before the invocation returns; with more, or where the
        # build did not record it, it chains as a call does (myelin.runtime.pending).
        schedule = entry.record.memory.schedule if entry.record.memory else None
        self._unchained = on_cuda and schedule is not None and schedule.executes <= 1

    def __call__(
        self,
        *inputs: Any,
        output: OutputKind = "numpy",
        timeout: float | None = None,
        out: Any = None,
    ) -> Any:
        """Run the entrypoint; one value, or a tuple for several results (`Session.call` says
        what `output`, `timeout` and `out` do). Every call takes these steps, each once;
        `submit` takes the same ones up to the wait:

        1. Sink: where the results go, picked by `output` and `out=` from the sinks made at
           resolve (`_sinks`, `_caller_sinks`): IREE's results as numpy or device arrays,
           storage MyeLiN allocates (`"dlpack"`), or the caller's `out=` (myelin.runtime.sinks).
        2. Deadline: the call's timeout and `Session.cancel()`, checked at every step below
           and every CHECK_INTERVAL_S while it waits (myelin.runtime.deadline).
        3. Bind (`_checked_arguments`; `_bind` with `out=`): the inputs checked against the
           signature (the fast check, else the full one), dim limits and index ranges
           checked, `out=` spliced in.
        4. Turn (`_take_turn`): the session's lock, waited for within the deadline.
        5. Guard (`_guard`): the call's memory reserved under the budget and the weights made
           resident while it runs; nothing for a plain entrypoint (`_plain`: `_call_plain`).
        6. Start (`_start`): invoke what the sink asks for; an async entrypoint returns the
           fence the device signals, a synchronous one an already-met fence.
        7. Wait (`_wait_for`) for the fence, in slices, checking the deadline.
        8. Deliver: the sink turns IREE's results into what the caller asked for.
        """
        sink = (self._sinks if out is None else self._caller_sinks).get(output)
        if sink is None:
            raise self._unknown_output(output)
        deadline = Deadline(self.name, timeout, self._session)
        bound = self._checked_arguments(inputs) if out is None else self._bind(inputs, out)
        try:
            if self._plain:
                outs = self._call_plain(bound, sink, deadline)
            else:
                outs = self._call_guarded(bound, sink, deadline)
        except Cancelled as e:
            # Its traceback's frames hold the abandoned call's buffers; freed after their
            # device (in a later garbage collection), those crash IREE. Drop them here.
            raise e.with_traceback(None) from None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def submit(self, *inputs: Any, output: Literal["device", "numpy"] = "device") -> PendingCall:
        """Hand the call to the device and return without waiting for it: the returned
        PendingCall's `result()` waits and gives what `__call__` would have. A loop of
        submissions keeps a GPU busy while the host prepares the next (myelin.runtime.pending).

        Inputs are checked here, as a call checks them. An entrypoint that cannot run this way
        (a synchronous one, built without `[runtime] cancellable`; or a model with a memory
        budget or non-resident weights, whose calls hold memory only while they run) runs to
        completion here and returns a PendingCall that is already done."""
        if output not in ("device", "numpy"):
            raise ValueError(
                f"{self.name}: submit takes output 'device' or 'numpy', got {output!r}"
            )
        if not (self._async and self._plain):
            return PendingCall.completed(self, self(*inputs, output=output))
        sink = self._sinks[output]
        deadline = Deadline(self.name, None, self._session)
        bound = self._checked_arguments(inputs)
        lock = self._take_turn(deadline)
        try:
            in_flight = self._session._in_flight
            in_flight.make_room()
            signal, args, results, _ = self._start(bound, sink, deadline, None, self._unchained)
            pending = PendingCall(self, sink, signal, results, (args, bound.values))
            in_flight.add(pending)
        finally:
            lock.release()
        return pending

    def _unknown_output(self, output: Any) -> ValueError:
        return ValueError(
            f"{self.name}: output must be one of {', '.join(map(repr, OUTPUT_KINDS))}, "
            f"got {output!r}"
        )

    # -- 3. binding ----------------------------------------------------------------------------

    def _bind(self, inputs: tuple[Any, ...], out: Any) -> Bound:
        """The call's arguments with `out=`: checked, and the `out=` tensors in the place the
        entrypoint (or, when its source takes no result storage, its twin) takes storage."""
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        twin = self._caller_sinks["device"].twin
        if twin is None:  # the entrypoint's own {iree.abi.output} arguments (or an error)
            inputs = with_output_arguments(self.name, inputs, outs, self._output_args)
            bound = self._checked_arguments(inputs)
        else:
            bound = self._checked_arguments(inputs)
            views = twin.caller_views(outs)
            bound.ready = with_output_arguments(self.name, tuple(bound.ready), views, twin.pairs)
        bound.outs = outs
        return bound

    def _checked_arguments(self, inputs: tuple[Any, ...]) -> Bound:
        """The inputs checked against the signature (step 3 without `out=`), as the caller's
        values (their shapes key what a shape decides) and as IREE's packer takes them;
        InputError names what is wrong."""
        ready = self._fast_arguments(inputs)  # numpy or device arrays of the right kind
        if ready is not None:
            values: Any = inputs
        else:
            specs = self.signature.inputs
            values = [
                as_host_array(v, s, self.name, self._cuda)
                for v, s in zip(inputs, specs, strict=False)
            ]
            values.extend(inputs[len(specs) :])
            check_inputs(self.name, specs, values)
            model = self._session.model
            if hasattr(model, "registry"):  # device arrays of another device move HAL-side
                values = model.registry.onto(values, self._device)
            # IREE's packer takes a DeviceArray subclass for a numpy-like object and copies it
            # through the host; its buffer view is what it passes without a copy.
            ready = [buffer_view_of(v) if isinstance(v, DeviceTensor) else v for v in values]
        if self._dim_limits:
            check_dim_limits(self.name, self.signature.inputs, self._dim_limits, values)
        if self._index_checks:
            check_index_ranges(self.name, self._index_checks, values)
        return Bound(values, ready)

    def _fast_arguments(self, values: tuple[Any, ...]) -> list[Any] | None:
        """The fast check: numpy arrays, or device arrays already on this entrypoint's device,
        of the right dtype, rank and static dims. Returns the arguments ready for IREE's packer
        (a device array's buffer view in its place, read once here), or None: anything else (and
        anything wrong) takes the full check, which converts what it can and words the error."""
        if len(values) != len(self._expected):
            return None
        shapes: list[Any] = []
        ready: list[Any] = []
        passed = self._passed
        for expected, value in zip(self._expected, values, strict=True):
            if expected is None:
                shapes.append(None)
                ready.append(value)
                continue
            kind = type(value)
            if kind is DeviceTensor or kind is _DEVICE_ARRAY:
                seen = passed.get((expected[0], id(value)))
                if seen is not None and seen[0]() is value:  # this very array passed before
                    ready.append(buffer_view_of(value))
                    shapes.append(seen[1])
                    continue
            i, dtype, rank, static, hal = expected
            if kind is _NDARRAY:
                if value.dtype != dtype or value.ndim != rank:
                    return None
                shape = value.shape
                ready.append(value)
            elif kind is DeviceTensor or kind is _DEVICE_ARRAY:
                # A device array's check reads its buffer view: dtype and shape through
                # DeviceArray cost microseconds each, which a 14-input call pays 14 times.
                if device_of(value) is not self._device:
                    return None
                view = buffer_view_of(value)
                if hal is None or view.element_type not in hal:
                    return None
                shape = view.shape
                if len(shape) != rank:
                    return None
            else:
                return None
            for axis, size in static:
                if shape[axis] != size:
                    return None
            if kind is not _NDARRAY:
                if len(passed) >= _PASSED_ENTRIES:
                    passed.clear()
                passed[(i, id(value))] = (weakref.ref(value), shape)
                ready.append(view)
            shapes.append(shape)
        for (i, axis), *others in self._equal_dims:
            size = shapes[i][axis]
            if any(shapes[j][b] != size for j, b in others):
                return None
        return ready

    # -- 4-8. the session's turn, the guard, start, wait, deliver -------------------------------

    def _call_plain(self, bound: Bound, sink: Any, deadline: Deadline) -> list[Any]:
        """Steps 4 and 6-8, for an entrypoint with nothing to guard (`_plain`: no memory budget,
        resident weights). Why the guard is skipped, not run empty: on a GPU a one-kernel
        call's time above the kernel is IREE's submission and completion plus this Python,
        which a serving loop pays every call."""
        lock = self._take_turn(deadline)
        try:
            signal, args, results, state = self._start(bound, sink, deadline, None, False)
            if signal is not _MET:
                self._wait_for(signal, args, results, deadline, None)
            return sink.deliver(results, bound, state)
        finally:
            lock.release()

    def _call_guarded(self, bound: Bound, sink: Any, deadline: Deadline) -> list[Any]:
        """Steps 4-8: the call holds its memory reservation and its weights' residency from
        before it starts until the device is done with it (a call abandoned by cancel hands its
        reservation to the device's waiter: `_wait_for`)."""
        need = self._memory.need(self.name, bound.values) if self._budget is not None else None
        deadline.check()
        lock = self._take_turn(deadline)
        try:
            reservation = self._guard(need, deadline)
            try:
                signal, args, results, state = self._start(
                    bound, sink, deadline, reservation, False
                )
                if signal is not _MET:
                    self._wait_for(signal, args, results, deadline, reservation)
                return sink.deliver(results, bound, state)
            finally:
                if self._residency is not None:
                    self._residency.after_call()
                if reservation is not None and not reservation.held_by_device:
                    reservation.release()
        finally:
            lock.release()

    def _take_turn(self, deadline: Deadline) -> threading.Lock:
        """Step 4: the session's lock (its calls are serialized), waited for within the
        deadline; the caller releases it."""
        session = self._session
        lock = session._lock
        if not lock.acquire(blocking=False):
            deadline.where = "while waiting for the session"
            deadline.check()
            while not lock.acquire(timeout=deadline.slice_s() or CHECK_INTERVAL_S):
                deadline.check()
        if session._closed:
            lock.release()
            raise session._closed_error(self.name)
        return lock

    def _guard(self, need: Any, deadline: Deadline) -> Reservation | None:
        """Step 5: reserve the call's memory under the budget (waiting for other calls within
        the deadline), then count the call as using its weights (myelin.runtime.residency)."""
        reservation = None
        if need is not None:
            deadline.where = "while waiting for memory budget"
            reservation = self._budget.reserve(need, self.name, deadline)
        if self._residency is not None:
            try:
                self._residency.before_call(self._parameters)
            except BaseException:
                if reservation is not None:
                    reservation.release()
                raise
        return reservation

    def _start(
        self,
        bound: Bound,
        sink: Any,
        deadline: Deadline,
        reservation: Reservation | None,
        unchained: bool,
    ) -> tuple[rt.HalFence, rt.VmVariantList, rt.VmVariantList, Any]:
        """Step 6: invoke what the sink asks for. Returns the fence the device signals when it
        is done (a synchronous entrypoint's: `_MET`), the packed arguments and the results (the
        device uses both until then) and what the sink's `deliver` needs of this call. An async
        call's fences are a call's or, `unchained`, a submission's (Session._submission_fences).
        """
        function, arguments, transients, state = sink.invocation(bound, deadline, reservation)
        deadline.where = "before it was dispatched"
        deadline.check()
        args = self._packer.pack(InvokeContext(self._device), arguments, {})
        if transients is not None:  # a HAL buffer, which the packer does not take
            args.push_ref(transients)
        results = _VARIANT_LIST(len(self._out_dtypes))
        if not self._async:  # done when it returns: a cancel or timeout meanwhile drops it
            self._invoke(args, results, function)
            deadline.where = "while it ran (a synchronous entrypoint stops once it returns)"
            deadline.check()
            return _MET, args, results, state
        session = self._session
        wait, signal = session._submission_fences(self._device, unchained)
        args.push_ref(wait)
        args.push_ref(signal)
        try:
            self._invoke(args, results, function)
        except CallError:
            session._drop_timeline(self._device)
            raise
        return signal, args, results, state

    def _wait_for(
        self,
        signal: rt.HalFence,
        args: rt.VmVariantList,
        results: rt.VmVariantList,
        deadline: Deadline,
        reservation: Reservation | None,
    ) -> None:
        """Step 7: wait for the signal fence in slices, checking the deadline (the caller skips
        a met fence: a synchronous call is done). A stopped call hands its memory reservation
        to a background waiter: the device still uses that memory."""
        deadline.where = "while the device ran it"
        try:
            self._wait.wait(signal, deadline.slice_s, deadline.check)
        except Cancelled:
            if reservation is not None:
                reservation.held_by_device = True
            # The device still reads the arguments and parameters and writes the results:
            # keep them, the context and the model's mapping alive until it is done.
            session = self._session
            keep = (args, results, session._context, session._modules, session.model)
            _release_when_done(signal, reservation, keep)
            del args, results, keep  # the waiter alone owns them now
            raise
        except Exception as e:  # a failed device submission fails the timeline for good
            raise self._device_failure(e) from e

    def _invoke(self, args: rt.VmVariantList, results: rt.VmVariantList, function: Any) -> None:
        try:
            self._session._context.invoke(function, args, results)
        except Exception as e:
            raise CallError(f"{self.name}: call failed in IREE: {_first_line(e)}") from e

    def _device_failure(self, error: BaseException) -> CallError:
        """A call the device failed: its timeline is failed for good; start afresh."""
        self._session._drop_timeline(self._device)
        return CallError(f"{self.name}: call failed on the device: {_first_line(error)}")

    def storage_shapes(self, values: Any) -> tuple[tuple[int, ...], ...] | None:
        """The shapes `output="dlpack"` allocates result storage with for these inputs: the
        signature's, when every result dim is static; else the shapes the last call with the
        same input shapes returned (None until such a call ran, or without a storage twin)."""
        return self._twin.shapes(values) if self._twin is not None else None


def _release_when_done(
    signal: rt.HalFence, reservation: Reservation | None, keep: tuple[Any, ...]
) -> None:
    """An abandoned call's device work still holds its memory and reads its inputs: keep both
    alive (and counted against the budget) until the signal fence says it is done."""

    def wait() -> None:
        try:
            signal.wait()
        except Exception:  # the call failed on the device; its memory is gone either way
            pass
        finally:
            if reservation is not None:
                reservation.release()
            del keep_alive[:]

    keep_alive = list(keep)

    threading.Thread(target=wait, name="myelin-abandoned-call", daemon=True).start()


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
