"""The host module: ONNX nodes IREE could not lower, run by ONNX Runtime when IREE calls them.

A graph built with `host_fallback` imports functions `plex_host.<module>_<n>` (one per node
that fell back, myelin.frontends._onnx_host). Each module record lists them with the section
holding the node as a one-node ONNX model. This module builds one Python VM module
(`iree.runtime.PyModuleInterface`) per session that exports all of them: a call maps its
argument buffer views as numpy arrays (no copy), runs the node in an ONNX Runtime session
made once per model, and returns its results copied into buffers of the model's first device.

ONNX Runtime is imported only by models that have host functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import iree.runtime as rt
import numpy as np
from iree.runtime.dtypes import map_dtype_to_hal_element_type

from myelin.errors import DeviceUnavailable
from myelin.signature import HOST_MODULE

# ops run with ONNX's reference implementation even where ONNX Runtime takes them: ORT's f32 DFT
# differs from the reference (numpy's FFT) beyond rtol 1e-3 on values near zero (measured on
# onnx's DFT node tests); the reference is slower and exact to f32
REFERENCE_FIRST = frozenset({"DFT"})


class HostFunctions:
    """The host functions of one loaded model: their ONNX Runtime sessions, made on first use."""

    def __init__(self, functions: Sequence[dict], section: Callable[[str], memoryview]) -> None:
        self._records = {f["function"]: f for f in functions}
        self._section = section
        self._sessions: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self._records)

    def _session(self, name: str) -> Any:
        """ONNX Runtime's session for the node; ONNX's reference implementation where ONNX
        Runtime refuses the node or its types (its Python API has no float8 arrays)."""
        with self._lock:
            if name not in self._sessions:
                try:
                    import onnxruntime as ort
                except ImportError as e:
                    raise DeviceUnavailable(
                        f"host function {name} (ONNX node {self._records[name]['node']!r}) "
                        "needs onnxruntime: pip install onnxruntime"
                    ) from e
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1  # runs on the calling VM thread
                model = bytes(self._section(self._records[name]["section"]))
                if self._records[name].get("op_type") in REFERENCE_FIRST:
                    self._sessions[name] = (None, model)
                    return self._sessions[name]
                try:
                    session = ort.InferenceSession(
                        model, options, providers=["CPUExecutionProvider"]
                    )
                except Exception:
                    session = None
                self._sessions[name] = (session, model)
            return self._sessions[name]

    def run(self, name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        session, model = self._session(name)
        if session is not None:
            feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays, strict=True)}
            try:
                return [np.asarray(r, order="C") for r in session.run(None, feeds)]
            except Exception:
                with self._lock:
                    self._sessions[name] = (None, model)
        from onnx import ModelProto
        from onnx.reference import ReferenceEvaluator

        proto = ModelProto()
        proto.ParseFromString(model)
        names = [i.name for i in proto.graph.input]
        outputs = ReferenceEvaluator(proto).run(None, dict(zip(names, arrays, strict=True)))
        return [np.asarray(r, order="C") for r in outputs]

    def vm_module(
        self, instance: rt.VmInstance, device: rt.HalDevice, *, fences: bool
    ) -> rt.VmModule:
        """A VM module exporting every host function, for one VM context. With `fences` (the
        async-external execution model, `[runtime] cancellable`), IREE passes each import a
        wait fence and a signal fence after its tensors: the call waits, runs, signals."""
        host = self

        class Module:
            def __init__(self, iface: Any) -> None:
                self.iface = iface

        iface = rt.PyModuleInterface(HOST_MODULE, Module)
        for name, record in self._records.items():
            n_in, n_out = len(record["inputs"]), len(record["outputs"])
            refs = "r" * (n_in + (2 if fences else 0))
            method = _method(host, name, device, record["inputs"], record["outputs"], fences)
            iface.export(name, f"0{refs}_{'r' * n_out}", method)
        return iface.create()


# element types numpy's own dtypes lack (ml_dtypes arrays), both ways
_ML_DTYPES = {
    "float8_e4m3fn": "FLOAT_8_E4M3_FN",
    "float8_e4m3fnuz": "FLOAT_8_E4M3_FNUZ",
    "float8_e5m2": "FLOAT_8_E5M2",
    "float8_e5m2fnuz": "FLOAT_8_E5M2_FNUZ",
    "bfloat16": "BFLOAT_16",
}


def _element_type(dtype: np.dtype) -> Any:
    if dtype.name in _ML_DTYPES:
        return getattr(rt.HalElementType, _ML_DTYPES[dtype.name])
    return map_dtype_to_hal_element_type(dtype)


def _to_numpy(ref: Any) -> np.ndarray:
    view = ref.deref(rt.HalBufferView)
    for name, member in _ML_DTYPES.items():
        if view.element_type == getattr(rt.HalElementType, member):
            import ml_dtypes

            dtype = np.dtype(getattr(ml_dtypes, name))
            raw = view.map().asarray(tuple(view.shape), np.dtype(f"u{dtype.itemsize}"))
            return raw.view(dtype)
    dtype = rt.HalElementType.map_to_dtype(view.element_type)
    return view.map().asarray(tuple(view.shape), dtype)


def _as_recorded(array: np.ndarray, recorded: str) -> np.ndarray:
    """The argument as the node's own dtype: IREE integers are signless, so a uint16 tensor
    arrives as int16 (same bytes), which ONNX Runtime refuses and the reference misreads."""
    if array.dtype.name == recorded or recorded in _ML_DTYPES:
        return array
    dtype = np.dtype(recorded)
    if dtype.itemsize == array.dtype.itemsize and dtype.kind in "iub":
        return array.view(dtype)
    return array


def _method(
    host: HostFunctions,
    name: str,
    device: rt.HalDevice,
    input_dtypes: Sequence[str],
    output_dtypes: Sequence[str],
    fences: bool,
) -> Callable:
    n_in, n_out = len(input_dtypes), len(output_dtypes)

    def call(self: Any, *refs: Any) -> Any:
        signal = None
        if fences:
            refs[n_in].deref(rt.HalFence).wait()
            signal = refs[n_in + 1].deref(rt.HalFence)
        arguments = zip(refs[:n_in], input_dtypes, strict=True)
        arrays = [_as_recorded(_to_numpy(r), dtype) for r, dtype in arguments]
        outputs = host.run(name, arrays)
        views = []
        for array, recorded in zip(outputs, output_dtypes, strict=True):
            if recorded in _ML_DTYPES and array.dtype.name != recorded:
                # ONNX Runtime hands float8 results back as raw bytes: the node's type says
                import ml_dtypes

                array = array.view(np.dtype(getattr(ml_dtypes, recorded)))
            element_type = _element_type(array.dtype)
            if array.dtype.name in _ML_DTYPES:  # the bytes, as an integer array numpy can pass
                array = array.view(np.dtype(f"u{array.dtype.itemsize}"))
            view = device.allocator.allocate_buffer_copy(
                memory_type=rt.MemoryType.DEVICE_LOCAL,
                allowed_usage=rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING,
                device=device,
                buffer=array,
                element_type=element_type,
            )
            views.append(view.ref)
        if signal is not None:
            signal.signal()
        return views[0] if n_out == 1 else tuple(views)

    return call
