"""The shared part of the two 16-bit float codecs: store the parameter in a narrower float type,
decode with one `arith.extf` (a bit-extend, so IREE treats it as dequantization)."""

from __future__ import annotations

import numpy as np

from myelin.codecs._contract import Layout, StoredPart, from_storage, permuted, to_storage
from myelin.dtypes import numpy_dtype


def layout(
    name: str,
    element: str,
    storage: str,
    shape: tuple[int, ...],
    dtype: str,
    reduce_axes: tuple[int, ...],
    order: tuple[int, ...],
) -> Layout | str:
    if dtype != "float32":
        return f"{name} narrows float32 weights; this one is {dtype} already"
    stored, index = permuted(shape, order)
    part = StoredPart("data", "", element, stored, index, storage, stored)
    return Layout(
        name,
        dtype,
        shape,
        reduce_axes,
        (part,),
        (f"%r = arith.extf %p0 : {element} to f32",),
        f"{storage}, decoded to float32 next to each consumer" + _axes(order),
        order=order,
    )


def _axes(order: tuple[int, ...]) -> str:
    return "" if list(order) == sorted(order) else f"; axes stored in order {list(order)}"


def encode(array: np.ndarray, storage: str, layout: Layout) -> list[np.ndarray]:
    target = numpy_dtype(storage)
    if storage == "bfloat16":
        import ml_dtypes

        info = ml_dtypes.finfo(target)
    else:
        info = np.finfo(target)
    # Saturate instead of overflowing to inf: a weight past the range is an outlier either way.
    clipped = np.clip(np.asarray(array, dtype=np.float32), float(info.min), float(info.max))
    return [to_storage(clipped.astype(target), layout)]


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    return from_storage(parts[0].astype(np.float32), layout)
