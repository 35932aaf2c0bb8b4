"""What the ONNX frontend refuses up front, and what it warns about.

Refusals name the op or type and the nodes that use it, before IREE prints a page of
legalization errors. Warnings cover ops that compile and run in IREE 3.13 but were measured to
give wrong values in some configurations (docs/onnx-coverage.md): a build that contains
one says so instead of passing silently, and with host fallback the node runs on the host.
(Weighted SoftmaxCrossEntropyLoss, wrong in IREE's own lowering, is not here: the preprocessing
always expands it into its function body, which is right.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import onnx
from onnx import helper

TP = onnx.TensorProto

# Element types the IREE 3.13 ONNX importer or compiler cannot represent.
UNSUPPORTED_TYPES: dict[int, str] = {
    TP.STRING: "string",
    TP.FLOAT4E2M1: "float4e2m1",
    TP.FLOAT8E8M0: "float8e8m0",
    TP.COMPLEX64: "complex64",
    TP.COMPLEX128: "complex128",
    **{getattr(TP, n): n.lower() for n in ("INT2", "UINT2") if hasattr(TP, n)},
}
_INT4_TYPES = {TP.INT4, TP.UINT4}

FP8_TYPES = frozenset(
    {
        TP.FLOAT8E4M3FN,
        TP.FLOAT8E4M3FNUZ,
        TP.FLOAT8E5M2,
        TP.FLOAT8E5M2FNUZ,
    }
)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _has_input(node: onnx.NodeProto, index: int) -> bool:
    return index < len(node.input) and bool(node.input[index])


def _rank(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    t = types.get(name)
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


def _elem(types: dict[str, onnx.TypeProto], name: str) -> int:
    t = types.get(name)
    return t.tensor_type.elem_type if t is not None else 0


Check = Callable[[onnx.NodeProto, dict[str, onnx.TypeProto]], str | None]


def _gridsample(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    a = _attrs(node)
    reasons = []
    if a.get("padding_mode", b"zeros") in (b"zeros", "zeros"):
        reasons.append("GridSample with padding_mode='zeros' returned garbage on ~25% of runs")
    if a.get("mode", b"linear") in (b"nearest", "nearest"):
        reasons.append("GridSample mode='nearest' rounds differently (values off by up to 4)")
    return "; ".join(reasons) or None


def _cast_fp8(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    a = _attrs(node)
    target = a.get("to") if node.op_type == "Cast" else _elem(types, node.input[1])
    if target in FP8_TYPES and a.get("saturate", 1):
        return f"{node.op_type} to float8 ignores saturate=1 (NaN instead of the max value)"
    return None


def _quantize_fp8(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    if _has_input(node, 2) and _elem(types, node.input[2]) in FP8_TYPES:
        return "QuantizeLinear to float8 ignores saturation (NaN instead of the max value)"
    return None


def _qlinearmatmul(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    ranks = [_rank(types, node.input[0]), _rank(types, node.input[3])]
    if any(r is None or r > 2 for r in ranks):
        return "QLinearMatMul on inputs of rank > 2 returned wrong values"
    return None


def _resize(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    a = _attrs(node)
    mode = a.get("coordinate_transformation_mode", b"half_pixel")
    interp = a.get("mode", b"nearest")
    if mode in (b"align_corners", "align_corners") and interp not in (b"nearest", "nearest"):
        return "Resize linear/cubic with align_corners returned wrong values when downsampling"
    return None


def _averagepool(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    a = _attrs(node)
    dilated = any(d != 1 for d in a.get("dilations", []))
    if a.get("ceil_mode", 0) and a.get("count_include_pad", 0) and dilated:
        return "AveragePool with ceil_mode, count_include_pad and dilations returned wrong values"
    return None


def _lstm(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> str | None:
    if _has_input(node, 7):
        return "LSTM with peephole weights returned values off by ~1e-2"
    return None


# op type -> check returning the reason a node of it may compute wrong values (None: fine).
SILENTLY_WRONG: dict[str, Check] = {
    "GridSample": _gridsample,
    "Det": lambda n, t: "Det does not pivot (NaN for matrices with a zero leading pivot)",
    "LpNormalization": lambda n, t: "LpNormalization returns NaN instead of 0 for zero vectors",
    "Cast": _cast_fp8,
    "CastLike": _cast_fp8,
    "QuantizeLinear": _quantize_fp8,
    "QLinearMatMul": _qlinearmatmul,
    "Resize": _resize,
    "AveragePool": _averagepool,
    "LSTM": _lstm,
}


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    types = {vi.name: vi.type for vi in [*graph.input, *graph.value_info, *graph.output]}
    for init in graph.initializer:
        types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, init.dims))
    return types


def silently_wrong_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """{node name: why IREE 3.13 may compute it wrong} for the main graph's nodes that
    SILENTLY_WRONG flags; with host fallback these nodes run on the host."""
    types = value_types(model)
    found: dict[str, str] = {}
    for node in model.graph.node:
        check = SILENTLY_WRONG.get(node.op_type)
        if check is None or node.domain not in ("", "ai.onnx"):
            continue
        reason = check(node, types)
        if reason:
            found[node.name] = reason
    return found


def silently_wrong(model: onnx.ModelProto, *, skip: Collection[str] = ()) -> list[str]:
    """One warning per (op, reason), naming up to 3 of the nodes concerned; nodes in `skip`
    (moved to the host) are left out."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in silently_wrong_nodes(model).items():
        if node not in skip:
            by_reason.setdefault(reason, []).append(node)
    return [
        f"{reason} in IREE 3.13 (nodes {_names(nodes)}); check its outputs against a reference"
        for reason, nodes in by_reason.items()
    ]


def unsupported_types(model: onnx.ModelProto) -> list[str]:
    """Problems with element types IREE cannot represent, one per type."""
    types = value_types(model)
    found: dict[str, list[str]] = {}
    for name, t in types.items():
        elem = t.tensor_type.elem_type
        if elem in UNSUPPORTED_TYPES:
            found.setdefault(UNSUPPORTED_TYPES[elem], []).append(name)
        elif elem in _INT4_TYPES and t.tensor_type.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim
            ]
            if all(d is not None for d in dims) and int(np.prod(dims, dtype=np.int64)) % 2:
                found.setdefault("int4/uint4 with an odd element count", []).append(name)
    io = [*model.graph.input, *model.graph.output]
    fp8_io = [
        vi.name
        for vi in io
        if vi.type.tensor_type.elem_type in FP8_TYPES and not _signature_has(vi.type)
    ]
    if fp8_io:  # myelin's signature dtype table has no float8 entry (yet)
        found.setdefault("float8 graph input/output", []).extend(fp8_io)
    return [f"{what} tensors ({_names(names)})" for what, names in found.items()]


_FP8_MLIR = {
    TP.FLOAT8E4M3FN: "f8E4M3FN",
    TP.FLOAT8E4M3FNUZ: "f8E4M3FNUZ",
    TP.FLOAT8E5M2: "f8E5M2",
    TP.FLOAT8E5M2FNUZ: "f8E5M2FNUZ",
}


def _signature_has(t: onnx.TypeProto) -> bool:
    from myelin.dtypes import MLIR_TO_NUMPY

    return _FP8_MLIR.get(t.tensor_type.elem_type, "") in MLIR_TO_NUMPY


def foreign_ops(model: onnx.ModelProto) -> dict[str, str]:
    """Nodes outside the default ONNX domain: {node name: "domain.Op"}. torch-mlir lowers none."""
    return {
        n.name: f"{n.domain}.{n.op_type}"
        for n in model.graph.node
        if n.domain not in ("", "ai.onnx")
    }


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_ops(nodes: dict[str, str], limit: int = 6) -> str:
    """`Op (nodes 'a', 'b'), Op2 (node 'c')` grouped by op."""
    by_op: dict[str, list[str]] = {}
    for node, op in nodes.items():
        by_op.setdefault(op, []).append(node)
    parts = []
    for op, names in sorted(by_op.items())[:limit]:
        label = "node" if len(names) == 1 else "nodes"
        parts.append(f"{op} ({label} {_names(names)})")
    if len(by_op) > limit:
        parts.append(f"and {len(by_op) - limit} more op types")
    return ", ".join(parts)
