"""fp16: IEEE half precision storage (half the bytes of fp32; 11-bit mantissa, range +-65504)."""

from __future__ import annotations

import numpy as np

from myelin.codecs import _float
from myelin.codecs._contract import Layout, no_options

NAME = "fp16"
parse_options = no_options


def layout(
    shape: tuple[int, ...], dtype: str, reduce_axes: tuple[int, ...], options: dict
) -> Layout | str:
    return _float.layout(
        NAME, "f16", "float16", shape, dtype, reduce_axes, options["order"], blocked=True
    )


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    return _float.encode(array, "float16", layout)


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    return _float.decode(parts, layout)
