"""Turning user tensors into call arguments and results back into numpy, with signature checks.

Validation happens before anything reaches IREE, so a wrong rank, dtype or size is one clear
InputError naming the argument, not a HAL assertion from inside the VM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import iree.runtime as rt
import numpy as np

from myelin.dtypes import numpy_dtype
from myelin.errors import InputError
from myelin.runtime._cuda import CU_STREAM_LEGACY, KDL_CUDA, synchronize_legacy_stream
from myelin.runtime._iree_private import (
    buffer_view_of,
    device_of,
    is_device_array,
)
from myelin.runtime.host_transfer import read_to_host
from myelin.signature import TensorSpec


def as_host_array(value: Any, spec: TensorSpec, entrypoint: str, cuda: Any = None) -> Any:
    """numpy arrays pass through; DLPack tensors (torch CPU, jax CPU...) are viewed zero-copy;
    Python scalars become 0-d values. Device arrays returned by an earlier call pass through.
    With `cuda` (the entrypoint's HAL device, when it is a CUDA device), DLPack tensors on the
    GPU (torch CUDA tensors) are imported in place (`import_cuda_tensor`)."""
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ndarray):  # a subclass: np.matrix, a masked array, a memmap
        if isinstance(value, np.ma.MaskedArray):
            raise InputError(
                f"{entrypoint}: argument '{spec.name}' is a masked array; its mask would be "
                "ignored: pass .filled(value) or .data"
            )
        return np.asarray(value)  # np.matrix and memmap: the same values as a plain ndarray
    if is_device_array(value):  # stays on its device
        return value
    if cuda is not None and _dlpack_device(value)[0] == KDL_CUDA:
        return import_cuda_tensor(value, cuda, spec, entrypoint)
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (RuntimeError, BufferError, TypeError) as e:
            raise InputError(
                f"{entrypoint}: argument '{spec.name}' is a DLPack tensor numpy cannot view "
                f"({e}); pass a CPU tensor or a numpy array"
            ) from e
    if spec.is_scalar and isinstance(value, (int, float, bool, np.generic)):
        return value
    if isinstance(value, (list, tuple, int, float, bool)):
        return from_python(value, spec, entrypoint)
    raise InputError(
        f"{entrypoint}: argument '{spec.name}' has type {type(value).__name__}; "
        "expected a numpy array or a DLPack tensor"
    )


def from_python(value: Any, spec: TensorSpec, entrypoint: str) -> np.ndarray:
    """A Python list (or number) as the entrypoint's dtype, by numpy's rules: numpy infers the
    list's dtype as for `np.asarray`, which must cast to the input's dtype under `same_kind`
    (a float list for an integer input is refused as a float array is; strings are refused),
    and every value must survive the cast (an integer in range; a finite float that stays
    finite: 1e40 overflows f32, 3.4028235e38 rounds to f32's max)."""
    try:
        inferred = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' is a list numpy cannot make an array of "
            f"({_first_line(e)})"
        ) from None
    target = numpy_dtype(spec.dtype)
    floating = target.kind == "f" or "float" in target.name  # ml_dtypes' are kind "V"
    if inferred.dtype.kind not in "biuf" or not np.can_cast(inferred.dtype, target, "same_kind"):
        kind = {"U": "strings", "S": "bytes", "O": "Python objects"}.get(
            inferred.dtype.kind, f"{inferred.dtype} values"
        )
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' is a list of {kind} ({_sample(inferred)}), "
            f"expected {spec.dtype}: numpy's same_kind rule does not cast {inferred.dtype} to "
            f"{spec.dtype} (it would change values), as for an array of {inferred.dtype}"
        )
    if not floating and target.kind != "b" and inferred.size:
        info = _iinfo(target)
        low, high = inferred.min(), inferred.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InputError(
                f"{entrypoint}: argument '{spec.name}': value {bad} is out of range for "
                f"{spec.dtype} [{info.min}, {info.max}]"
            )
    with np.errstate(over="ignore", invalid="ignore"):
        converted = inferred.astype(target)
    if floating:
        overflow = np.isfinite(inferred) & ~np.isfinite(converted.astype(np.float64))
        if overflow.any():
            bad = inferred[overflow].flat[0]
            raise InputError(
                f"{entrypoint}: argument '{spec.name}': value {bad} overflows {spec.dtype}; "
                "write inf for infinity"
            )
    return converted


def _iinfo(dtype: np.dtype) -> Any:
    if dtype.kind in "iu":
        return np.iinfo(dtype)
    import ml_dtypes  # int4 and friends

    return ml_dtypes.iinfo(dtype)


def _sample(array: np.ndarray) -> str:
    return repr(array.flat[0].item()) if array.size else "empty"


def _dlpack_device(value: Any) -> tuple[int, int]:
    try:
        kind, ordinal = value.__dlpack_device__()
        return int(kind), int(ordinal)
    except (AttributeError, TypeError, ValueError):
        return (0, 0)


def import_cuda_tensor(value: Any, device: rt.HalDevice, spec: TensorSpec, entrypoint: str) -> Any:
    """A GPU tensor's memory as a HAL buffer view on `device`, without a copy.

    Lifetime: the buffer view owns the DLPack capsule, whose deleter (run when IREE releases the
    buffer, after the last call or result using it) lets the producer free the memory; until
    then the tensor stays alive, whatever the caller drops. Order: the producer orders its
    pending work before the legacy default stream, which is waited on here (IREE's streams are
    not ordered by it)."""
    _, ordinal = _dlpack_device(value)
    if ordinal != 0:
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' is on CUDA device {ordinal}; the entrypoint "
            "runs on CUDA device 0: move it there first"
        )
    try:
        capsule = value.__dlpack__(stream=CU_STREAM_LEGACY)
        synchronize_legacy_stream()
        view = device.from_dlpack_capsule(capsule)
    except (RuntimeError, BufferError, TypeError, ValueError) as e:
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' is a CUDA DLPack tensor IREE cannot import "
            f"({_first_line(e)}); pass a contiguous tensor (x.contiguous())"
        ) from e
    return DeviceTensor(device, view, implicit_host_transfer=True, cuda=True)


# Why a device result is in memory IREE allocated, for the BufferError its export raises.
NOT_ASKED = 'call with output="dlpack" for results in memory that exports'
NO_STORAGE_TWIN = (
    "the entrypoint has no storage twin (built before PLeX added them, or for a device "
    "without result_storage, or a result that is not a tensor, of size 0, or of a dtype IREE's "
    "DLPack import lacks): rebuild the .mln"
)
FIRST_CALL_OF_SHAPE = (
    "its shape has dynamic dims, unknown before the first call with these input shapes; the "
    "next calls with the same input shapes write results into exportable memory"
)


class DeviceTensor(rt.DeviceArray):
    """A result (or imported argument) that stays on its device and exports DLPack:
    `torch.from_dlpack(y)` views a CUDA result in place.

    Lifetime: the capsule holds a reference to the HAL buffer, so the torch tensor keeps the
    memory alive after this object is gone; the HAL devices live as long as the process. A call
    has finished writing its results when it returns, so no stream order is needed."""

    # The address of the memory MyeLiN allocated for this result (myelin.runtime.
    # result_storage), where the call wrote it; None when IREE allocated the result.
    storage_pointer: int | None = None
    # Why a result IREE allocated has no storage of MyeLiN's (for the BufferError).
    not_exported: str = NOT_ASKED

    def __init__(self, device: rt.HalDevice, view: rt.HalBufferView, *, cuda: bool, **kwargs: Any):
        super().__init__(device, view, **kwargs)
        self._cuda = cuda

    def _copy_to_host(self) -> np.ndarray:
        # IREE's DeviceArray calls this for memory the host cannot map; its own version imports
        # an unaligned numpy array, which Vulkan refuses (myelin.runtime.host_transfer).
        return read_to_host(self._device, self._buffer_view, self.dtype)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, 0) if self._cuda else (1, 0)  # kDLCUDA or kDLCPU

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        # The call has finished writing its results when it returns: no stream order needed.
        if not self._cuda and self.storage_pointer is None:
            return np.asarray(self.to_host()).__dlpack__()  # host memory IREE allocated
        try:
            return self._device.create_dlpack_capsule(self._buffer_view, *self.__dlpack_device__())
        except RuntimeError as e:
            # IREE 3.13's CUDA allocator exports only memory it imported (a caller's tensor,
            # MyeLiN's result storage, or a result that aliases one of them).
            raise BufferError(
                "this result lives in memory IREE allocated, which IREE 3.13 cannot export "
                f"through DLPack: {self.not_exported}; or pass storage with out=, or use "
                f".to_host() ({_first_line(e)})"
            ) from e


_OUTPUT_ARGUMENT = re.compile(r"%input(\d+): [^,{)]*\{[^}]*iree\.abi\.output = (\d+)")


def output_arguments(declaration: str | None) -> tuple[tuple[int, int], ...]:
    """(argument, result) pairs of the arguments an entrypoint writes its results into, read
    from its `iree.abi.declaration` (`%input2: tensor<...> {iree.abi.output = 0 : index}`)."""
    if not declaration:
        return ()
    return tuple((int(a), int(r)) for a, r in _OUTPUT_ARGUMENT.findall(declaration))


_TWIN_RESULT = re.compile(r"%input(\d+): !hal\.buffer_view \{[^}]*myelin\.result = (\d+)")


def twin_arguments(declaration: str | None) -> tuple[tuple[int, int], ...]:
    """(argument, result) pairs of a storage twin's result storage, from its declaration
    (myelin.compiler.result_storage marks them `myelin.result`; twins built before the
    transient argument existed marked them `iree.abi.output`)."""
    if not declaration:
        return ()
    pairs = tuple((int(a), int(r)) for a, r in _TWIN_RESULT.findall(declaration))
    return pairs or output_arguments(declaration)


def twin_storage_view(
    value: Any,
    spec: TensorSpec,
    element: int | None,
    device: rt.HalDevice,
    entrypoint: str,
    cuda: bool,
) -> Any:
    """`out=` storage for a storage twin: a device array on `device` or, on a CUDA device, a
    torch CUDA tensor (imported in place), of the result's dtype (HAL element type `element`;
    None: not checked), rank and static dims; as a buffer view. IREE writes the result into
    it (its size is asserted by IREE, not here)."""
    if cuda and _dlpack_device(value)[0] == KDL_CUDA:
        value = import_cuda_tensor(value, device, spec, entrypoint)
    if not is_device_array(value) or device_of(value) is not device:
        raise InputError(
            f"{entrypoint}: out= for result '{spec.name}' must be a device array on the "
            f"entrypoint's device{' or a CUDA torch tensor' if cuda else ''}, got "
            f"{type(value).__name__}"
        )
    view = buffer_view_of(value)
    expected = tuple(spec.shape or ())
    shape = tuple(view.shape)
    if (
        len(shape) != len(expected)
        or any(e is not None and e != d for e, d in zip(expected, shape, strict=True))
        or (element is not None and view.element_type != element)
    ):
        raise InputError(
            f"{entrypoint}: out= for result '{spec.name}' is {list(shape)} of element type "
            f"{view.element_type}; the result is {spec.dtype}{list(expected)}"
        )
    return view


def with_output_arguments(
    entrypoint: str,
    inputs: tuple[Any, ...],
    outs: tuple[Any, ...],
    pairs: tuple[tuple[int, int], ...],
) -> tuple[Any, ...]:
    """The call's arguments with `out=` placed where the entrypoint takes result storage."""
    if not pairs:
        raise InputError(
            f"{entrypoint}: out= given, but the entrypoint takes no result storage; mark an "
            "argument of its source {iree.abi.output = 0 : index} to write result 0 into it"
        )
    if len(outs) != len(pairs):
        raise InputError(
            f"{entrypoint}: out= has {len(outs)} tensor(s); the entrypoint writes "
            f"{len(pairs)} result(s) into caller storage"
        )
    values = list(inputs)
    for (argument, _), value in sorted(zip(pairs, outs, strict=True)):
        values.insert(argument, value)
    return tuple(values)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def check_inputs(entrypoint: str, specs: Sequence[TensorSpec], values: Sequence[Any]) -> None:
    if len(values) != len(specs):
        expected = ", ".join(s.describe() for s in specs) or "no arguments"
        which = "missing" if len(values) < len(specs) else "extra"
        names = (
            ", ".join(f"'{s.name}'" for s in specs[len(values) :])
            if len(values) < len(specs)
            else f"{len(values) - len(specs)} extra"
        )
        raise InputError(
            f"{entrypoint}: {which} argument(s) {names}: got {len(values)} argument(s), "
            f"expected {len(specs)} ({expected})"
        )
    for spec, value in zip(specs, values, strict=True):
        check_input(entrypoint, spec, value)
    check_named_dims(entrypoint, specs, values)


def shared_dims(specs: Sequence[TensorSpec]) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    """Dynamic dims the signature gives one name (`batch`, `seq`), as (name, ((input, axis), ...))
    for every name that two or more dims share, in argument order."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, spec in enumerate(specs):
        for axis, (size, name) in enumerate(zip(spec.shape or (), spec.dims, strict=False)):
            if size is None and isinstance(name, str):
                groups.setdefault(name, []).append((i, axis))
    return [(name, tuple(members)) for name, members in groups.items() if len(members) > 1]


def check_named_dims(entrypoint: str, specs: Sequence[TensorSpec], values: Sequence[Any]) -> None:
    """Dims of one name must have one size: the graph was exported assuming so, and IREE would
    fail deep inside or compute garbage otherwise."""
    for name, ((i, axis), *others) in shared_dims(specs):
        size = int(values[i].shape[axis])
        for j, other_axis in others:
            got = int(values[j].shape[other_axis])
            if got != size:
                raise InputError(
                    f"{entrypoint}: argument '{specs[j].name}' has size {got} in dimension "
                    f"{other_axis} ('{name}'), but '{specs[i].name}' has {size} in its dimension "
                    f"{axis}; dimensions named '{name}' must be equal"
                )


def check_input(entrypoint: str, spec: TensorSpec, value: Any) -> None:
    if spec.is_scalar:
        return
    shape = tuple(value.shape)
    dtype = str(value.dtype) if not is_device_array(value) else _device_dtype(value)
    expected_shape = "x".join("?" if d is None else str(d) for d in spec.shape or ())
    if dtype != spec.dtype:
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' has dtype {dtype}, expected {spec.dtype} "
            f"(shape {expected_shape}); convert it with .astype('{spec.dtype}')"
        )
    if len(shape) != len(spec.shape or ()):
        raise InputError(
            f"{entrypoint}: argument '{spec.name}' has rank {len(shape)} (shape "
            f"{'x'.join(map(str, shape)) or 'scalar'}), expected rank {len(spec.shape or ())} "
            f"(shape {expected_shape})"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape or (), strict=True)):
        if want is not None and got != want:
            raise InputError(
                f"{entrypoint}: argument '{spec.name}' has size {got} in dimension {axis}, "
                f"expected {want} (shape {expected_shape}, got {'x'.join(map(str, shape))})"
            )


DimLimit = tuple[int, int, int, str]  # input position, axis, largest size, why


def dim_limits(specs: Sequence[TensorSpec]) -> tuple[DimLimit, ...]:
    """The dynamic dims the build found a largest size for (myelin.compiler.index_ranges)."""
    return tuple(
        (i, axis, limit[0], limit[1])
        for i, s in enumerate(specs)
        for axis, limit in enumerate(s.limits)
        if limit is not None
    )


def check_dim_limits(
    entrypoint: str, specs: Sequence[TensorSpec], limits: Sequence[DimLimit], values: Sequence[Any]
) -> None:
    """Refuse a size past the largest the graph supports: IREE would read past a table (torch
    raises IndexError there)."""
    for position, axis, largest, why in limits:
        size = int(values[position].shape[axis])
        if size > largest:
            spec = specs[position]
            raise InputError(
                f"{entrypoint}: argument '{spec.name}' has size {size} in dimension {axis} "
                f"('{spec.dims[axis]}'), but the model supports at most {largest} there: {why}"
            )


IndexCheck = tuple[int, str, int, int]  # input position, name, lo, hi


def index_checks(specs: Sequence[TensorSpec]) -> tuple[IndexCheck, ...]:
    """The inputs that carry a valid range (they index a table), as (position, name, lo, hi)."""
    return tuple(
        (i, s.name, *s.valid_range) for i, s in enumerate(specs) if s.valid_range is not None
    )


def check_index_ranges(
    entrypoint: str, checks: Sequence[IndexCheck], values: Sequence[Any]
) -> None:
    """Refuse an index outside its table before IREE reads memory with it: one vectorized
    reduction per input (`_within`), and only on failure a search for the first bad element.
    Device arrays are not read back (that would cost a download): they are not checked."""
    for position, name, lo, hi in checks:
        value = values[position]
        if is_device_array(value):
            continue
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if array.size == 0 or _within(array, lo, hi):
            continue
        flat = int(np.argmax((array < lo) | (array >= hi)))
        where = ", ".join(str(int(i)) for i in np.unravel_index(flat, array.shape))
        raise InputError(
            f"{entrypoint}({name}): value {array.flat[flat]} at [{where}] is out of range "
            f"[{lo}, {hi})"
        )


def _within(array: np.ndarray, lo: int, hi: int) -> bool:
    """All of `array` in [lo, hi): for lo == 0 (embeddings) one pass, the maximum of the bits
    read as unsigned (a negative value reads as a huge one); else a minimum and a maximum. The
    reductions are compared as Python ints: comparing numpy scalars costs microseconds."""
    if lo == 0 and array.dtype.kind == "i":
        unsigned = array.view(np.dtype(f"u{array.dtype.itemsize}"))
        return int(np.maximum.reduce(unsigned, axis=None)) < hi
    return int(np.minimum.reduce(array, axis=None)) >= lo and (
        int(np.maximum.reduce(array, axis=None)) < hi
    )


def _device_dtype(value: Any) -> str:
    return str(np.dtype(value.dtype))
