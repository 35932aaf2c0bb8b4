"""Result sinks: where a call's results go. A resolved call makes its sinks once, and each call
takes one, by `output` and `out=`:

- `IreeResults`: results in memory IREE allocates, read to numpy or kept on the device as
  DeviceTensors (`output="numpy"`, `"device"`; `"dlpack"` without a storage twin).
- `OwnStorage`: `output="dlpack"`: results in memory MyeLiN allocates (myelin.runtime.
  result_storage), which the entrypoint's storage twin `f$into` writes and which exports DLPack.
- `CallerStorage`: `out=`: results written into the caller's tensors, through the arguments the
  entrypoint's source marks `{iree.abi.output = N}` or else through its storage twin.

A sink answers two questions of the call path: what to invoke (`invocation`: the function, its
arguments, the twin's transient buffer) and what the caller gets back (`deliver`). The twin's
facts per input shape (result shapes, transient bytes) live in one memo, `StorageTwin`'s.
"""

from __future__ import annotations

import math
from typing import Any

import iree.runtime as rt
import numpy as np

from myelin.errors import InputError
from myelin.runtime._iree_private import (
    InvokeContext,
    buffer_view_of,
    element_type_of,
    is_device_array,
)
from myelin.runtime.admission import CallNeed
from myelin.runtime.deadline import Deadline
from myelin.runtime.host_transfer import read_to_host
from myelin.runtime.result_storage import Storage, dlpack_capsule
from myelin.runtime.tensors import (
    FIRST_CALL_OF_SHAPE,
    DeviceTensor,
    twin_arguments,
    twin_storage_view,
    with_output_arguments,
)
from myelin.runtime.transients import TransientMemory, takes_transients

# Looked up once: per-call attribute lookups add up on a call that costs tens of microseconds.
_BUFFER_VIEW = rt.HalBufferView
# Input-shape keys whose facts (result shapes, transient bytes) a storage twin remembers; the
# oldest is forgotten first.
_SHAPE_MEMO_ENTRIES = 64


class Bound:
    """A call's arguments, bound once: `values` as the caller passed them, checked (their shapes
    key what a shape decides), `ready` as IREE's packer takes them (with `out=` spliced in where
    the entrypoint or its twin takes result storage), `outs` the caller's `out=` tensors."""

    __slots__ = ("outs", "ready", "values")

    def __init__(self, values: Any, ready: Any, outs: tuple[Any, ...] = ()) -> None:
        self.values = values
        self.ready = ready
        self.outs = outs


# What a sink's `invocation` returns: the function, its arguments for the packer, the twin's
# transient buffer (None: none) and what `deliver` needs of this call (None: nothing).
Invocation = tuple[Any, Any, Any, Any]


def converted(call: Any, results: rt.VmVariantList, to_host: bool) -> list[Any]:
    """IREE's results as numpy arrays (`to_host`) or as DeviceTensors on the call's device;
    results that are not tensors (scalars) as IREE gives them."""
    dtypes = call._out_dtypes
    count = len(results)
    if count != len(dtypes):  # a module with more results than its signature names
        dtypes = [*dtypes[:count], *[None] * (count - len(dtypes))]
    device = call._device
    get = results.get_as_object
    if to_host:
        return [
            results.get_variant(i)
            if d is None
            else read_to_host(device, get(i, _BUFFER_VIEW), d, call._staging)
            for i, d in enumerate(dtypes)
        ]
    cuda = call._cuda is not None
    return [
        results.get_variant(i)
        if d is None
        else DeviceTensor(
            device, get(i, _BUFFER_VIEW), cuda=cuda, implicit_host_transfer=True, override_dtype=d
        )
        for i, d in enumerate(dtypes)
    ]


class IreeResults:
    """Results in memory IREE allocates. `not_exported`: why a DeviceTensor cannot export
    DLPack, for `output="dlpack"` on an entrypoint without a storage twin."""

    __slots__ = ("call", "not_exported", "to_host")

    def __init__(self, call: Any, to_host: bool, not_exported: str | None = None) -> None:
        self.call = call
        self.to_host = to_host
        self.not_exported = not_exported

    def invocation(self, bound: Bound, deadline: Deadline, reservation: Any) -> Invocation:
        return self.call._function, bound.ready, None, None

    def deliver(self, results: rt.VmVariantList, bound: Bound, state: Any) -> list[Any]:
        outs = converted(self.call, results, self.to_host)
        if self.not_exported is not None:
            for out in outs:
                if isinstance(out, DeviceTensor):
                    out.not_exported = self.not_exported
        return outs


class OwnStorage:
    """`output="dlpack"`: one allocation of MyeLiN's per result, which the twin writes. Until a
    call with the same input shapes has run, results with dynamic dims have no known shape: that
    call runs `f` itself, in memory IREE allocates, and its shapes are remembered (`learn`)."""

    __slots__ = ("call", "twin")

    def __init__(self, call: Any, twin: StorageTwin) -> None:
        self.call = call
        self.twin = twin

    def invocation(self, bound: Bound, deadline: Deadline, reservation: Any) -> Invocation:
        twin = self.twin
        storage = twin.allocate(bound.values)
        if storage is None:
            return self.call._function, bound.ready, None, None
        views = tuple(view for _, view in storage)
        args = with_output_arguments(self.call.name, tuple(bound.ready), views, twin.pairs)
        return (
            twin.function,
            args,
            twin.transients_for(bound.values, args, deadline, reservation),
            storage,
        )

    def deliver(self, results: rt.VmVariantList, bound: Bound, storage: Any) -> list[Any]:
        outs = converted(self.call, results, to_host=False)
        if storage is None:
            return self.twin.learn(bound.values, outs)
        for out, (memory, _) in zip(outs, storage, strict=True):
            out.storage_pointer = memory.pointer
        self.twin.remember(bound.values, outs)
        return outs


class CallerStorage:
    """`out=`: the caller's tensors take the results they are given for (spliced into the
    arguments when the call was bound); the call returns those objects themselves, written.
    `twin`: the storage twin writes them (an entrypoint whose source takes no result storage);
    None: the entrypoint's own `{iree.abi.output}` arguments do. `to_host`: the other results
    as numpy arrays (`output="numpy"`)."""

    __slots__ = ("call", "pairs", "to_host", "twin")

    def __init__(self, call: Any, twin: StorageTwin | None, to_host: bool) -> None:
        self.call = call
        self.twin = twin
        self.to_host = to_host
        # (argument, result) pairs: where each out= tensor goes in, which result it takes.
        self.pairs = twin.pairs if twin is not None else call._output_args

    def invocation(self, bound: Bound, deadline: Deadline, reservation: Any) -> Invocation:
        twin = self.twin
        if twin is None:
            return self.call._function, bound.ready, None, None
        transients = twin.transients_for(bound.values, bound.ready, deadline, reservation)
        return twin.function, bound.ready, transients, None

    def deliver(self, results: rt.VmVariantList, bound: Bound, state: Any) -> list[Any]:
        outs = converted(self.call, results, to_host=False)
        if self.twin is not None:
            self.twin.remember(bound.values, outs)
        for (_, result), given in zip(self.pairs, bound.outs, strict=False):
            if isinstance(given, np.ndarray):  # host arrays are passed as copies: copy back
                np.copyto(given, np.asarray(outs[result]))
            outs[result] = given  # written in place: hand back the caller's own object
        if self.to_host:
            tied = {result for _, result in self.pairs}
            outs = [
                o if i in tied or not is_device_array(o) else np.asarray(o.to_host())
                for i, o in enumerate(outs)
            ]
        return outs


class StorageTwin:
    """An entrypoint's storage twin (`f$into`, built next to `f`) in one session: results
    written into storage it is given, transient memory from a buffer the session holds
    (myelin.runtime.transients). One memo per input-shape key holds what the shapes decide: the
    result shapes (for entrypoints with dynamic result dims) and the transient bytes."""

    def __init__(self, call: Any, module: Any, function: Any, storage_kind: int, reuse: bool):
        self.call = call
        self.function = function
        self.storage_kind = storage_kind  # DLPack device type of the memory MyeLiN allocates
        self.reuse = reuse  # cuda_allocator="caching": storage reuses dropped results' memory
        # (argument, result) pairs of the twin's result storage.
        self.pairs = twin_arguments(function.reflection.get("iree.abi.declaration"))
        # The transient memory the session holds (None: a twin built before twins took it,
        # which allocates it on IREE's queue every call).
        self.transients = (
            TransientMemory(module, function, call._device) if takes_transients(function) else None
        )
        outputs = call.signature.outputs
        self._static_shapes = (
            tuple(tuple(t.shape or ()) for t in outputs)
            if all(None not in (t.shape or ()) for t in outputs)
            else None
        )
        # Input-shape key -> [result shapes or None, transient bytes or None].
        self._memo: dict[tuple[Any, ...], list[Any]] = {}

    def _key(self, values: Any) -> tuple[Any, ...]:
        """What decides the result shapes and transient bytes, as far as the runtime can tell:
        the input shapes (and scalar values, which can size a result)."""
        return tuple(
            v if expected is None else tuple(v.shape)
            for v, expected in zip(values, self.call._expected, strict=False)
        )

    def _facts(self, key: tuple[Any, ...]) -> list[Any]:
        facts = self._memo.get(key)
        if facts is None:
            if len(self._memo) >= _SHAPE_MEMO_ENTRIES:
                self._memo.pop(next(iter(self._memo)))
            facts = self._memo[key] = [None, None]
        return facts

    def shapes(self, values: Any) -> tuple[tuple[int, ...], ...] | None:
        """The shapes to allocate result storage with: the signature's, when every result dim
        is static; else the shapes the last call with the same input shapes returned (None
        until such a call ran)."""
        if self._static_shapes is not None:
            return self._static_shapes
        facts = self._memo.get(self._key(values))
        return facts[0] if facts is not None else None

    def allocate(self, values: Any) -> list[tuple[Storage, Any]] | None:
        """One imported allocation per result, or None when the shapes are not known yet or
        IREE refuses the import (a dtype it has no DLPack import for)."""
        shapes = self.shapes(values)
        if shapes is None:
            return None
        device = self.call._device
        storage = []
        for shape, dtype in zip(shapes, self.call._out_dtypes, strict=True):
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            if nbytes == 0:
                return None  # nothing to export; IREE's own result will do
            memory = Storage(nbytes, self.storage_kind, reuse=self.reuse)
            try:
                view = device.from_dlpack_capsule(dlpack_capsule(memory, shape, dtype))
            except (RuntimeError, ValueError, TypeError):
                return None
            storage.append((memory, view))
        return storage

    def caller_views(self, outs: tuple[Any, ...]) -> tuple[Any, ...]:
        """The twin's storage from `out=`: one caller tensor per result, as buffer views."""
        call = self.call
        specs = call.signature.outputs
        if len(outs) != len(specs):
            raise InputError(
                f"{call.name}: out= has {len(outs)} tensor(s); the entrypoint has "
                f"{len(specs)} result(s), one storage each"
            )
        cuda = call._cuda is not None
        return tuple(
            twin_storage_view(
                o,
                spec,
                element_type_of(dtype) if dtype is not None else None,
                call._device,
                call.name,
                cuda,
            )
            for o, spec, dtype in zip(outs, specs, call._out_dtypes, strict=True)
        )

    def transients_for(
        self, values: Any, args: tuple[Any, ...], deadline: Deadline, reservation: Any
    ) -> Any:
        """The session's transient buffer, large enough for this call (None: the twin takes
        none). Its size comes from the twin's size function, run once per input-shape key."""
        transients = self.transients
        if transients is None:
            return None
        hold = self._hold(deadline)
        if reservation is not None:  # the session's buffer, counted on its own, takes them
            reservation.give_back_transient()
        facts = self._facts(self._key(values))
        if facts[1] is None:
            facts[1] = transients.size(lambda f, buffer: self._query(f, args, buffer), hold)
        return transients.buffer(facts[1], hold)

    def _hold(self, deadline: Deadline) -> Any:
        """How the session's transient buffer reserves its bytes under the model's memory
        budget (None: no budget). It waits for memory like a call, within the call's deadline."""
        budget = self.call._budget
        if budget is None:
            return None
        what = f"{self.call.name}: the session's transient buffer"
        return lambda nbytes: budget.reserve(CallNeed(0, nbytes, 0), what, deadline)

    def _query(self, function: Any, arguments: tuple[Any, ...], buffer: Any) -> int:
        """Run the twin's transient-size function on the twin's arguments: it reads only
        their shapes (and scalars), so any buffer and, for an async twin, fresh fences do."""
        call = self.call
        args = call._packer.pack(InvokeContext(call._device), arguments, {})
        args.push_ref(buffer)
        if call._async:
            args.push_ref(rt.HalFence(1))
            args.push_ref(rt.HalFence(1))
        result = rt.VmVariantList(1)
        call._invoke(args, result, function)
        return int(result.get_variant(0))

    def learn(self, values: Any, outs: list[Any]) -> list[Any]:
        """The first call with new input shapes ran `f` itself, in memory IREE allocated (the
        shapes of results with dynamic dims are not known before a call): remember them, so
        the next call with these input shapes writes into storage of MyeLiN's. IREE 3.13
        cannot copy into imported memory (its queue copy needs DISCARD_WRITE access, which the
        Python import does not grant), and running the twin again would run a stateful model
        twice: so this call's results do not export on a GPU, and say why."""
        self._facts(self._key(values))[0] = tuple(tuple(buffer_view_of(o).shape) for o in outs)
        for out in outs:
            if isinstance(out, DeviceTensor):
                out.not_exported = FIRST_CALL_OF_SHAPE
        return outs

    def remember(self, values: Any, outs: list[Any]) -> None:
        """After a twin call: the result shapes it returned, where they are dynamic (a result
        smaller than the storage it was given is remembered at its own size)."""
        if self._static_shapes is None:
            shapes = tuple(tuple(buffer_view_of(o).shape) for o in outs)
            if shapes != self.shapes(values):
                self._facts(self._key(values))[0] = shapes
