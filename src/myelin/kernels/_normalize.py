"""Linears over `[batch, rows, k]` activations rewritten to the canonical 2-D matmul, at IR level.

The kernels match `linalg.matmul` (2-D). The frontends lower a linear over a 3-D activation to
other forms: IREE's ONNX import (`MatMul` of `[b, s, k]` by a `[k, n]` weight) and JAX's
`dot_general` give a `linalg.batch_matmul` whose B is the weight broadcast along the batch
(a `linalg.generic` or `linalg.broadcast` that copies it b times), or a `linalg.generic`
contraction of `[b, s, k]` with the 2-D weight. Both compute the same sums as one
`[b*s, k] x [k, n]` matmul (each output element is one dot product over k: the batch dim only
chooses rows), so they are rewritten to that, between a collapse and an expand of the rows,
once, before any kernel matches: every kernel, and IREE's own matmul paths, see the canonical
form, whatever the frontend. The torch frontend already exports linears in that form
(myelin.frontends: `linear_as_matmul`); the rewrite finds nothing there.

A result narrowed by a one-use elementwise `truncf` keeps that truncf, now on the 2-D result,
where the matmul matcher folds it into the kernel. Static and dynamic batch and row counts are
both handled (a dynamic count is read with `tensor.dim`); N and K are the weight's, static.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.placement import find_ops
from myelin.kernels._ir import owner_op
from myelin.kernels._rewrite import _dims, _element, _is_zero_fill

# A generic that copies a 2-D weight along a new leading dim: its input map, for the weight
# stored [k, n] (A x B) or [n, k] (A x B^T).
_BROADCAST_KN = "affine_map<(d0, d1, d2) -> (d1, d2)>"
_BROADCAST_NK = "affine_map<(d0, d1, d2) -> (d2, d1)>"
_IDENTITY3 = "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"
# A generic contraction [b, m, k] x weight -> [b, m, n] (loops b, m, n, k), by weight layout.
_GENERIC_A = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>"
_GENERIC_KN = "affine_map<(d0, d1, d2, d3) -> (d3, d2)>"
_GENERIC_NK = "affine_map<(d0, d1, d2, d3) -> (d2, d3)>"
_GENERIC_OUT = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>"
# linalg.batch_matmul's default maps (A [b, m, k] x B [b, k, n]), as IREE 3.13 prints them.
_BATCH_MAPS = (
    "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
    "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]"
)
_ABT_MAPS = (
    "indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, "
    "affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>] "
)


@dataclass(frozen=True)
class _Linear:
    """One batched contraction that is a linear: its activation, the 2-D weight and layout."""

    op: ir.Operation  # the batch_matmul or generic contraction
    a: ir.Value  # [b, m, k]
    weight: ir.Value  # [k, n], or [n, k] when transposed
    transposed: bool
    truncf: ir.Operation | None  # the one-use elementwise narrowing of its f32 result


def _maps(op: ir.Operation) -> list[str]:
    return [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _body(op: ir.Operation) -> list[ir.Operation]:
    return list(op.regions[0].blocks[0].operations)


def _broadcast_weight(value: ir.Value) -> tuple[ir.Value, bool] | None:
    """The 2-D weight that `value` ([b, k, n]) copies along its batch dim, and whether it is
    stored [n, k]; None when `value` is anything else."""
    op = owner_op(value)
    if op is None:
        return None
    if op.name == "linalg.broadcast":
        if str(op.attributes["dimensions"]) != "array<i64: 0>":
            return None
        return op.operands[0], False
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    maps = _maps(op)
    if maps[1] != _IDENTITY3 or maps[0] not in (_BROADCAST_KN, _BROADCAST_NK):
        return None
    body = _body(op)
    block = op.regions[0].blocks[0]
    if [o.name for o in body] != ["linalg.yield"] or body[0].operands[0] != block.arguments[0]:
        return None
    return op.operands[0], maps[0] == _BROADCAST_NK


def _narrowing(result: ir.Value) -> ir.Operation | None:
    """The elementwise generic that only narrows this f32 result, when it is its one use."""
    uses = list(result.uses)
    if len(uses) != 1:
        return None
    user = _owner_of_use(uses[0])
    if user.name != "linalg.generic" or len(user.operands) != 2 or user.operands[0] != result:
        return None
    if _maps(user) != [_IDENTITY3, _IDENTITY3]:
        return None
    body = _body(user)
    block = user.regions[0].blocks[0]
    if [o.name for o in body] != ["arith.truncf", "linalg.yield"]:
        return None
    if body[0].operands[0] != block.arguments[0] or body[1].operands[0] != body[0].results[0]:
        return None
    return user if _element(user.results[0].type) in ("f16", "bf16") else None


def _owner_of_use(use) -> ir.Operation:
    owner = use.owner
    return getattr(owner, "operation", owner)


def _generic_linear(op: ir.Operation) -> tuple[ir.Value, ir.Value, bool] | None:
    """(activation, weight, transposed) of a `linalg.generic` that is a linear: loops
    (b, m, n, k), `[b, m, k]` times a 2-D weight, a body that multiplies the two inputs (each
    maybe widened first) and adds to the output."""
    if len(op.operands) != 3 or len(op.results) != 1:
        return None
    maps = _maps(op)
    if (
        maps[0] != _GENERIC_A
        or maps[2] != _GENERIC_OUT
        or maps[1] not in (_GENERIC_KN, _GENERIC_NK)
    ):
        return None
    if str(op.attributes["iterator_types"]).count("reduction") != 1:
        return None
    block = op.regions[0].blocks[0]
    body = _body(op)
    names = [o.name for o in body]
    widened = [o for o in body if o.name == "arith.extf"]
    if names[len(widened) :] != ["arith.mulf", "arith.addf", "linalg.yield"]:
        return None
    value_of = {o.results[0]: o.operands[0] for o in widened}
    mul, add, yld = body[len(widened) :]
    factors = {value_of.get(x, x) for x in mul.operands}
    if factors != {block.arguments[0], block.arguments[1]}:
        return None
    if (
        set(add.operands) != {mul.results[0], block.arguments[2]}
        or yld.operands[0] != add.results[0]
    ):
        return None
    return op.operands[0], op.operands[1], maps[1] == _GENERIC_NK


def find_linears(module: ir.Operation) -> list[_Linear]:
    """Every batched contraction that is a linear over a 3-D activation (see the module doc)."""
    found = []
    for op in find_ops(module, lambda o: o.name in ("linalg.batch_matmul", "linalg.generic")):
        if op.name == "linalg.batch_matmul":
            maps = str(op.attributes["indexing_maps"]) if "indexing_maps" in op.attributes else None
            if maps not in (None, _BATCH_MAPS):  # transposed operand layouts: not a linear
                continue
            weight = _broadcast_weight(op.operands[1])
            if weight is None:
                continue
            a, (w, transposed) = op.operands[0], weight
        else:
            if "reduction" not in str(op.attributes["iterator_types"]):
                continue
            linear = _generic_linear(op)
            if linear is None:
                continue
            a, w, transposed = linear
        if ir.RankedTensorType(a.type).rank != 3 or ir.RankedTensorType(w.type).rank != 2:
            continue
        if not _is_zero_fill(op.operands[2]) or any(d is None for d in _dims(w.type)):
            continue
        acc = _element(op.results[0].type)
        truncf = _narrowing(op.results[0]) if acc == "f32" else None
        found.append(_Linear(op, a, w, transposed, truncf))
    return found


def _tensor(dims: list[int | None], element: str) -> str:
    return "tensor<" + "x".join("?" if d is None else str(d) for d in dims) + f"x{element}>"


def _function_text(lin: _Linear) -> str:
    """A function (activation, weight) -> the linear's result, as one 2-D matmul between a
    collapse and an expand of the rows: the body that replaces the batched contraction."""
    b, m, k = _dims(lin.a.type)
    wdims = _dims(lin.weight.type)
    n = wdims[0] if lin.transposed else wdims[1]
    rows = b * m if b is not None and m is not None else None
    a_el = _element(lin.a.type)
    acc = _element(lin.op.results[0].type)
    out_el = _element(lin.truncf.results[0].type) if lin.truncf is not None else acc
    a_t, w_t = _tensor([b, m, k], a_el), str(lin.weight.type)
    rows_t = _tensor([rows, k], a_el)
    acc_t, out2_t, out3_t = (
        _tensor([rows, n], acc),
        _tensor([rows, n], out_el),
        _tensor([b, m, n], out_el),
    )
    lines = ["%c0 = arith.constant 0 : index", "%c1 = arith.constant 1 : index"]
    lines.append(f"%rows = tensor.collapse_shape %a [[0, 1], [2]] : {a_t} into {rows_t}")
    dyn = ""
    if rows is None:
        lines.append(f"%r = tensor.dim %rows, %c0 : {rows_t}")
        dyn = "%r"
    zero = "0.000000e+00" if acc.startswith(("f", "bf")) else "0"
    lines += [
        f"%empty = tensor.empty({dyn}) : {acc_t}",
        f"%zero = arith.constant {zero} : {acc}",
        f"%init = linalg.fill ins(%zero : {acc}) outs(%empty : {acc_t}) -> {acc_t}",
        f"%mm = linalg.matmul {_ABT_MAPS if lin.transposed else ''}"
        f"ins(%rows, %w : {rows_t}, {w_t}) outs(%init : {acc_t}) -> {acc_t}",
    ]
    result = "%mm"
    if lin.truncf is not None:
        identity = "affine_map<(d0, d1) -> (d0, d1)>"
        lines += [
            f"%nempty = tensor.empty({dyn}) : {out2_t}",
            f"%narrow = linalg.generic {{indexing_maps = [{identity}, {identity}], "
            f'iterator_types = ["parallel", "parallel"]}} ins(%mm : {acc_t}) '
            f"outs(%nempty : {out2_t}) {{",
            f"^bb0(%x: {acc}, %y: {out_el}):",
            f"  %t = arith.truncf %x : {acc} to {out_el}",
            f"  linalg.yield %t : {out_el}",
            f"}} -> {out2_t}",
        ]
        result = "%narrow"
    shape = []
    for i, d in enumerate((b, m)):
        if d is None:
            lines.append(f"%d{i} = tensor.dim %a, %c{i} : {a_t}")
            shape.append(f"%d{i}")
        else:
            shape.append(str(d))
    lines.append(
        f"%out = tensor.expand_shape {result} [[0, 1], [2]] output_shape [{', '.join(shape)}, {n}]"
        f" : {out2_t} into {out3_t}"
    )
    lines.append(f"util.return %out : {out3_t}")
    body = "\n  ".join(lines)
    return f"util.func private @linear(%a: {a_t}, %w: {w_t}) -> {out3_t} {{\n  {body}\n}}"


def inline_text(function_text: str, before: ir.Operation, operands: list[ir.Value]) -> ir.Value:
    """Parse a one-result function and inline its body before `before`, its arguments bound to
    `operands`; returns the value it returns. (The MLIR Python API builds named linalg ops
    from text most reliably: their regions are filled in by the parser.)"""
    return inline_ops(function_text, before, operands)[0]


def inline_ops(
    function_text: str, before: ir.Operation, operands: list[ir.Value]
) -> tuple[ir.Value, list[ir.Operation]]:
    """`inline_text`, also returning the ops it moved (for a caller that marks them)."""
    helper = ir.Module.parse(function_text)
    (func,) = list(helper.body.operations)
    block = func.regions[0].blocks[0]
    for arg, value in zip(block.arguments, operands, strict=True):
        arg.replace_all_uses_with(value)
    ops = list(block.operations)
    returned = ops[-1].operands[0]
    for op in ops[:-1]:
        op.move_before(before)
    return returned, ops[:-1]


def linears_as_matmuls(module: ir.Operation) -> int:
    """Rewrite every batched linear (find_linears) to the 2-D matmul form; returns how many."""
    linears = find_linears(module)
    for lin in linears:
        replaced = lin.truncf or lin.op
        with replaced.location:
            value = inline_text(_function_text(lin), replaced, [lin.a, lin.weight])
        fill = owner_op(lin.op.operands[2])
        broadcast = owner_op(lin.op.operands[1]) if lin.op.name == "linalg.batch_matmul" else None
        replaced.results[0].replace_all_uses_with(value)
        replaced.erase()
        if replaced is not lin.op:
            lin.op.erase()
        for op in (broadcast, fill):
            if op is not None and not any(list(r.uses) for r in op.results):
                op.erase()
    return len(linears)
