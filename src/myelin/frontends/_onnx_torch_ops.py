"""ONNX ops torch-mlir's ONNX->torch conversion does not handle, rewritten to the torch ops that
implement them (which IREE does lower), on the imported module before the conversion runs.

- BitCast between element types of one width -> `torch.aten.view.dtype` (a tensor bitcast).
- CumProd -> `torch.aten.cumprod`. The preprocessing (`_onnx_preprocess.prepare_cumprod`) has
  already turned `exclusive`/`reverse` into ordinary ONNX ops and recorded the constant axis as
  the node's `axis` attribute, because the axis operand is an opaque resource constant here.
"""

from __future__ import annotations

import re

from iree.compiler import ir

# torch ScalarType codes, by the element type spelling of !torch.vtensor.
_TORCH_DTYPE = {
    "ui8": 0,
    "si8": 1,
    "si16": 2,
    "si32": 3,
    "si64": 4,
    "f16": 5,
    "f32": 6,
    "f64": 7,
    "i1": 11,
    "bf16": 15,
}
_WIDTH = {
    "ui8": 8,
    "si8": 8,
    "si16": 16,
    "ui16": 16,
    "si32": 32,
    "ui32": 32,
    "si64": 64,
    "ui64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "i1": 8,
}
_ELEMENT = re.compile(r"!torch\.vtensor<\[[^\]]*\],(\w+)>")


def rewrite_onnx_ops(module: ir.Operation) -> int:
    """Rewrite the ops above in place; returns how many were rewritten."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "torch.operator":
            name = ir.StringAttr(op.attributes["name"]).value
            if name in ("onnx.BitCast", "onnx.CumProd"):
                found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    rewritten = 0
    with module.context:
        for op in found:
            name = ir.StringAttr(op.attributes["name"]).value
            rewrite = _bitcast if name == "onnx.BitCast" else _cumprod
            if rewrite(op):
                rewritten += 1
    return rewritten


def _element(t: ir.Type) -> str | None:
    m = _ELEMENT.fullmatch(str(t))
    return m.group(1) if m else None


def _constant_int(value: int, location: ir.Location) -> ir.Value:
    return ir.Operation.create(
        "torch.constant.int",
        results=[ir.Type.parse("!torch.int")],
        attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)},
        loc=location,
    ).result


def _replace(op: ir.Operation, name: str, operands: list[ir.Value]) -> None:
    new = ir.Operation.create(
        name, results=[op.results[0].type], operands=operands, loc=op.location
    )
    op.results[0].replace_all_uses_with(new.result)
    op.erase()


def _bitcast(op: ir.Operation) -> bool:
    source, target = _element(op.operands[0].type), _element(op.results[0].type)
    if source is None or target not in _TORCH_DTYPE or _WIDTH.get(source) != _WIDTH[target]:
        return False
    if str(op.results[0].type).startswith("!torch.vtensor<[]"):
        return False  # a 0-d tensor bitcast crashes iree-compile 3.13
    with ir.InsertionPoint(op):
        dtype = _constant_int(_TORCH_DTYPE[target], op.location)
        _replace(op, "torch.aten.view.dtype", [op.operands[0], dtype])
    return True


def _cumprod(op: ir.Operation) -> bool:
    attrs = op.attributes
    if "torch.onnx.axis" not in attrs:
        return False
    for flag in ("torch.onnx.exclusive", "torch.onnx.reverse"):
        if flag in attrs and ir.IntegerAttr(attrs[flag]).value:
            return False
    with ir.InsertionPoint(op):
        axis = _constant_int(ir.IntegerAttr(attrs["torch.onnx.axis"]).value, op.location)
        none = ir.Operation.create(
            "torch.constant.none", results=[ir.Type.parse("!torch.none")], loc=op.location
        ).result
        _replace(op, "torch.aten.cumprod", [op.operands[0], axis, none])
    return True
