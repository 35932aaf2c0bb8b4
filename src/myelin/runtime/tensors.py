"""Turning user tensors into call arguments and results back into numpy, with signature checks.

Validation happens before anything reaches IREE, so a wrong rank, dtype or size is one clear
InputError naming the argument, not a HAL assertion from inside the VM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from myelin.errors import InputError
from myelin.signature import TensorSpec


def as_host_array(value: Any, spec: TensorSpec, entrypoint: str) -> Any:
    """numpy arrays pass through; DLPack tensors (torch CPU, jax CPU...) are viewed zero-copy;
    Python scalars become 0-d values. Device arrays returned by an earlier call pass through."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "_buffer_view"):  # iree.runtime.DeviceArray: stays on the device
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


def check_named_dims(entrypoint: str, specs: Sequence[TensorSpec], values: Sequence[Any]) -> None:
    """Dynamic dims the manifest gave one name (`batch`, `seq`) must have one size: the graph
    was exported assuming so, and IREE would fail deep inside or compute garbage otherwise."""
    seen: dict[str, tuple[str, int, int]] = {}  # dim name -> (argument, axis, size)
    for spec, value in zip(specs, values, strict=True):
        if spec.is_scalar:
            continue
        for axis, (want, name) in enumerate(zip(spec.shape or (), spec.dims, strict=False)):
            if want is not None or not isinstance(name, str):
                continue
            got = int(value.shape[axis])
            first = seen.setdefault(name, (spec.name, axis, got))
            if first[2] != got:
                raise InputError(
                    f"{entrypoint}: argument '{spec.name}' has size {got} in dimension {axis} "
                    f"('{name}'), but '{first[0]}' has {first[2]} in its dimension {first[1]}; "
                    f"dimensions named '{name}' must be equal"
                )


def check_input(entrypoint: str, spec: TensorSpec, value: Any) -> None:
    if spec.is_scalar:
        return
    shape = tuple(value.shape)
    dtype = str(value.dtype) if not hasattr(value, "_buffer_view") else _device_dtype(value)
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


def _device_dtype(value: Any) -> str:
    return str(np.dtype(value.dtype))
