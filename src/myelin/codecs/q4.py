"""q4: 4-bit unsigned integers in groups along the contracted axis; each group has its own
scale and offset: w ~= q * scale + offset, q in [0, 15].

Storage (format 7) keeps the axes in the order the consumer reads them, like int8 and fp16 do,
two values per byte along the innermost stored axis (the even element in the low nibble):

- a matmul weight is stored [K, N]: the consumer walks the contraction axis K and reads a
  contiguous run of output columns N at each step, so the 4-bit unpacking is a vector load plus
  shifts and masks (a torch Linear's [N, K] weight is stored transposed); since format 15 in
  blocks of outputs, [N / B][K][B] (B the first of Q4_BLOCKS dividing N, as fp16 and int8), its
  group factors [N / B][K / g][B] and its output factors still [N] (read as [N / B, B]): the
  CPU matvec kernels then stream one block contiguously (docs/codecs.md, "CPU matvec
  kernels");
- a gathered table (an embedding, [rows, columns], its columns "contracted") keeps its rows
  contiguous: [rows, columns], so a lookup decodes only the rows it reads.

The groups (`q4:g16`, `q4:g64`; default 32) run along the contracted axis in either case; the
per-group scale and offset are stored like the data with that axis divided by the group size.
Format 4 stored every weight [output, group, block] (output-major): the matvec read it across
output rows, one nibble at a time, which compiled to a scalar unpacking loop (2.6x slower than
fp32 on the Llama decode step). A format-4 .mln still runs as it is (its module decodes its own
layout); `decode` reads its parts through `format4_layout` (their recorded data shape is rank 3:
[output, group, block]; format 7 records the rank-2 stored shape).

The IR sees the data as [..., groups, group, ...] (the same bytes; blocked: [N / B, groups,
group, B]) and decodes over those loop dims, so every part is read through a plain projection
and IREE vectorizes the unpacking (myelin.codecs._emit: `Layout.split`, `Layout.blocked`;
myelin.codecs._chunked: the chunks a long contracted axis is cut into; myelin.codecs._blocked:
a contraction over the blocks).

The group scales and offsets are themselves quantized (as in llama.cpp's k-quants): an unsigned
8-bit scale and a signed 8-bit offset per group, each times a float32 factor per output. Per
weight that is 0.5 + 2/g bytes: 0.5625 at g=32 (0.141x float32).

Why fitted offsets rather than min/max with an integer zero point: round-to-nearest between a
group's min and max spends levels on its rare extremes. The encoder probes, per group, a few
clipped ranges with one least-squares step each (the rounding, then a linear fit of scale and
offset), and refines the best to its fixed point, keeping the smallest squared error (`_fit`).
On all-MiniLM-L6-v2 at g32 fitted ranges lifted the mean cosine to fp32 from 0.9750 (min/max,
integer zero) to 0.981 with format 11's wider search (docs/codecs.md).
"""

from __future__ import annotations

import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from myelin.codecs._contract import (
    Layout,
    StoredPart,
    from_storage,
    output_block,
    permuted,
    to_storage,
)
from myelin.codecs._cpu_kernels import Q4_BLOCKS

NAME = "q4"
DEFAULT_GROUP = 32
_FLOATS = ("float32", "float16", "bfloat16")
# The decode, w = code * s + b, in MLIR over the parts' scalars %p0 (the 4-bit code), %p1 (the
# group's 8-bit scale), %p2 (its 8-bit offset), %p3 and %p4 (the output's float factors).
_CODE = ("%qi = arith.extui %p0 : i4 to i32", "%code = arith.uitofp %qi : i32 to f32")
_GROUP_FACTORS = (
    "%si = arith.extui %p1 : i8 to i32",
    "%sf = arith.uitofp %si : i32 to f32",
    "%s = arith.mulf %sf, %p3 : f32",
    "%bi = arith.extsi %p2 : i8 to i32",
    "%bf = arith.sitofp %bi : i32 to f32",
    "%b = arith.mulf %bf, %p4 : f32",
)


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
    order = tuple(options.get("order") or (0, 1))
    stored, index = permuted(shape, order)
    if stored[-1] % 2:
        return f"q4 packs two values per byte along its innermost stored axis; {stored[-1]} is odd"
    by_group = tuple(
        f"{e} floordiv {group}" if a == axis else e for a, e in zip(order, index, strict=True)
    )
    grouped = tuple(d // group if a == axis else d for a, d in zip(order, stored, strict=True))
    # The data's IR global has the contracted axis as (group, element): the same bytes, and
    # every part is read through plain loop dims (see Layout.split).
    split_shape = tuple(
        x
        for a, d in zip(order, stored, strict=True)
        for x in ((d // group, group) if a == axis else (d,))
    )
    split_index = tuple(
        x
        for a, e in zip(order, index, strict=True)
        for x in ((f"{e} floordiv {group}", f"{e} mod {group}") if a == axis else (e,))
    )
    d_out = f"d{out}"
    data_storage = stored
    row_shape, row_index = (n,), (d_out,)
    by_block = output_block(shape, reduce_axes, order, Q4_BLOCKS)
    if by_block is not None:
        # K-major in blocks of outputs: [N / B][K][B] bytes, read as [N / B, K / g, g, B]
        block = by_block[1]
        blocks, within = f"{d_out} floordiv {block}", f"{d_out} mod {block}"
        data_storage = (n // block, k, block)
        split_shape = (n // block, k // group, group, block)
        split_index = (blocks, *split_index[:2], within)
        grouped = (n // block, k // group, block)
        by_group = (blocks, by_group[0], within)
        row_shape, row_index = (n // block, block), (blocks, within)
    parts = (
        StoredPart("data", "", "i4", split_shape, split_index, "uint4", data_storage),
        StoredPart("scale", ".scale", "i8", grouped, by_group, "uint8", grouped),
        StoredPart("offset", ".offset", "i8", grouped, by_group, "int8", grouped),
        StoredPart("row_scale", ".row_scale", "f32", row_shape, row_index, "float32", (n,)),
        StoredPart("row_offset", ".row_offset", "f32", row_shape, row_index, "float32", (n,)),
    )
    names = {axis: "K", out: "N"} if order[0] == axis else {axis: "columns", out: "rows"}
    axes = ", ".join(names[a] for a in order)
    if by_block is not None:
        axes = f"N / {by_block[1]}, K, {by_block[1]}"
    return Layout(
        f"{NAME}:g{group}",
        dtype,
        shape,
        reduce_axes,
        parts,
        (
            *_CODE,
            *_GROUP_FACTORS,
            "%qs = arith.mulf %code, %s : f32",
            "%r = arith.addf %qs, %b : f32",
        ),
        f"4-bit values stored [{axes}], two per byte along {names[order[-1]]}, "
        f"groups of {group} along {names[axis]}; per group an 8-bit scale and an 8-bit offset "
        "(each times a float32 factor per output)",
        {"group": group},
        order=order,
        split=(axis, group),
        blocked=by_block,
        grouped=((_CODE[0], "%r = arith.uitofp %qi : i32 to f32"), _GROUP_FACTORS),
    )


def _stored(output_major: np.ndarray, layout: Layout) -> np.ndarray:
    """A [output, ...] array (codes [n, k], or per group [n, k / g]) in its stored axis order."""
    logical = output_major.T if layout.reduce_axes[0] == 0 else output_major
    return to_storage(logical, layout)


def _output_major(stored: np.ndarray, layout: Layout) -> np.ndarray:
    """Inverse of `_stored` (`stored` in its stored shape: blocks of outputs unblocked here,
    since the parts' blocks differ in their middle axis)."""
    if layout.blocked is not None:
        blocks, outer, block = stored.shape
        stored = stored.transpose(1, 0, 2).reshape(outer, blocks * block)
    logical = from_storage(stored, replace(layout, blocked=None))
    return logical.T if layout.reduce_axes[0] == 0 else logical


def format4_layout(shape: tuple[int, ...], reduce_axis: int, group: int) -> Layout:
    """The layout of a q4 parameter written by codec format 4 ([output, group, block]): the
    format-7 layout with the output axis stored first, the same bytes."""
    found = layout(
        tuple(shape),
        "float32",
        (reduce_axis,),
        {"group": group, "order": (1 - reduce_axis, reduce_axis)},
    )
    assert not isinstance(found, str), found
    return found


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


LEVELS = 15  # the largest 4-bit code
# The clipped ranges tried per group: (low end, high end) as fractions of the group's min and
# max. 1.0/1.0 is plain min/max; least squares then moves the best one to its local optimum.
_CLIPS = (
    (1.0, 1.0),
    (0.9, 0.9),
    (0.8, 0.8),
    (0.7, 0.7),
    (0.9, 1.0),
    (1.0, 0.9),
    (0.8, 1.0),
    (1.0, 0.8),
)
_PROBE_STEPS = 1  # least-squares steps each clipped range gets before the ranges are compared
_REFINE_STEPS = 10  # steps the best range of each group then gets, at most
_ROWS_PER_CHUNK = 1024  # bounds each worker's temporaries to a few MiB
# numpy releases the GIL in its array loops, so chunks of rows run in parallel threads. This is
# on top of _apply's threads across parameters: one big embedding table would otherwise bound
# the encode step.
_WORKERS = min(4, os.cpu_count() or 1)


def _codes(x: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    q = x - offset
    q /= scale
    np.rint(q, out=q)
    return np.clip(q, 0, LEVELS, out=q)


def _refine(
    x: np.ndarray,
    centered: np.ndarray,
    x_mean: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    steps: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Alternate rounding and the least-squares fit of x ~= q * scale + offset, per group (rows
    of x [groups, block]; `centered` is x minus its group means `x_mean`, [groups, 1]).

    A group whose scale and offset no longer change is at a fixed point (the next step would
    compute the same values), so each step works only on the groups still moving: most settle
    within a few steps, and the arrays shrink with them."""
    scale, offset = scale.copy(), offset.copy()
    moving = np.arange(x.shape[0])
    s, o = scale, offset
    for _ in range(steps):
        q = _codes(x, s, o)
        q_mean = q.mean(axis=1, keepdims=True)
        q -= q_mean
        var = np.einsum("gb,gb->g", q, q)[:, None]
        cov = np.einsum("gb,gb->g", q, centered)[:, None]
        fitted = cov / np.where(var > 0, var, 1.0)
        new_s = np.where((var > 0) & (fitted > 0), fitted, s)
        new_o = x_mean - new_s * q_mean
        scale[moving], offset[moving] = new_s, new_o
        still = ((new_s != s) | (new_o != o))[:, 0]
        if not still.any():
            break
        if not still.all():
            moving = moving[still]
            x, centered, x_mean = x[still], centered[still], x_mean[still]
            new_s, new_o = new_s[still], new_o[still]
        s, o = new_s, new_o
    return scale, offset


def _squared_error(x: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    q = _codes(x, scale, offset)
    q *= scale
    q += offset
    q -= x
    return np.einsum("gb,gb->g", q, q)[:, None]


def _fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group of x [rows, groups, block]: the (scale, offset) with the least squared error
    among min/max, each clipped range after one least-squares step, and the best of those
    refined to its fixed point. Shapes [rows, groups, 1].

    Why this search: the previous one refined 81 clipped ranges to their fixed points each
    (about 6,500 passes over the data, 2 s per million weights on one idle core of the
    project's VM, hours for a 1.1B model); comparing 8 ranges after one step and refining
    only each group's best costs about 37x less for 3-4% more squared error
    (tests/myelin/test_codecs_roundtrip.py compares the two)."""
    rows, groups, block = x.shape
    x = x.reshape(rows * groups, block)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    x_mean = x.mean(axis=1, keepdims=True)
    centered = x - x_mean
    span = hi - lo
    best_scale = np.where(span > 0, span / LEVELS, 1.0).astype(x.dtype)
    best_offset = lo
    best_error = _squared_error(x, best_scale, best_offset)
    minmax_scale = best_scale
    for a, b in _CLIPS:
        clipped = hi * b - lo * a
        start = np.where(clipped > 0, clipped / LEVELS, minmax_scale)
        scale, offset = _refine(x, centered, x_mean, start, lo * a, _PROBE_STEPS)
        error = _squared_error(x, scale, offset)
        better = error < best_error
        best_scale = np.where(better, scale, best_scale)
        best_offset = np.where(better, offset, best_offset)
        best_error = np.minimum(error, best_error)
    scale, offset = _refine(x, centered, x_mean, best_scale, best_offset, _REFINE_STEPS)
    better = _squared_error(x, scale, offset) < best_error
    best_scale = np.where(better, scale, best_scale)
    best_offset = np.where(better, offset, best_offset)
    return best_scale.reshape(rows, groups, 1), best_offset.reshape(rows, groups, 1)


def _quantized_factors(
    scale: np.ndarray, offset: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 scales, int8 offsets, float32 row scale, float32 row offset factors)."""
    row_scale = (scale.max(axis=1) / 255.0).astype(np.float32)
    row_scale = np.where(row_scale > 0, row_scale, np.float32(1.0)).astype(np.float32)
    row_offset = (np.abs(offset).max(axis=1) / 127.0).astype(np.float32)
    row_offset = np.where(row_offset > 0, row_offset, np.float32(1.0)).astype(np.float32)
    scale8 = np.clip(np.rint(scale / row_scale[:, None]), 1, 255).astype(np.uint8)
    offset8 = np.clip(np.rint(offset / row_offset[:, None]), -127, 127).astype(np.int8)
    return scale8, offset8, row_scale, row_offset


def grouped_rows(array: np.ndarray, layout: Layout, start: int, stop: int) -> np.ndarray:
    """Output rows [start, stop) of the weight as [output, group, block] float32 (the shape the
    encoder fits in), without a transposed copy of the whole weight: what one worker of a
    parallel encode fits (benchmarks/gpu/payload.py)."""
    w = np.asarray(array)
    rows = w[:, start:stop].T if layout.reduce_axes[0] == 0 else w[start:stop]
    group = layout.options["group"]
    return np.ascontiguousarray(rows, dtype=np.float32).reshape(rows.shape[0], -1, group)


def encode_rows(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """(codes, uint8 scales, int8 offsets, row scale, row offset factors) of the output rows
    x [rows, groups, group]: every row is fitted on its own, so any cut into rows gives the
    same bytes."""
    scale, offset = _fit(x)
    s8, o8, rs, ro = _quantized_factors(scale[:, :, 0], offset[:, :, 0])
    # Round against the factors the graph will really use.
    step = (s8.astype(np.float32) * rs[:, None])[:, :, None]
    base = (o8.astype(np.float32) * ro[:, None])[:, :, None]
    codes = np.clip(np.rint((x - base) / step), 0, LEVELS).astype(np.uint8)
    return codes, s8, o8, rs, ro


def assemble(rows: list[tuple[np.ndarray, ...]], layout: Layout) -> list[np.ndarray]:
    """The stored parts from `encode_rows` results of consecutive row ranges, in order."""
    codes, scale8, offset8, row_scale, row_offset = (
        np.concatenate(part) if len(rows) > 1 else part[0] for part in zip(*rows, strict=True)
    )
    n, groups, group = codes.shape
    return [
        pack(_stored(codes.reshape(n, groups * group), layout)),
        _stored(scale8, layout),
        _stored(offset8, layout),
        row_scale,
        row_offset,
    ]


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    n = array.shape[1 - layout.reduce_axes[0]]
    starts = range(0, n, _ROWS_PER_CHUNK)

    def encode_chunk(start: int) -> tuple[np.ndarray, ...]:
        return encode_rows(grouped_rows(array, layout, start, start + _ROWS_PER_CHUNK))

    if len(starts) == 1 or _WORKERS == 1:
        rows = [encode_chunk(start) for start in starts]
    else:
        with ThreadPoolExecutor(_WORKERS, thread_name_prefix="q4-encode") as pool:
            rows = list(pool.map(encode_chunk, starts))  # list(): re-raises a worker's exception
    return assemble(rows, layout)


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    packed, scale8, offset8, row_scale, row_offset = parts
    stored = layout.parts[0].storage_shape
    grouped = layout.parts[1].storage_shape
    codes = unpack(packed, math.prod(stored)).reshape(stored)
    q = _output_major(codes, layout).astype(np.float32)
    n, k = q.shape
    group = layout.options["group"]
    scale = _output_major(np.asarray(scale8).reshape(grouped), layout).astype(np.float32)
    offset = _output_major(np.asarray(offset8).reshape(grouped), layout).astype(np.float32)
    scale *= np.asarray(row_scale, dtype=np.float32)[:, None]
    offset *= np.asarray(row_offset, dtype=np.float32)[:, None]
    w = q.reshape(n, -1, group) * scale[:, :, None] + offset[:, :, None]
    w = w.reshape(n, k)
    return w.T if layout.reduce_axes[0] == 0 else w
