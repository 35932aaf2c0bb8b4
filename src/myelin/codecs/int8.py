"""int8: symmetric 8-bit integers with one float32 scale per output channel.

The scale is shared along the axes a consumer contracts (`reduce_axes`: the K of a matmul, the
input channels and window of a conv; the columns of an embedding table, so each row decodes on
its own), and differs along the others (the output channels). w ~= q * scale, q in [-127, 127].
"""

from __future__ import annotations

import numpy as np

from myelin.codecs._contract import (
    Layout,
    StoredPart,
    from_storage,
    no_options,
    permuted,
    to_storage,
)

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
    data = StoredPart("data", "", "i8", stored, index, "int8", stored)
    scale_shape = tuple(shape[i] for i in kept)
    scale = StoredPart(
        "scale",
        ".scale",
        "f32",
        scale_shape,
        tuple(f"d{i}" for i in kept),
        "float32",
        scale_shape,
    )
    where = f"axes {list(kept)}" if kept else "the whole tensor"
    return Layout(
        NAME,
        dtype,
        shape,
        reduce_axes,
        (data, scale),
        ("%q = arith.sitofp %p0 : i8 to f32", "%r = arith.mulf %q, %p1 : f32"),
        f"int8 values, one float32 scale per index of {where}"
        + ("" if list(order) == sorted(order) else f"; axes stored in order {list(order)}"),
        order=order,
        scaled=("%r = arith.sitofp %p0 : i8 to f32",) if len(kept) == 1 else None,
    )


def _scale(array: np.ndarray, layout: Layout) -> np.ndarray:
    amax = np.max(np.abs(array), axis=layout.reduce_axes, keepdims=True)
    return np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    w = np.asarray(array, dtype=np.float32)
    scale = _scale(w, layout)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return [to_storage(q, layout), np.ascontiguousarray(scale.reshape(layout.parts[1].shape))]


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    q, scale = parts
    keep = [1 if i in layout.reduce_axes else n for i, n in enumerate(layout.logical_shape)]
    return from_storage(q, layout).astype(np.float32) * scale.astype(np.float32).reshape(keep)
