"""Entrypoint signatures: what a compiled function takes and returns.

IREE 3.13 exposes a function's signature only as the human-readable `iree.abi.declaration`
reflection string (there is no ABI JSON any more), so the build parses it once and records the
result in the .mln manifest; the runtime validates inputs against that record.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from myelin.dtypes import MLIR_TO_NUMPY

# The VM module that runs, on the host, the ONNX nodes IREE cannot lower (the ONNX host
# fallback): the compiled graph imports its functions by this name, the runtime registers a
# Python module of this name (myelin.frontends._onnx_host, myelin.runtime.host_ops).
HOST_MODULE = "plex_host"

# The build exports, next to each entrypoint `f` whose results are all tensors, a twin
# `f$into` that takes one storage argument per result after f's own arguments, then the call's
# transient memory: the runtime hands it memory it allocated itself, so a device result lives
# in memory that exports DLPack and a call allocates nothing on IREE's queue
# (myelin.compiler.storage_twins, docs/runtime.md). Twins are no entrypoints of their own: the
# signatures leave them out.
STORAGE_TWIN_SUFFIX = "$into"
# A twin's storage arguments, marked so that the runtime finds them in its `iree.abi.declaration`:
# result N's storage (a buffer view) and the call's transient memory (a buffer).
TWIN_RESULT_ATTRIBUTE = "myelin.result"
TWIN_TRANSIENTS_ATTRIBUTE = "myelin.transients"


@dataclass(frozen=True)
class TensorSpec:
    """One argument or result. `shape` entries are None for dynamic dims; `dims` names them.
    `valid_range` is [lo, hi) for an integer input whose values index a table (found at build
    time, myelin.compiler.index_ranges): the runtime refuses other values before the call.
    `limits` holds, per axis, None or (the largest size the graph supports, why): a dynamic dim
    whose positions index a fixed-size table (GPT-2's 128 position embeddings); the runtime
    refuses larger sizes, which IREE would read past the table with."""

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None  # None for a scalar
    dims: tuple[int | str, ...] = ()
    valid_range: tuple[int, int] | None = None
    limits: tuple[tuple[int, str] | None, ...] = ()

    @property
    def is_scalar(self) -> bool:
        return self.shape is None

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.dtype} scalar"
        dims = [
            str(d) if d is not None else str(n) for d, n in zip(self.shape, self.dims, strict=True)
        ]
        for axis, limit in enumerate(self.limits):
            if limit is not None and axis < len(dims):
                dims[axis] += f"<={limit[0]}"
        return f"{self.name}: {self.dtype}[{', '.join(dims)}]"

    def to_json(self) -> dict:
        data = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape) if self.shape is not None else None,
            "dims": list(self.dims),
        }
        if self.valid_range is not None:
            data["range"] = list(self.valid_range)
        if any(limit is not None for limit in self.limits):
            data["limits"] = [list(limit) if limit is not None else None for limit in self.limits]
        return data

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        shape = data.get("shape")
        valid_range = data.get("range")
        return cls(
            name=data["name"],
            dtype=data["dtype"],
            shape=tuple(shape) if shape is not None else None,
            dims=tuple(data.get("dims", ())),
            valid_range=tuple(valid_range) if valid_range is not None else None,
            limits=tuple(
                (int(limit[0]), str(limit[1])) if limit is not None else None
                for limit in data.get("limits", ())
            ),
        )


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    is_async: bool = field(default=False)

    def describe(self) -> str:
        ins = ", ".join(t.describe() for t in self.inputs)
        outs = ", ".join(t.describe() for t in self.outputs)
        return f"({ins}) -> ({outs})"


_ARG = re.compile(r"%(?P<name>[\w.$-]+)\s*:\s*(?P<type>tensor<[^>]*>|!hal\.[\w_]+|[\w]+)")
_TENSOR = re.compile(r"tensor<(?P<body>[^>]*)>")


def _parse_type(text: str) -> tuple[str, tuple[int | None, ...] | None]:
    m = _TENSOR.fullmatch(text)
    if m is None:
        if text in MLIR_TO_NUMPY:
            return MLIR_TO_NUMPY[text], None
        raise ValueError(f"unsupported ABI type {text!r}")
    parts = m.group("body").split("x")
    element = parts[-1]
    if element not in MLIR_TO_NUMPY:
        raise ValueError(f"unsupported tensor element type {element!r}")
    shape = tuple(None if p == "?" else int(p) for p in parts[:-1])
    return MLIR_TO_NUMPY[element], shape


def parse_abi_declaration(declaration: str, input_names: Sequence[str] | None = None) -> Signature:
    """Parse e.g. `sync func @f(%input0: tensor<?x4xf32>) -> (%output0: tensor<?x3xf32>)`.

    Dynamic dims get stable names (`<arg>.<axis>`) so error messages can refer to them.
    """
    head, _, tail = declaration.partition("->")
    is_async = declaration.lstrip().startswith("async")

    def specs(text: str, names: Sequence[str] | None) -> tuple[TensorSpec, ...]:
        out = []
        for i, m in enumerate(_ARG.finditer(text)):
            name = names[i] if names is not None and i < len(names) else m.group("name")
            dtype, shape = _parse_type(m.group("type"))
            dims: tuple[int | str, ...] = ()
            if shape is not None:
                dims = tuple(
                    d if d is not None else f"{name}.{axis}" for axis, d in enumerate(shape)
                )
            out.append(TensorSpec(name=name, dtype=dtype, shape=shape, dims=dims))
        return tuple(out)

    return Signature(
        inputs=specs(head.split("(", 1)[1] if "(" in head else "", input_names),
        outputs=specs(tail, None),
        is_async=is_async,
    )
