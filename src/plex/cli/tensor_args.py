"""Command-line tensors, in IREE's convention: `@file.npy`, `2x3xf32=1,2,3,4,5,6`, `4x16xf32=0.5`
(one value fills the tensor), `i32=7` (a scalar)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from myelin.dtypes import MLIR_TO_NUMPY, NUMPY_TO_MLIR, numpy_dtype
from myelin.signature import Signature
from plex.errors import PlexError

_SPEC = re.compile(r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-z]+\d*)=(?P<values>.*)$", re.S)


class TensorArgError(PlexError):
    """A --input value is not a .npy reference or a SHAPExTYPE=VALUES literal."""


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
    dtype_name = MLIR_TO_NUMPY.get(m.group("dtype"))
    if dtype_name is None:
        raise TensorArgError(
            f"--input {text!r}: unknown element type '{m.group('dtype')}' "
            f"(accepted: {', '.join(k for k in MLIR_TO_NUMPY if k != 'index')})"
        )
    shape = tuple(int(d) for d in m.group("shape").split("x") if d)
    raw = [v for v in re.split(r"[,\s]+", m.group("values").strip()) if v]
    try:
        values = np.array([float(v) if dtype_name.startswith("float") else int(v) for v in raw])
    except ValueError:
        raise TensorArgError(f"--input {text!r}: values must be numbers") from None
    count = int(np.prod(shape)) if shape else 1
    if len(values) == 1:
        values = np.full(count, values[0])
    if len(values) != count:
        raise TensorArgError(
            f"--input {text!r}: shape {'x'.join(map(str, shape)) or 'scalar'} needs {count} "
            f"values, got {len(values)}"
        )
    return values.astype(dtype_name).reshape(shape)


def synthetic_inputs(signature: Signature, dims: dict[str, int], seed: int = 0) -> list:
    """Random inputs matching a signature; dynamic dims take --dim values (default 1)."""
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
        if not value.isdigit():
            raise TensorArgError(f"--dim {text!r}: expected NAME=N, e.g. x.0=8 or *=8")
        sizes[name] = int(value)
    return sizes


def format_tensor(value: object) -> str:
    if isinstance(value, np.ndarray):
        element = NUMPY_TO_MLIR.get(str(value.dtype), str(value.dtype))
        shape = "".join(f"{d}x" for d in value.shape)
        body = np.array2string(value, threshold=64, edgeitems=4, precision=6)
        return f"{shape}{element}=\n{body}"
    return repr(value)
