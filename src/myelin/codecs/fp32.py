"""fp32: no encoding. The parameter is stored as the graph reads it (the default codec)."""

from __future__ import annotations

import numpy as np

from myelin.codecs._contract import Layout, StoredPart, identity_index, no_options

NAME = "fp32"
parse_options = no_options


def layout(
    shape: tuple[int, ...], dtype: str, reduce_axes: tuple[int, ...], options: dict
) -> Layout:
    element = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(dtype, "f32")
    part = StoredPart("data", "", element, shape, identity_index(len(shape)), dtype, shape)
    return Layout(NAME, dtype, shape, reduce_axes, (part,), (), f"{dtype}, as the graph reads it")


def encode(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    return [np.ascontiguousarray(array)]


def decode(parts: list[np.ndarray], layout: Layout) -> np.ndarray:
    return parts[0].astype(np.float32)
