"""The shared part of the two 16-bit float codecs: store the parameter in a narrower float type,
decode with one `arith.extf` (a bit-extend, so IREE treats it as dequantization)."""

from __future__ import annotations

import numpy as np

from myelin.codecs._contract import (
    Layout,
    StoredPart,
    from_storage,
    output_block,
    permuted,
    to_storage,
)
from myelin.codecs._cpu_kernels import FLOAT_BLOCKS
from myelin.dtypes import numpy_dtype


def layout(
    name: str,
    element: str,
    storage: str,
    shape: tuple[int, ...],
    dtype: str,
    reduce_axes: tuple[int, ...],
    order: tuple[int, ...],
    *,
    blocked: bool = False,
) -> Layout | str:
    """`blocked`: K-major rank-2 weights stored in blocks of outputs (see FLOAT_BLOCKS)."""
    if dtype != "float32":
        return f"{name} narrows float32 weights; this one is {dtype} already"
    stored, index = permuted(shape, order)
    by_block = output_block(shape, reduce_axes, order, FLOAT_BLOCKS) if blocked else None
    if by_block is not None:
        _, block = by_block
        k_index, n_index = index
        stored = (stored[1] // block, stored[0], block)
        index = (f"{n_index} floordiv {block}", k_index, f"{n_index} mod {block}")
    part = StoredPart("data", "", element, stored, index, storage, stored)
    return Layout(
        name,
        dtype,
        shape,
        reduce_axes,
        (part,),
        (f"%r = arith.extf %p0 : {element} to f32",),
        f"{storage}, decoded to float32 next to each consumer" + _axes(order, by_block),
        order=order,
        blocked=by_block,
    )


def _axes(order: tuple[int, ...], by_block: tuple[int, int] | None) -> str:
    if by_block is not None:
        return f"; stored [N / {by_block[1]}, K, {by_block[1]}] (blocks of outputs, K-major)"
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
