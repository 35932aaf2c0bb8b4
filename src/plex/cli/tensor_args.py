"""Command-line tensors, in IREE's convention: `@file.npy`, `2x3xf32=1,2,3,4,5,6`, `4x16xf32=0.5`
(one value fills the tensor), `i32=7` (a scalar).

A literal is checked before any array exists: every value must fit its element type (numpy
would wrap `300` into an i8 as 44 without a word) and the tensor must fit in this machine's
memory, so a typo is one error line instead of a wrong answer or an allocation that never ends.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from myelin.dtypes import MLIR_TO_NUMPY, NUMPY_TO_MLIR, numpy_dtype
from myelin.signature import Signature, TensorSpec
from plex.errors import PlexError

_SPEC = re.compile(
    r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-zA-Z]+\d*[A-Za-z0-9]*)=(?P<values>.*)$", re.S
)
_SPECIAL_FLOATS = frozenset({"inf", "+inf", "-inf", "nan", "+nan", "-nan", "infinity", "-infinity"})


class TensorArgError(PlexError):
    """A --input value is not a .npy reference or a SHAPExTYPE=VALUES literal that fits."""


def parse_tensor_arg(text: str) -> np.ndarray:
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise TensorArgError(f"--input {text}: file {path} does not exist") from None
        except (ValueError, OSError) as e:
            raise TensorArgError(f"--input {text}: {path} is not a .npy array ({e})") from None
    m = _SPEC.match(text.strip())
    if m is None:
        raise TensorArgError(
            f"--input {text!r}: expected @file.npy or SHAPExTYPE=VALUES "
            "such as 2x3xf32=1,2,3,4,5,6 or 4x16xf32=0.5"
        )
    element = m.group("dtype")
    dtype_name = MLIR_TO_NUMPY.get(element)
    if dtype_name is None:
        raise TensorArgError(
            f"--input {text!r}: unknown element type '{element}' "
            f"(accepted: {', '.join(k for k in MLIR_TO_NUMPY if k != 'index')})"
        )
    dtype = numpy_dtype(dtype_name)
    shape = tuple(int(d) for d in m.group("shape").split("x") if d)
    count = math.prod(shape)
    _check_fits_in_memory(text, shape, count, element, dtype.itemsize)
    raw = [v for v in re.split(r"[,\s]+", m.group("values").strip()) if v]
    values = [_parse_value(text, v, element, dtype) for v in raw]
    if len(values) == 1:
        return np.full(shape, values[0], dtype=dtype)
    if len(values) != count:
        raise TensorArgError(
            f"--input {text!r}: shape {'x'.join(map(str, shape)) or 'scalar'} needs {count} "
            f"values, got {len(values)}"
        )
    return np.array(values, dtype=dtype).reshape(shape)


def _parse_value(text: str, value: str, element: str, dtype: np.dtype) -> int | float | bool:
    """One literal value as a Python number that `dtype` holds exactly (ints) or without
    overflowing to infinity (floats)."""
    if dtype.kind == "b":
        if value.lower() in ("1", "true"):
            return True
        if value.lower() in ("0", "false"):
            return False
        raise TensorArgError(
            f"--input {text!r}: {element} values are 0/1 or true/false, got {value!r}"
        )
    if dtype.kind in "iu":
        try:
            number = int(value, 0) if value.lower().startswith(("0x", "-0x")) else int(value)
        except ValueError:
            raise TensorArgError(
                f"--input {text!r}: {element} values must be integers, got {value!r}"
            ) from None
        info = np.iinfo(dtype)
        if not info.min <= number <= info.max:
            raise TensorArgError(
                f"--input {text!r}: value {number} is out of range for {element} "
                f"[{info.min}, {info.max}]"
            )
        return number
    try:
        number = float(value)
    except ValueError:
        raise TensorArgError(
            f"--input {text!r}: {element} values must be numbers, got {value!r}"
        ) from None
    if math.isfinite(number) or value.lower() in _SPECIAL_FLOATS:
        largest = float(_finfo(dtype).max)
        if math.isfinite(number) and abs(number) > largest:
            raise TensorArgError(
                f"--input {text!r}: value {value} overflows {element} (largest finite value "
                f"{largest:g}); write inf for infinity"
            )
        return number
    raise TensorArgError(
        f"--input {text!r}: value {value} overflows {element}; write inf for infinity"
    )


def _finfo(dtype: np.dtype) -> object:
    if dtype.kind == "f" and dtype.name in ("float16", "float32", "float64"):
        return np.finfo(dtype)
    import ml_dtypes  # bfloat16 and float8: numpy's finfo does not know them

    return ml_dtypes.finfo(dtype)


def _check_fits_in_memory(
    text: str, shape: tuple[int, ...], count: int, element: str, size: int
) -> None:
    need = count * size
    have = _physical_memory()
    if have is not None and need > have:
        raise TensorArgError(
            f"--input {text!r}: shape {'x'.join(map(str, shape))} is {count:,} {element} values "
            f"({_size(need)}), more than this machine's memory ({_size(have)})"
        )


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system that reports it
        return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def dynamic_dim_names(signature: Signature) -> list[str]:
    """Names of the signature's dynamic dims as `plex inspect` shows them, in argument order."""
    names: list[str] = []
    for spec in signature.inputs:
        for size, name in zip(spec.shape or (), spec.dims, strict=False):
            if size is None and str(name) not in names:
                names.append(str(name))
    return names


def synthetic_inputs(
    signature: Signature, dims: dict[str, int], entrypoint: str, seed: int = 0
) -> list:
    """Random inputs matching a signature; dynamic dims take --dim values (default 1).

    A --dim name that matches no dynamic dim is refused: ignoring it would time or profile
    another shape than the one asked for."""
    valid = dynamic_dim_names(signature)
    unknown = [name for name in dims if name != "*" and name not in valid]
    if unknown:
        has = (
            f"its dynamic dims are {', '.join(valid)} (or * for all)"
            if valid
            else "it has no dynamic dims"
        )
        raise TensorArgError(
            f"--dim {unknown[0]}={dims[unknown[0]]}: {entrypoint} has no dynamic dim named "
            f"'{unknown[0]}'; {has}"
        )
    rng = np.random.default_rng(seed)
    values = []
    for spec in signature.inputs:
        if spec.shape is None:
            values.append(numpy_dtype(spec.dtype).type(1))
            continue
        shape = [
            d if d is not None else dims.get(str(n), dims.get("*", 1))
            for d, n in zip(spec.shape, spec.dims, strict=True)
        ]
        dtype = numpy_dtype(spec.dtype)
        if dtype.kind == "f":
            values.append(rng.standard_normal(shape).astype(dtype))
        else:
            values.append(rng.integers(0, 2, size=shape).astype(dtype))
    return values


def parse_dims(texts: list[str]) -> dict[str, int]:
    """`--dim NAME=N` values (names as `plex inspect` shows them, or `*` for every dim)."""
    sizes = {}
    for text in texts:
        name, _, value = text.partition("=")
        if not name or not value.isdigit():
            raise TensorArgError(f"--dim {text!r}: expected NAME=N, e.g. x.0=8 or *=8")
        sizes[name] = int(value)
    return sizes


def cli_inputs(inputs: list[str], dims: list[str], signature: Signature, entrypoint: str) -> list:
    """The arguments of `plex bench` / `plex profile`: --input values, else random tensors sized
    by --dim. Either way they are checked against the signature here, so a wrong shape is the
    same clear error in every verb (not a failure deep inside IREE's tools)."""
    from myelin.runtime.tensors import as_host_array, check_inputs

    if inputs and dims:
        raise TensorArgError("--dim sizes the random inputs; it has no effect with --input")
    if inputs:
        args = [parse_tensor_arg(t) for t in inputs]
    else:
        args = synthetic_inputs(signature, parse_dims(dims), entrypoint)
    specs = signature.inputs
    values = [as_host_array(v, s, entrypoint) for v, s in zip(args, specs, strict=False)]
    values.extend(args[len(specs) :])
    check_dtypes(entrypoint, specs, values)
    check_inputs(entrypoint, specs, values)
    return values


def check_dtypes(entrypoint: str, specs: Sequence[TensorSpec], values: Sequence[object]) -> None:
    """Refuse a host argument of the wrong element type in the command line's terms: the runtime
    suggests numpy's `.astype(...)`, which a user of `--input 2x16xbf16=1` cannot type."""
    for spec, value in zip(specs, values, strict=False):
        if spec.is_scalar or not isinstance(value, np.ndarray):
            continue
        got, want = str(value.dtype), spec.dtype
        if got == want:
            continue
        element = NUMPY_TO_MLIR.get(want, want)
        shape = "x".join("?" if d is None else str(d) for d in spec.shape or ())
        example = "".join(f"{1 if d is None else d}x" for d in spec.shape or ())
        raise TensorArgError(
            f"{entrypoint}: argument '{spec.name}' has element type "
            f"{NUMPY_TO_MLIR.get(got, got)}, expected {element} (shape {shape}); give it as "
            f"{element}, e.g. --input {example}{element}=1 (a .npy file: saved as {want})"
        )


def describe_inputs(specs: Sequence[TensorSpec], values: Sequence[object]) -> str:
    """`x=4x16xf32, ids=2x8xi64`: the shapes a bench or profile actually used."""
    parts = []
    for spec, value in zip(specs, values, strict=False):
        if isinstance(value, np.ndarray):
            element = NUMPY_TO_MLIR.get(str(value.dtype), str(value.dtype))
            parts.append(f"{spec.name}={''.join(f'{d}x' for d in value.shape)}{element}")
        else:
            parts.append(f"{spec.name}={value!r}")
    return ", ".join(parts) or "no inputs"


def format_tensor(value: object) -> str:
    if isinstance(value, np.ndarray):
        element = NUMPY_TO_MLIR.get(str(value.dtype), str(value.dtype))
        shape = "".join(f"{d}x" for d in value.shape)
        body = np.array2string(value, threshold=64, edgeitems=4, precision=6)
        return f"{shape}{element}=\n{body}"
    return repr(value)
