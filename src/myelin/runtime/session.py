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

import math
import numbers
import threading
import time
import weakref
from typing import Any, Literal, get_args

import iree.runtime as rt
import numpy as np

from myelin.dtypes import numpy_dtype
from myelin.errors import Cancelled, DeadlineExceeded, InputError, MyelinError
from myelin.runtime._iree_private import (
    InvokeContext,
    argument_packer,
    buffer_view_of,
    device_of,
    element_type_of,
    is_device_array,
)
from myelin.runtime.admission import CallNeed, Reservation
from myelin.runtime.host_transfer import read_to_host
from myelin.runtime.pending import InFlight, PendingCall
from myelin.runtime.result_storage import KDL_CPU, KDL_CUDA, Storage, dlpack_capsule
from myelin.runtime.tensors import (
    FIRST_CALL_OF_SHAPE,
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
    twin_arguments,
    twin_storage_view,
    with_output_arguments,
)
from myelin.runtime.transients import TransientMemory, takes_transients
from myelin.runtime.waiting import CHECK_INTERVAL_S, FenceWait
from myelin.signature import STORAGE_TWIN_SUFFIX

# "numpy": host arrays. "device": results stay on their device, in memory IREE allocates (the
# fastest way to chain calls). "dlpack": the same, but in memory MyeLiN allocates where the
# entrypoint has a storage twin, which exports DLPack on a GPU (`torch.from_dlpack(y)`, no
# copy); it costs an allocation and an import per result and call (docs/runtime.md).
OutputKind = Literal["numpy", "device", "dlpack"]
OUTPUT_KINDS: tuple[str, ...] = get_args(OutputKind)

# Looked up once: per-call attribute lookups add up on a call that costs tens of microseconds.
_BUFFER_VIEW = rt.HalBufferView
_DEVICE_ARRAY = rt.DeviceArray
_VARIANT_LIST = rt.VmVariantList
_CREATE_FENCE = rt.HalFence.create_at
_NO_WAIT = rt.HalFence  # HalFence(1): a fence with no timepoints, met from the start

# Drivers whose results MyeLiN can put in memory of its own (DLPack device type of that memory).
_STORAGE_DRIVERS = {"cuda": KDL_CUDA, "local-task": KDL_CPU, "local-sync": KDL_CPU}
# Input-shape keys whose result shapes a storage twin remembers (entrypoints with dynamic
# result dims); the oldest is forgotten first.
_LEARNED_SHAPES = 64
# Most (input, array) pairs a resolved call remembers as checked; past it the memory starts over.
_PASSED_ENTRIES = 256


class CallError(MyelinError):
    """IREE failed while running a call whose inputs passed validation."""


class SessionClosed(MyelinError):
    """A call on a session after `Session.close()` or `Model.close()`: its VM context is gone."""


class _Stop:
    """One call's cancellation and deadline; `check()` raises when the call must stop."""

    __slots__ = ("deadline", "generation", "name", "session", "timeout", "where")

    def __init__(self, session: Session, name: str, timeout: float | None) -> None:
        # `not timeout >= 0` also refuses NaN, whose deadline would never run out.
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0
        ):
            raise ValueError(f"{name}: timeout must be a number of seconds >= 0, got {timeout!r}")
        self.session = session
        self.name = name
        self.timeout = timeout
        self.generation = session._generation
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.where = "before it started"

    def check(self) -> None:
        if self.session._generation != self.generation:
            raise Cancelled(
                f"{self.name}: cancelled by Session.cancel() {self.where}; "
                "the session is still usable"
            )
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlineExceeded(
                f"{self.name}: its timeout of {self.timeout:g} s ran out {self.where}; "
                "give it a longer timeout or smaller inputs"
            )

    def slice_s(self) -> float:
        if self.deadline is None:
            return CHECK_INTERVAL_S
        return max(0.0, min(CHECK_INTERVAL_S, self.deadline - time.monotonic()))


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
        self._result_count = len(self._out_dtypes)
        # The HAL element type of each tensor result, for checking out= storage (None: none).
        self._out_hal = [element_type_of(d) if d is not None else None for d in self._out_dtypes]
        self._memory = entry.memory
        self._parameters = entry.memory.parameters or None
        # Arguments that are result storage ({iree.abi.output = N}): (argument, result) pairs.
        self._output_args = output_arguments(self._function.reflection.get("iree.abi.declaration"))
        # The device the entrypoint runs on: its arguments are uploaded there, results live there.
        model = session.model
        self._device = model.hal_device(entry.device) if entry.device else session._device
        registry = getattr(model, "registry", None)
        # CUDA DLPack tensors are imported in place only onto a CUDA device.
        driver = registry.driver_of(self._device) if registry is not None else None
        on_cuda = driver == "cuda"
        self._cuda = self._device if on_cuda else None
        # The storage twin (`f$into`, built next to `f`): device results written into memory
        # MyeLiN allocates, which exports DLPack. None: an older build, or results it cannot
        # take storage for (myelin.compiler.result_storage).
        twin = module.lookup_function(entry.function + STORAGE_TWIN_SUFFIX)
        self._storage_kind = _STORAGE_DRIVERS.get(driver or "") if twin is not None else None
        self._twin = twin if self._storage_kind is not None else None
        self._twin_pairs = (
            twin_arguments(twin.reflection.get("iree.abi.declaration")) if self._twin else ()
        )
        # The twin's transient memory, held by this session (None: a twin built before twins
        # took it, which allocates it on IREE's queue every call).
        self._transients = (
            TransientMemory(module, twin, self._device)
            if self._twin is not None and takes_transients(twin)
            else None
        )
        # With cuda_allocator="caching", result storage reuses the memory of dropped results.
        self._reuse = bool(getattr(registry, "caches_cuda_memory", False))
        # Result shapes by input-shape key, for results with dynamic dims (storage_shapes).
        self._learned: dict[tuple[Any, ...], tuple[tuple[int, ...], ...]] = {}
        outputs = self.signature.outputs
        self._static_shapes = (
            tuple(tuple(t.shape or ()) for t in outputs)
            if all(None not in (t.shape or ()) for t in outputs)
            else None
        )
        self._itemsizes = [np.dtype(d).itemsize if d is not None else 0 for d in self._out_dtypes]
        # Per input: (dtype, rank, ((axis, size), ...) of static dims), for the fast check;
        # None for scalars. The slow path (check_inputs) only runs to word an error.
        self._expected = [
            None
            if t.is_scalar
            else (
                numpy_dtype(t.dtype),
                len(t.shape or ()),
                tuple((a, d) for a, d in enumerate(t.shape or ()) if d is not None),
            )
            for t in self.signature.inputs
        ]
        # The HAL element type of each tensor input, for the fast check of device arrays (None:
        # a dtype IREE has no element type for; such inputs take the full check).
        self._expected_hal = [
            element_type_of(e[0]) if e is not None else None for e in self._expected
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
        # The fast check's per-input work, zipped once.
        self._input_checks = tuple(
            zip(range(len(self._expected)), self._expected, self._expected_hal, strict=True)
        )
        # The plain lane (`_call_plain`): a call with nothing to do per call beyond the checks
        # and IREE's own work (no index ranges to check, no memory budget, weights resident:
        # the model fixes its budget and residency at load), so the call skips the rest.
        self._plain = (
            not self._index_checks
            and not self._dim_limits
            and model.budget is None
            and model.residency.policy == "resident"
        )
        # A CUDA submission waits for nothing where the call is one queue execution, whose own
        # waits IREE meets on the host before the invocation returns; with more, or where the
        # build did not record it, it chains as a call does (myelin.runtime.pending).
        schedule = entry.record.memory.schedule if entry.record.memory else None
        self._unchained = on_cuda and schedule is not None and schedule.executes <= 1

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
        for (i, expected, hal), value in zip(self._input_checks, values, strict=True):
            if expected is None:
                shapes.append(None)
                ready.append(value)
                continue
            kind = type(value)
            if kind is DeviceTensor or kind is _DEVICE_ARRAY:
                seen = passed.get((i, id(value)))
                if seen is not None and seen[0]() is value:  # this very array passed before
                    ready.append(buffer_view_of(value))
                    shapes.append(seen[1])
                    continue
            dtype, rank, static = expected
            if kind is np.ndarray:
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
                if hal is None or view.element_type != hal:
                    return None
                shape = view.shape
                if len(shape) != rank:
                    return None
            else:
                return None
            for axis, size in static:
                if shape[axis] != size:
                    return None
            if kind is not np.ndarray:
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

    def __call__(
        self,
        *inputs: Any,
        output: OutputKind = "numpy",
        timeout: float | None = None,
        out: Any = None,
    ) -> Any:
        if out is None and self._plain and (output == "device" or output == "numpy"):
            ready = self._fast_arguments(inputs)
            if ready is not None:
                done = self._call_plain(ready, output, _Stop(self._session, self.name, timeout))
                if done is not None:
                    return done[0] if len(done) == 1 else tuple(done)
        session = self._session
        outs_given = ()
        # out= on an entrypoint whose source takes no result storage: through its storage
        # twin, which writes the results into the caller's memory (and takes no memory from
        # IREE's queue: myelin.compiler.result_storage).
        via_twin = False
        if out is not None:
            outs_given = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            via_twin = not self._output_args and bool(self._twin_pairs)
            if not via_twin:
                inputs = with_output_arguments(self.name, inputs, outs_given, self._output_args)
        if output not in OUTPUT_KINDS:
            raise ValueError(
                f"{self.name}: output must be one of {', '.join(map(repr, OUTPUT_KINDS))}, "
                f"got {output!r}"
            )
        stop = _Stop(session, self.name, timeout)
        model = session.model
        wanted = output
        if outs_given:  # results written into caller storage are never converted
            output = "device"
        device = self._device
        values, ready = self._checked_arguments(inputs)
        budget = model.budget
        need = self._memory.need(self.name, values) if budget is not None else None
        stop.check()
        if not session._lock.acquire(blocking=False):
            stop.where = "while waiting for the session"
            while not session._lock.acquire(timeout=stop.slice_s() or CHECK_INTERVAL_S):
                stop.check()
        try:
            if session._closed:
                raise session._closed_error(self.name)
            reservation = None
            if need is not None:
                stop.where = "while waiting for memory budget"
                reservation = budget.reserve(
                    need, self.name, stop=stop.check, deadline=stop.deadline
                )
            residency = model.residency if model.residency.policy != "resident" else None
            if residency is not None:
                residency.before_call(self._parameters)
            try:
                storage = None
                if via_twin:
                    storage = self._caller_storage(outs_given)
                elif output == "dlpack" and not outs_given and self._twin is not None:
                    storage = self._storage_for(values)
                if storage is not None:
                    outs = self._dispatch_into(values, ready, storage, device, stop, reservation)
                else:
                    outs = self._dispatch(ready, device, output, stop, reservation)
                    if output == "dlpack" and not outs_given:
                        if self._twin is not None:
                            outs = self._learn(values, outs)
                        else:
                            for o in outs:
                                if isinstance(o, DeviceTensor):
                                    o.not_exported = NO_STORAGE_TWIN
            except Cancelled as e:
                # Its traceback's frames hold the abandoned call's buffers; freed after their
                # device (in a later garbage collection), those crash IREE. Drop them here.
                raise e.with_traceback(None) from None
            finally:
                if residency is not None:
                    residency.after_call()
                if reservation is not None and not reservation.held_by_device:
                    reservation.release()
        finally:
            session._lock.release()
        pairs = self._twin_pairs if via_twin else self._output_args
        for (_, result), given in zip(pairs, outs_given, strict=False):
            if isinstance(given, np.ndarray):  # host arrays are passed as copies: copy back
                np.copyto(given, np.asarray(outs[result]))
            outs[result] = given  # written in place: hand back the caller's own object
        if outs_given and wanted == "numpy":
            tied = {result for _, result in pairs}
            outs = [
                o if i in tied or not is_device_array(o) else np.asarray(o.to_host())
                for i, o in enumerate(outs)
            ]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _checked_arguments(self, inputs: tuple[Any, ...]) -> tuple[Any, list[Any]]:
        """The inputs checked against the signature, as the caller's values (their shapes key
        learned result shapes) and as IREE's packer takes them; InputError names what is wrong.
        """
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
        return values, ready

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
        values, ready = self._checked_arguments(inputs)
        session = self._session
        with session._lock:
            if session._closed:
                raise session._closed_error(self.name)
            session._in_flight.make_room()
            args = self._packer.pack(InvokeContext(self._device), ready, {})
            results = _VARIANT_LIST(self._result_count)
            signal = self._start(args, results, self._function, unchained=self._unchained)
            pending = PendingCall(self, signal, results, (args, values), output)
            session._in_flight.add(pending)
        return pending

    def _start(
        self, args: rt.VmVariantList, results: rt.VmVariantList, function: Any, unchained: bool
    ) -> rt.HalFence:
        """Invoke an async entrypoint with its fences (a call's, or a submission's:
        Session._submission_fences) and return the fence it signals when the device is done."""
        session = self._session
        wait, signal = session._submission_fences(self._device, unchained)
        args.push_ref(wait)
        args.push_ref(signal)
        try:
            self._invoke(args, results, function)
        except CallError:
            session._drop_timeline(self._device)
            raise
        return signal

    def _device_failure(self, error: BaseException) -> CallError:
        """A call the device failed: its timeline is failed for good; start afresh."""
        self._session._drop_timeline(self._device)
        return CallError(f"{self.name}: call failed on the device: {_first_line(error)}")

    def _call_plain(self, ready: list[Any], output: OutputKind, stop: _Stop) -> list[Any] | None:
        """The call for arguments that passed the fast check, on an entrypoint with nothing
        more to do per call (`self._plain`; no `out=`, results in IREE's memory): the session
        lock, the cancel check, the invocation, the results. None when the session is busy:
        the full path then waits its turn (with its timeout and cancel checks).

        Why a lane of its own: on a GPU a one-kernel call's time above the kernel is IREE's
        submission and completion plus this Python, which a serving loop pays every call."""
        session = self._session
        lock = session._lock
        if not lock.acquire(blocking=False):
            return None
        try:
            if session._closed:
                raise session._closed_error(self.name)
            return self._dispatch(ready, self._device, output, stop, None)
        except Cancelled as e:  # as in __call__: drop the abandoned call's frames
            raise e.with_traceback(None) from None
        finally:
            lock.release()

    def _dispatch(
        self,
        arguments: list[Any],
        device: rt.HalDevice,
        output: OutputKind,
        stop: _Stop,
        reservation: Reservation | None,
        function: Any = None,
        transients: Any = None,
    ) -> list[Any]:
        """Run the call on `arguments`, ready for IREE's packer (buffer views for device
        arrays), and convert its results. `transients` (a HAL buffer, which the packer does
        not take) is the twin's last argument."""
        stop.where = "before it was dispatched"
        stop.check()
        args = self._packer.pack(InvokeContext(device), arguments, {})
        if transients is not None:
            args.push_ref(transients)
        results = _VARIANT_LIST(self._result_count)
        function = function if function is not None else self._function
        if self._async:
            self._invoke_async(args, results, stop, reservation, function)
        else:
            self._invoke(args, results, function)
            stop.where = "while it ran (a synchronous entrypoint stops once it returns)"
            stop.check()
        return self._results_of(results, output)

    def _results_of(self, results: rt.VmVariantList, output: OutputKind) -> list[Any]:
        """A finished call's results as `output` asks for them."""
        device = self._device
        if output == "device" and len(results) == self._result_count:
            return self._device_results(results, device)
        return [self._convert(results, i, device, output) for i in range(len(results))]

    def _device_results(self, results: rt.VmVariantList, device: rt.HalDevice) -> list[Any]:
        """The results as they stay on the device (what `_convert` makes for "device"), in
        one pass: a 1-result call pays this on every call."""
        get = results.get_as_object
        return [
            results.get_variant(i)
            if dtype is None
            else self._device_tensor(device, get(i, _BUFFER_VIEW), dtype)
            for i, dtype in enumerate(self._out_dtypes)
        ]

    def _device_tensor(self, device: rt.HalDevice, view: Any, dtype: Any) -> DeviceTensor:
        """A result that stays on the device (DLPack export: DeviceTensor.__dlpack__)."""
        return DeviceTensor(
            device,
            view,
            cuda=self._cuda is not None,
            implicit_host_transfer=True,
            override_dtype=dtype,
        )

    def _invoke(self, args: rt.VmVariantList, results: rt.VmVariantList, function: Any) -> None:
        try:
            self._session._context.invoke(function, args, results)
        except Exception as e:
            raise CallError(f"{self.name}: call failed in IREE: {_first_line(e)}") from e

    # -- device results in MyeLiN's own memory (myelin.runtime.result_storage) ---------------

    def _shape_key(self, values: Any) -> tuple[Any, ...]:
        """What decides the result shapes, as far as the runtime can tell: the input shapes
        (and scalar values, which can size a result)."""
        return tuple(
            tuple(v.shape) if spec is not None else v
            for v, spec in zip(values, self._expected, strict=False)
        )

    def storage_shapes(self, values: Any) -> tuple[tuple[int, ...], ...] | None:
        """The shapes to allocate result storage with: the signature's, when every result dim
        is static; else the shapes the first call with the same input shapes returned (None
        until such a call ran)."""
        if self._static_shapes is not None:
            return self._static_shapes
        return self._learned.get(self._shape_key(values))

    def _caller_storage(self, outs: tuple[Any, ...]) -> list[tuple[None, Any]]:
        """The twin's storage from `out=`: one caller tensor per result."""
        specs = self.signature.outputs
        if len(outs) != len(specs):
            raise InputError(
                f"{self.name}: out= has {len(outs)} tensor(s); the entrypoint has "
                f"{len(specs)} result(s), one storage each"
            )
        cuda = self._cuda is not None
        return [
            (None, twin_storage_view(o, spec, element, self._device, self.name, cuda))
            for o, spec, element in zip(outs, specs, self._out_hal, strict=True)
        ]

    def _storage_for(self, values: Any) -> list[tuple[Storage, Any]] | None:
        """One imported allocation per result, or None when the shapes are not known yet or
        IREE refuses the import (a dtype it has no DLPack import for)."""
        shapes = self.storage_shapes(values)
        if shapes is None:
            return None
        storage = []
        for shape, dtype, itemsize in zip(shapes, self._out_dtypes, self._itemsizes, strict=True):
            nbytes = math.prod(shape) * itemsize
            if nbytes == 0:
                return None  # nothing to export; IREE's own result will do
            memory = Storage(nbytes, self._storage_kind, reuse=self._reuse)
            try:
                view = self._device.from_dlpack_capsule(dlpack_capsule(memory, shape, dtype))
            except (RuntimeError, ValueError, TypeError):
                return None
            storage.append((memory, view))
        return storage

    def _dispatch_into(
        self,
        values: Any,
        ready: list[Any],
        storage: list[tuple[Storage, Any]],
        device: rt.HalDevice,
        stop: _Stop,
        reservation: Reservation | None,
    ) -> list[Any]:
        """Call the twin with the storage; the results are buffer views over it. `values` are
        the caller's inputs (their shapes key the learned result shapes), `ready` the same as
        IREE's packer takes them."""
        views = tuple(view for _, view in storage)
        args = with_output_arguments(self.name, tuple(ready), views, self._twin_pairs)
        transients = None
        if self._transients is not None:
            hold = self._transient_hold(stop)
            if reservation is not None:  # the session's buffer, counted on its own, takes them
                reservation.give_back_transient()
            need = self._transients.size(
                self._shape_key(values), lambda f, buffer: self._query(f, args, buffer), hold
            )
            transients = self._transients.buffer(need, hold)
        outs = self._dispatch(args, device, "device", stop, reservation, self._twin, transients)
        for out, (memory, _) in zip(outs, storage, strict=True):
            if memory is not None:  # None: the caller's own (out=)
                out.storage_pointer = memory.pointer
        if self._static_shapes is None:
            shapes = tuple(tuple(buffer_view_of(o).shape) for o in outs)
            if shapes != self.storage_shapes(values):  # smaller than learned: remember
                self._remember(self._shape_key(values), shapes)
        return outs

    def _transient_hold(self, stop: _Stop) -> Any:
        """How the session's transient buffer reserves its bytes under the model's memory
        budget (None: no budget). It waits for memory like a call, within the call's deadline."""
        budget = self._session.model.budget
        if budget is None:
            return None
        what = f"{self.name}: the session's transient buffer"
        return lambda nbytes: budget.reserve(
            CallNeed(0, nbytes, 0), what, stop=stop.check, deadline=stop.deadline
        )

    def _query(self, function: Any, arguments: tuple[Any, ...], buffer: Any) -> int:
        """Run the twin's transient-size function on the twin's arguments: it reads only
        their shapes (and scalars), so any buffer and, for an async twin, fresh fences do."""
        args = self._packer.pack(InvokeContext(self._device), arguments, {})
        args.push_ref(buffer)
        if self._async:
            args.push_ref(rt.HalFence(1))
            args.push_ref(rt.HalFence(1))
        result = rt.VmVariantList(1)
        self._invoke(args, result, function)
        return int(result.get_variant(0))

    def _learn(self, values: Any, outs: list[Any]) -> list[Any]:
        """The first call with new input shapes ran `f` itself, in memory IREE allocated (the
        shapes of results with dynamic dims are not known before a call): remember them, so
        the next call with these input shapes writes into storage of MyeLiN's. IREE 3.13
        cannot copy into imported memory (its queue copy needs DISCARD_WRITE access, which the
        Python import does not grant), and running the twin again would run a stateful model
        twice: so this call's results do not export on a GPU, and say why."""
        shapes = tuple(tuple(buffer_view_of(o).shape) for o in outs)
        self._remember(self._shape_key(values), shapes)
        for out in outs:
            if isinstance(out, DeviceTensor):
                out.not_exported = FIRST_CALL_OF_SHAPE
        return outs

    def _remember(self, key: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> None:
        if len(self._learned) >= _LEARNED_SHAPES and key not in self._learned:
            self._learned.pop(next(iter(self._learned)))
        self._learned[key] = shapes

    def _invoke_async(
        self,
        args: rt.VmVariantList,
        results: rt.VmVariantList,
        stop: _Stop,
        reservation: Reservation | None,
        function: Any,
    ) -> None:
        """Submit, then wait for the signal fence in slices. A stopped call hands its memory
        reservation to a background waiter: the device still uses that memory."""
        session = self._session
        signal = self._start(args, results, function, unchained=False)
        stop.where = "while the device ran it"
        try:
            self._wait.wait(signal, stop.slice_s, stop.check)
        except Cancelled:
            if reservation is not None:
                reservation.held_by_device = True
            # The device still reads the arguments and parameters and writes the results:
            # keep them, the context and the model's mapping alive until it is done.
            keep = (args, results, session._context, session._modules, session.model)
            _release_when_done(signal, reservation, keep)
            del args, results, keep  # the waiter alone owns them now
            raise
        except Exception as e:  # a failed device submission fails the timeline for good
            raise self._device_failure(e) from e

    def _convert(
        self, results: rt.VmVariantList, i: int, device: rt.HalDevice, output: OutputKind
    ) -> Any:
        dtype = self._out_dtypes[i] if i < len(self._out_dtypes) else None
        if dtype is None:
            return results.get_variant(i)
        view = results.get_as_object(i, _BUFFER_VIEW)
        if output != "numpy":
            return self._device_tensor(device, view, dtype)
        return read_to_host(device, view, dtype)


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
