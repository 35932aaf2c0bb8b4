"""Attention written by hand, recognized in the IR every frontend produces, and rewritten to
`iree_linalg_ext.attention` (the op the attention kernels match) before any kernel matches.

`softmax(q @ k^T * scale + mask) @ v` written with matmuls (an ONNX export of GPT-2's, BERT's or
Llama's eager attention; JAX code that writes it out) reaches IREE's `input` phase as two
`linalg.batch_matmul`s around a decomposed softmax: a max reduction, a subtraction, `exp`, a sum
reduction and a division, maybe with casts to f32 and back, a scalar multiplication and an
additive mask between the first product and the softmax. That is the same function as one
attention op with that scale and mask (the op computes its softmax in f32: as precise as the
written form, or more), so the chain is rewritten to it. The torch frontend turns such code into
`scaled_dot_product_attention` already (myelin.frontends), where its masks can still be
evaluated; this rewrite is for the frontends whose IR is all there is.

A chain that is not exactly this (another reduction, a score seen outside the chain, dynamic
shapes) is left as it is, and the report gives its batched matmuls the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.placement import find_ops
from myelin.kernels._ir import owner_op
from myelin.kernels._normalize import _BATCH_MAPS, _body, _maps, _narrowing, inline_text
from myelin.kernels._rewrite import _dims, _element, _is_zero_fill

_INPUTS = ("f16", "bf16")
_MAPS = (
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>, "
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>, "
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>, "
    "affine_map<(d0, d1, d2, d3, d4) -> ()>"
)
_MASK_MAP = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>"
_OUT_MAP = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>"
# The reason a batched matmul of attention written by hand keeps, when the chain is not taken,
# held by the op (attribute WHY) until the report reads it.
HAND_WRITTEN = "attention written as batched matmuls, not taken as one attention op"
WHY = "plex.kernels_why"


@dataclass
class _Attention:
    pv: ir.Operation  # the second batched matmul (probabilities x values)
    replaced: ir.Operation  # the op whose result the attention op replaces (pv or its truncf)
    q: ir.Value  # [bh, m, d]
    kt: ir.Value  # [bh, d, n]
    v: ir.Value  # [bh, n, d]
    scale: float
    mask: ir.Value | None  # the additive mask as the scores' add reads it
    mask_map: str | None  # its indexing map in that add (a broadcast over the scores)
    scores_type: ir.Type  # the scores where the mask is added ([..., m, n])
    chain: list[ir.Operation]  # every op from the first matmul to the replaced op


def _names(op: ir.Operation) -> list[str]:
    return [o.name for o in _body(op)]


def _generic(value: ir.Value, names: list[str], inputs: int) -> ir.Operation | None:
    """The `linalg.generic` producing `value` when its body is exactly `names` then a yield,
    it has `inputs` inputs and one result, and its body uses its inputs in order."""
    op = owner_op(value)
    if op is None or op.name != "linalg.generic" or len(op.results) != 1:
        return None
    if len(op.operands) != inputs + 1 or _names(op) != [*names, "linalg.yield"]:
        return None
    block = op.regions[0].blocks[0]
    first = _body(op)[0]
    if list(first.operands)[: min(inputs, len(first.operands))] != list(block.arguments)[:inputs]:
        return None
    return op


def _broadcast(value: ir.Value) -> ir.Operation | None:
    """The `linalg.generic` that only copies its one input over more (or equal) dims: how
    StableHLO's broadcast of a reduction's result back to the scores' shape lowers."""
    op = owner_op(value)
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    if "reduction" in str(op.attributes["iterator_types"]):
        return None
    body = _body(op)
    block = op.regions[0].blocks[0]
    if [o.name for o in body] != ["linalg.yield"] or body[0].operands[0] != block.arguments[0]:
        return None
    return op


def _strip(
    value: ir.Value, chain: list[ir.Operation], casts: bool = True, broadcasts: bool = False
) -> ir.Value:
    """Through reshapes, elementwise casts (`extf`, `truncf`) and, where asked, broadcasts to
    the value they come from."""
    while True:
        op = owner_op(value)
        if op is None:
            return value
        if op.name in ("tensor.collapse_shape", "tensor.expand_shape"):
            chain.append(op)
            value = op.operands[0]
            continue
        step = None
        if casts:
            step = _generic(value, ["arith.extf"], 1) or _generic(value, ["arith.truncf"], 1)
        if step is None and broadcasts:
            step = _broadcast(value)
        if step is None:
            return value
        chain.append(step)
        value = step.operands[0]


def _softmax_input(value: ir.Value, chain: list[ir.Operation]) -> ir.Value | None:
    """X when `value` is softmax(X) over its last dim, decomposed as torch-mlir writes it:
    exp(X - max(X)) / sum(exp(X - max(X)))."""
    div = _generic(value, ["arith.divf"], 2)
    if div is None:
        return None
    e, total = div.operands[0], _strip(div.operands[1], chain, broadcasts=True)
    add = owner_op(total)
    if add is None or add.name != "linalg.generic" or _strip(add.operands[0], chain) != e:
        return None
    if "reduction" not in str(add.attributes["iterator_types"]) or _names(add) != [
        "arith.addf", "linalg.yield"
    ]:  # fmt: skip
        return None
    exp = _generic(e, ["math.exp"], 1)
    sub = exp and _generic(exp.operands[0], ["arith.subf"], 2)
    if sub is None:
        return None
    x, peak = sub.operands[0], _strip(sub.operands[1], chain, casts=False, broadcasts=True)
    peak_op = owner_op(peak)
    if (
        peak_op is None
        or peak_op.name != "linalg.generic"
        or peak_op.operands[0] != x
        or "arith.maximumf" not in _names(peak_op)
        or "reduction" not in str(peak_op.attributes["iterator_types"])
    ):
        return None
    chain += [div, add, exp, sub, peak_op]
    return x


def _scalar(value: ir.Value) -> float | None:
    """The value of a constant scalar (a 0-d or one-element splat tensor, or a float)."""
    op = owner_op(value)
    if op is None or op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    try:
        return ir.FloatAttr(attr).value
    except ValueError:
        pass
    try:
        dense = ir.DenseElementsAttr(attr)
        if dense.is_splat:
            return ir.FloatAttr(dense.get_splat_value()).value
    except ValueError:
        return None
    return None


def _scaled(value: ir.Value, chain: list[ir.Operation]) -> tuple[ir.Value, float]:
    """(scores, scale) when `value` is scores times (or divided by) a constant scalar: a second
    input of the elementwise op, or a constant its body uses (StableHLO's form)."""
    for name in ("arith.mulf", "arith.divf"):
        op = _generic(value, [name], 2) or _generic(value, [name], 1)
        if op is None:
            continue
        # the constant: the op's second input, or the body's operand from outside the op
        constant = op.operands[1] if len(op.operands) == 3 else _body(op)[0].operands[1]
        c = _scalar(constant)
        if c is None or c == 0.0:
            continue
        chain.append(op)
        return op.operands[0], c if name == "arith.mulf" else 1.0 / c
    return value, 1.0


def _plain_batch_matmul(value: ir.Value) -> ir.Operation | None:
    op = owner_op(value)
    if op is None or op.name != "linalg.batch_matmul" or not _is_zero_fill(op.operands[2]):
        return None
    maps = str(op.attributes["indexing_maps"]) if "indexing_maps" in op.attributes else None
    return op if maps in (None, _BATCH_MAPS) else None


def _match(pv: ir.Operation) -> _Attention | str | None:
    """The hand-written attention that ends in the batched matmul `pv`; None when `pv` does
    not multiply a softmax; why not, when it does but the rest is not the form above."""
    chain: list[ir.Operation] = [pv]
    x = _softmax_input(_strip(pv.operands[0], chain), chain)
    if x is None:
        return None
    found = _match_scores(pv, x, chain)
    if isinstance(found, str):
        # the report gives both products (those found) the reason
        for op in (o for o in chain if o.name == "linalg.batch_matmul"):
            op.attributes[WHY] = ir.StringAttr.get(f"{HAND_WRITTEN}: {found}")
    return found


def _match_scores(pv: ir.Operation, x: ir.Value, chain: list[ir.Operation]) -> _Attention | str:
    """The rest of `_match`, from the softmax's input X back to q @ k^T."""
    scores = _strip(x, chain)
    mask = mask_map = None
    scores_type = scores.type
    add = _generic(scores, ["arith.addf"], 2)
    if add is not None:
        chain.append(add)
        mask, mask_map = add.operands[1], _maps(add)[1]
        scores = _strip(add.operands[0], chain)
    scores, scale = _scaled(scores, chain)
    if mask is None:
        scores_type = scores.type
    qk = _plain_batch_matmul(_strip(scores, chain))
    if qk is None:
        return "the softmax's input is not q @ k^T, times a constant, plus a mask"
    chain.append(qk)
    q, kt, v = qk.operands[0], qk.operands[1], pv.operands[1]
    types = [_element(x.type) for x in (q, kt, v)]
    if len(set(types)) != 1 or types[0] not in _INPUTS:
        return f"q, k, v are {' x '.join(types)}: the attention kernels take f16 or bf16"
    dims = [_dims(x.type) for x in (q, kt, v)]
    if any(d is None for ds in dims for d in ds):
        return "dynamic shapes: the attention op is built for static ones"
    (bh, m, d), (_, d2, n), (_, n2, dv) = dims[0], dims[1], dims[2]
    if d != d2 or n != n2 or dv != d:
        return "q, k and v do not have one head dim"
    acc = _element(pv.results[0].type)
    replaced = pv
    if acc == "f32":
        narrowing = _narrowing(pv.results[0])
        if narrowing is None or _element(narrowing.results[0].type) != types[0]:
            return f"the product's f32 result is used as f32, not narrowed to {types[0]}"
        replaced = narrowing
    elif acc != types[0]:
        return f"the product accumulates in {acc}"
    chain.append(replaced)
    # the scores and probabilities must be seen by nothing but the chain
    for op in chain:
        if op in (replaced, qk):
            continue
        for result in op.results:
            for use in result.uses:
                owner = getattr(use.owner, "operation", use.owner)
                if not any(owner == c for c in chain):
                    return "the scores or probabilities are used outside the softmax"
    if mask is not None:
        sdims = _dims(scores_type)
        count = 1
        for x in sdims[:-2]:
            count *= x or 0
        if len(sdims) < 3 or sdims[-2:] != [m, n] or count != bh:
            return "the mask is added to scores of another shape than q @ k^T"
    return _Attention(pv, replaced, q, kt, v, scale, mask, mask_map, scores_type, chain)


def _tensor(dims: list[int], element: str) -> str:
    return "tensor<" + "x".join(str(x) for x in dims) + f"x{element}>"


def _function_text(a: _Attention) -> str:
    """(q, k^T, v[, mask]) -> the attention op's result, in the result type of the replaced op."""
    bh, m, d = _dims(a.q.type)
    n = _dims(a.v.type)[1]
    el = _element(a.q.type)
    q_t, kt_t, v_t = (str(x.type) for x in (a.q, a.kt, a.v))
    k_t, o_t = _tensor([bh, n, d], el), str(a.replaced.results[0].type)
    args = [f"%q: {q_t}", f"%kt: {kt_t}", f"%v: {v_t}"]
    lines = [
        f"%ke = tensor.empty() : {k_t}",
        f"%k = linalg.transpose ins(%kt : {kt_t}) outs(%ke : {k_t}) permutation = [0, 2, 1]",
        f"%scale = arith.constant {a.scale!r} : {el}",
    ]
    ins, types, maps = "%q, %k, %v, %scale", f"{q_t}, {k_t}, {v_t}, {el}", _MAPS
    if a.mask is not None:
        mask_t = str(a.mask.type)
        sdims = _dims(a.scores_type)
        rank = len(sdims)
        wide_t, m3_t = _tensor(sdims, el), _tensor([bh, m, n], el)
        args.append(f"%mask: {mask_t}")
        identity = "affine_map<(" + ", ".join(f"d{i}" for i in range(rank)) + ") -> ("
        identity += ", ".join(f"d{i}" for i in range(rank)) + ")>"
        mel = _element(a.mask.type)
        convert = ""
        value = "%x"
        if mel != el:
            how = "arith.extf" if mel in ("f16", "bf16") and el == "f32" else "arith.truncf"
            convert = f"%c = {how} %x : {mel} to {el}\n    "
            value = "%c"
        lead = "[" + ", ".join(str(i) for i in range(rank - 2)) + "]"
        parallel = ", ".join(['"parallel"'] * rank)
        lines += [
            f"%me = tensor.empty() : {wide_t}",
            f"%mb = linalg.generic {{indexing_maps = [{a.mask_map}, {identity}], "
            f"iterator_types = [{parallel}]}} "
            f"ins(%mask : {mask_t}) outs(%me : {wide_t}) {{",
            f"  ^bb0(%x: {mel}, %y: {el}):",
            f"    {convert}linalg.yield {value} : {el}",
            f"}} -> {wide_t}",
            f"%m3 = tensor.collapse_shape %mb [{lead}, [{rank - 2}], [{rank - 1}]]"
            f" : {wide_t} into {m3_t}",
        ]
        ins, types, maps = f"{ins}, %m3", f"{types}, {m3_t}", f"{_MAPS}, {_MASK_MAP}"
    lines += [
        f"%oe = tensor.empty() : {o_t}",
        f"%o = iree_linalg_ext.attention <indexing_maps = [{maps}, {_OUT_MAP}]> "
        f"ins({ins} : {types}) outs(%oe : {o_t}) {{",
        "^bb0(%s: f32):",
        "  iree_linalg_ext.yield %s : f32",
        f"}} -> {o_t}",
        f"util.return %o : {o_t}",
    ]
    body = "\n  ".join(lines)
    return f"util.func private @attention({', '.join(args)}) -> {o_t} {{\n  {body}\n}}"


def hand_written_attention(module: ir.Operation) -> int:
    """Rewrite every hand-written attention (see the module doc) to one attention op; mark the
    batched matmuls of the chains left as they are (`plex.why`, read by the report). Returns
    how many were rewritten."""
    count = 0
    for pv in find_ops(module, lambda o: o.name == "linalg.batch_matmul"):
        found = _match(pv)
        if not isinstance(found, _Attention):
            continue
        operands = [found.q, found.kt, found.v] + ([found.mask] if found.mask is not None else [])
        with found.replaced.location:
            value = inline_text(_function_text(found), found.replaced, operands)
        found.replaced.results[0].replace_all_uses_with(value)
        _erase_unused(found.chain)
        count += 1
    return count


def _erase_unused(ops: list[ir.Operation]) -> None:
    """Erase the ops (and the fills and empties only they used) once nothing uses them."""
    pending: list[ir.Operation] = []
    for op in ops:  # an op may be in the chain twice (reached from two uses)
        if not any(op == p for p in pending):
            pending.append(op)
    changed = True
    while changed:
        changed = False
        for op in list(pending):
            if any(list(r.uses) for r in op.results):
                continue
            feeders = [owner_op(x) for x in op.operands]
            pending.remove(op)
            op.erase()
            changed = True
            for f in feeders:
                if f is not None and f.name in ("linalg.fill", "tensor.empty") and f not in pending:
                    pending.append(f)


def forget_reasons(module: ir.Operation) -> None:
    """Drop the reasons left on batched matmuls (WHY) where no report reads them."""
    for op in find_ops(module, lambda o: WHY in o.attributes):
        del op.attributes[WHY]
