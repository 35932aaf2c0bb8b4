"""Turning user tensors into call arguments and results back into numpy, with signature checks.

Validation happens before anything reaches IREE, so a wrong rank, dtype or size is one clear
InputError naming the argument, not a HAL assertion from inside the VM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from myelin.errors import InputError
from myelin.runtime._iree_private import is_device_array
from myelin.signature import TensorSpec


def as_host_array(value: Any, spec: TensorSpec, entrypoint: str) -> Any:
    """numpy arrays pass through; DLPack tensors (torch CPU, jax CPU...) are viewed zero-copy;
    Python scalars become 0-d values. Device arrays returned by an earlier call pass through."""
    if isinstance(value, np.ndarray):
        return value
    if is_device_array(value):  # stays on its device
        return value
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
    if isinstance(value, (list, tuple, int, float)):
        return np.asarray(value, dtype=spec.dtype)
    raise InputError(
        f"{entrypoint}: argument '{spec.name}' has type {type(value).__name__}; "
        "expected a numpy array or a DLPack tensor"
    )


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


