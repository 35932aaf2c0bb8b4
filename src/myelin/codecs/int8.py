"""int8: symmetric 8-bit integers with one float32 scale per output channel.

The scale is shared along the axes a consumer contracts (`reduce_axes`: the K of a matmul, the
input channels and window of a conv; the columns of an embedding table, so each row decodes on
its own), and differs along the others (the output channels). w ~= q * scale, q in [-127, 127].

A matmul's K-major codes are stored in blocks of outputs, [N / B][K][B] (INT8_BLOCKS), and the IR
reads the scale, still stored [N], as [N / B][B]: the CPU matvec kernel then streams each
block's rows contiguously (docs/codecs.md, "CPU matvec kernels").
"""

from __future__ import annotations

import numpy as np

from myelin.codecs._contract import (
    Layout,
    StoredPart,
    from_storage,
    no_options,
    output_block,
    permuted,
    to_storage,
)
from myelin.codecs._cpu_kernels import INT8_BLOCKS

NAME = "int8"
parse_options = no_options
_FLOATS = ("float32", "float16", "bfloat16")


def layout(
    shape: tuple[int, ...], dtype: str, reduce_axes: tuple[int, ...], options: dict
) -> Layout | str:
    if dtype not in _FLOATS:
        return f"int8 encodes floating-point weights; this one is {dtype}"
    rank = len(shape)
    kept = tuple(i for i in range(rank) if i not in reduce_axes)
    order = options["order"]
    stored, index = permuted(shape, order)
    scale_shape = stored_scale = tuple(shape[i] for i in kept)
    scale_index = tuple(f"d{i}" for i in kept)
    by_block = output_block(shape, reduce_axes, order, INT8_BLOCKS)
    if by_block is not None:
        _, block = by_block
        k_index, n_index = index
        stored = (stored[1] // block, stored[0], block)
        index = (f"{n_index} floordiv {block}", k_index, f"{n_index} mod {block}")
        scale_shape = (stored[0], block)
        scale_index = (f"{n_index} floordiv {block}", f"{n_index} mod {block}")
    data = StoredPart("data", "", "i8", stored, index, "int8", stored)
    scale = StoredPart("scale", ".scale", "f32", scale_shape, scale_index, "float32", stored_scale)
    where = f"axes {list(kept)}" if kept else "the whole tensor"
    return Layout(
        NAME,
        dtype,
        shape,
        reduce_axes,
        (data, scale),
        ("%q = arith.sitofp %p0 : i8 to f32", "%r = arith.mulf %q, %p1 : f32"),
        f"int8 values, one float32 scale per index of {where}" + _axes(order, by_block),
        order=order,
        blocked=by_block,
        scaled=("%r = arith.sitofp %p0 : i8 to f32",) if len(kept) == 1 else None,
    )


def _axes(order: tuple[int, ...], by_block: tuple[int, int] | None) -> str:
    if by_block is not None:
        return f"; stored [N / {by_block[1]}, K, {by_block[1]}] (blocks of outputs, K-major)"
    return "" if list(order) == sorted(order) else f"; axes stored in order {list(order)}"


def _scale(array: np.ndarray, layout: Layout) -> np.ndarray:
    amax = np.max(np.abs(array), axis=layout.reduce_axes, keepdims=True)
    return np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    w = np.asarray(array, dtype=np.float32)
    scale = _scale(w, layout)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    stored_scale = scale.reshape(layout.parts[1].storage_shape)
    return [to_storage(q, layout), np.ascontiguousarray(stored_scale)]


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    q, scale = parts
    keep = [1 if i in layout.reduce_axes else n for i, n in enumerate(layout.logical_shape)]
    return from_storage(q, layout).astype(np.float32) * scale.astype(np.float32).reshape(keep)
