"""One mapping between MLIR element types and numpy dtypes, used by the compiler adapter (to
record signatures) and the runtime (to check inputs)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy loads only when a dtype object is asked for
    import numpy as np

# MLIR builtin integer types in IREE's ABI are signless; numpy needs a sign, and IREE's own
# Python bindings read them as signed. ui* / si* spellings are accepted for completeness.
MLIR_TO_NUMPY: dict[str, str] = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2": "float8_e5m2",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "si8": "int8",
    "si16": "int16",
    "si32": "int32",
    "si64": "int64",
    "ui8": "uint8",
    "ui16": "uint16",
    "ui32": "uint32",
    "ui64": "uint64",
    "index": "int64",
}

NUMPY_TO_MLIR: dict[str, str] = {
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8E4M3FN",
    "float8_e4m3fnuz": "f8E4M3FNUZ",
    "float8_e5m2": "f8E5M2",
    "float8_e5m2fnuz": "f8E5M2FNUZ",
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "ui8",
    "uint16": "ui16",
    "uint32": "ui32",
    "uint64": "ui64",
}


# dtypes numpy lacks; ml_dtypes (a dependency of iree-base-runtime) provides them
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a dtype name recorded in a .mln (bfloat16 and float8 need
    ml_dtypes)."""
    import numpy as np

    if name in ML_DTYPES:
        try:
            import ml_dtypes  # type: ignore[import-not-found]
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TypeError(f"{name} tensors need the 'ml_dtypes' package") from e
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


_WIDTH = re.compile(r"(?:b?float|u?int)(\d+)(?:_[a-z0-9]+)?")


def itemsize(name: str) -> int:
    """Bytes per element of a dtype name, read from the name (no numpy import: planning a
    build sizes parameters with it)."""
    if name == "bool":
        return 1
    width = _WIDTH.fullmatch(name)
    if name not in NUMPY_TO_MLIR or width is None:
        raise TypeError(f"data type {name!r} not understood")
    return int(width.group(1)) // 8
