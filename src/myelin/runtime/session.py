"""Sessions and calls: one IREE VM context per session, holding every shard module of the variant.

Contract: different sessions run concurrently from different threads (IREE releases the GIL while
it invokes; no lock of ours is held across sessions). Calls on one session are serialized by the
session's own lock, because IREE does not document a VM context as thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import iree.runtime as rt
import numpy as np
from iree.runtime._binding import ArgumentPacker, InvokeContext, _invoke_statics

from myelin.dtypes import numpy_dtype
from myelin.errors import MyelinError
from myelin.runtime.tensors import as_host_array, check_inputs

OutputKind = Literal["numpy", "device"]

_HOST_VISIBLE = int(rt.MemoryType.HOST_VISIBLE)


class CallError(MyelinError):
    """IREE failed while running a call whose inputs passed validation."""


class Session:
    def __init__(self, model: Any) -> None:
        self.model = model
        self._lock = threading.Lock()
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

    def resolve(self, name: str) -> ResolvedCall:
        """A reusable handle for one entrypoint (looks the function up once)."""
        resolved = self._resolved.get(name)
        if resolved is None:
            resolved = ResolvedCall(self, name)
            self._resolved[name] = resolved
        return resolved

    def call(self, name: str, *inputs: Any, output: OutputKind = "numpy") -> Any:
        """Run entrypoint `name`. Returns one value, or a tuple for several results."""
        return self.resolve(name)(*inputs, output=output)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._resolved.clear()
            self._context = None
            self._modules = []
        self.model._forget(self)

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
        self._session = session
        self._function = module.lookup_function(entry.function)
        self._packer = ArgumentPacker(_invoke_statics, None)
        self._out_dtypes = [
            numpy_dtype(t.dtype) if not t.is_scalar else None for t in self.signature.outputs
        ]
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

    def _matches(self, values: tuple[Any, ...]) -> bool:
        if len(values) != len(self._expected):
            return False
        for value, expected in zip(values, self._expected, strict=True):
            if expected is None:
                continue
            if type(value) is not np.ndarray:
                return False
            dtype, rank, static = expected
            if value.dtype != dtype or value.ndim != rank:
                return False
            shape = value.shape
            for axis, size in static:
                if shape[axis] != size:
                    return False
        return True

    def __call__(self, *inputs: Any, output: OutputKind = "numpy") -> Any:
        if self._matches(inputs):
            values: Any = inputs
        else:
            specs = self.signature.inputs
            values = [as_host_array(v, s, self.name) for v, s in zip(inputs, specs, strict=False)]
            values.extend(inputs[len(specs) :])
            check_inputs(self.name, specs, values)
        session = self._session
        device = session._device
        with session._lock:
            if session._closed:
                raise MyelinError(f"{self.name}: the session is closed")
            args = self._packer.pack(InvokeContext(device), values, {})
            results = rt.VmVariantList(len(self._out_dtypes))
            try:
                session._context.invoke(self._function, args, results)
            except Exception as e:
                raise CallError(f"{self.name}: call failed in IREE: {_first_line(e)}") from e
        outs = [self._convert(results, i, device, output) for i in range(len(results))]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _convert(
        self, results: rt.VmVariantList, i: int, device: rt.HalDevice, output: OutputKind
    ) -> Any:
        dtype = self._out_dtypes[i] if i < len(self._out_dtypes) else None
        if dtype is None:
            return results.get_variant(i)
        view = results.get_as_object(i, rt.HalBufferView)
        if output == "device":
            return rt.DeviceArray(device, view, implicit_host_transfer=True, override_dtype=dtype)
        if not view.get_buffer().memory_type() & _HOST_VISIBLE:
            # Device memory (CUDA): IREE's own transfer into a fresh host array.
            array = rt.DeviceArray(device, view, implicit_host_transfer=True, override_dtype=dtype)
            return np.array(array.to_host(), copy=True)
        # Copy out of the mapping: a numpy array that outlives its HAL buffer's device (at
        # interpreter exit, or after the model is closed) must not point into unmapped memory.
        mapped = view.map()
        try:
            return np.array(mapped.asarray(view.shape, dtype), copy=True)
        finally:
            del mapped


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
