"""q4: 4-bit unsigned integers in groups along the contracted axis; each group has its own
scale and zero point: w ~= (q - zero) * scale, q and zero in [0, 15].

Storage is [output, group, block], two values per byte (the even element in the low nibble):
the contracted axis K of a [K, N] or [N, K] weight is split into K / g groups of g values
(`q4:g16`, `q4:g64`; default 32). Rows stay independently addressable, so an embedding gather
decodes only the rows it reads.

The group scales are themselves quantized (as in llama.cpp's k-quants): an 8-bit scale per
group times one float32 scale per output row; zero points are 4-bit. Per weight that is
0.5 + 1.5/g bytes: 0.547 at g=32 (0.137x float32), 0.594 at g=16 (0.148x), against 0.59 and
0.69 with float16 scales and uint8 zeros, at the same accuracy (docs/codecs.md).

The IR views the data as [output, K] i4 (the same bytes), so the big operand is read with an
identity map and only the per-group scale and zero point use `k floordiv g`.
"""

from __future__ import annotations

import re

import numpy as np

from myelin.codecs import Layout, StoredPart

NAME = "q4"
DEFAULT_GROUP = 32
_FLOATS = ("float32", "float16", "bfloat16")


def parse_options(text: str | None) -> dict:
    if text is None:
        return {"group": DEFAULT_GROUP}
    m = re.fullmatch(r"g([0-9]+)", text)
    if m is None:
        raise ValueError("q4 takes a group size, written q4:g<n> (e.g. q4:g64)")
    group = int(m.group(1))
    if group < 2 or group % 2:
        raise ValueError(f"the group size must be an even number >= 2, got {group}")
    return {"group": group}


def layout(
    shape: tuple[int, ...], dtype: str, reduce_axes: tuple[int, ...], options: dict
) -> Layout | str:
    group = options["group"]
    if dtype not in _FLOATS:
        return f"q4 encodes floating-point weights; this one is {dtype}"
    if len(shape) != 2:
        return f"q4 needs a rank-2 weight (a matrix or an embedding table), not {list(shape)}"
    if len(reduce_axes) != 1:
        return "q4 needs exactly one contracted axis (matmul or gather); use int8"
    axis = reduce_axes[0]
    out = 1 - axis
    k, n = shape[axis], shape[out]
    if k % group:
        return f"q4:g{group} needs the contracted size {k} to be a multiple of {group}"
    groups = k // group
    d_out, d_k = f"d{out}", f"d{axis}"
    by_group = (d_out, f"{d_k} floordiv {group}")
    # IREE packs i4 tensors two per byte when their inner dim is even; else zeros take a byte.
    zero_element, zero_storage = ("i4", "uint4") if groups % 2 == 0 else ("i8", "uint8")
    parts = (
        StoredPart("data", "", "i4", (n, k), (d_out, d_k), "uint4", (n, groups, group)),
        StoredPart("scale", ".scale", "i8", (n, groups), by_group, "uint8", (n, groups)),
        StoredPart("zero", ".zero", zero_element, (n, groups), by_group, zero_storage, (n, groups)),
        StoredPart("row_scale", ".row_scale", "f32", (n,), (d_out,), "float32", (n,)),
    )
    return Layout(
        f"{NAME}:g{group}",
        dtype,
        shape,
        reduce_axes,
        parts,
        (
            "%qi = arith.extui %p0 : i4 to i32",
            f"%zi = arith.extui %p2 : {zero_element} to i32",
            "%qz = arith.subi %qi, %zi : i32",
            "%qf = arith.sitofp %qz : i32 to f32",
            "%si = arith.extui %p1 : i8 to i32",
            "%sf = arith.uitofp %si : i32 to f32",
            "%s = arith.mulf %sf, %p3 : f32",
            "%r = arith.mulf %qf, %s : f32",
        ),
        f"4-bit values as [output, group, block] with block {group}; per group an 8-bit scale "
        "(times a float32 scale per output row) and a 4-bit zero point",
        {"group": group},
    )


def _grouped(array: np.ndarray, layout: Layout) -> np.ndarray:
    """The weight as [output, group, block] float32."""
    w = np.asarray(array, dtype=np.float32)
    if layout.reduce_axes[0] == 0:
        w = w.T
    n, groups, group = layout.parts[0].storage_shape
    return w.reshape(n, groups, group)


def pack(values: np.ndarray) -> np.ndarray:
    """uint4 values (one per uint8, an even count) packed two per byte, low nibble first."""
    flat = np.asarray(values, dtype=np.uint8).reshape(-1)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray, count: int) -> np.ndarray:
    """The uint4 values of `packed` (low nibble first), as uint8."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    out = np.empty(b.size * 2, dtype=np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    return out[:count]


def _scales(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(8-bit group scales, float32 row scales, group scales as float32, zero points)."""
    lo = np.minimum(g.min(axis=2), 0.0)  # 0 stays exact: zero points are integers
    hi = np.maximum(g.max(axis=2), 0.0)
    step = (hi - lo) / 15.0
    row = (step.max(axis=1) / 255.0).astype(np.float32)
    row = np.where(row > 0, row, np.float32(1.0)).astype(np.float32)
    # Round the 8-bit scale up, so the group's range still fits in 16 levels.
    scale8 = np.clip(np.ceil(step / row[:, None]), 1, 255).astype(np.uint8)
    scale = scale8.astype(np.float32) * row[:, None]
    zero = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    return scale8, row, scale, zero


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    g = _grouped(array, layout)
    scale8, row, scale, zero = _scales(g)
    q = np.clip(np.rint(g / scale[:, :, None]) + zero[:, :, None], 0, 15).astype(np.uint8)
    zeros = pack(zero) if layout.parts[2].element == "i4" else zero
    return [pack(q), scale8, zeros, row]


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    packed, scale8, zeros, row = parts
    n, groups, group = layout.parts[0].storage_shape
    q = unpack(packed, n * groups * group).reshape(n, groups, group).astype(np.int32)
    if layout.parts[2].element == "i4":
        zero = unpack(zeros, n * groups).reshape(n, groups)
    else:
        zero = np.asarray(zeros).reshape(n, groups)
    scale = scale8.astype(np.float32) * np.asarray(row, dtype=np.float32)[:, None]
    w = (q - zero.astype(np.int32)[:, :, None]).astype(np.float32) * scale[:, :, None]
    w = w.reshape(n, groups * group)
    return w.T if layout.reduce_axes[0] == 0 else w
