"""Concats of elementwise results as one elementwise op, so IREE writes them in one dispatch.

IREE 3.13 turns a `tensor.concat` into `tensor.insert_slice`s of its operands into an empty
tensor. Along an inner dimension each slice is strided, so dispatch formation cannot make the
producers write into it in place: each operand is computed by a dispatch of its own and copied
in by a `slow_memcpy` dispatch. The rotary embedding's `cat(x1 * cos - x2 * sin, x1 * sin + x2 *
cos, dim=-1)` costs two such copies per call (0.081 ms each on the H200 at the Llama-7B block's
prefill, docs/kernels.md).

The rewrite, at IREE's `input` phase: a concat along dim c of n operands of the same shape S,
each the one result of an all-parallel `linalg.generic` with an identity output that only the
concat uses, becomes one `linalg.generic` over S with an n-sized dim inserted before c (its
body computes every operand's body and selects operand j's value at index j), then a
`tensor.collapse_shape` of the two dims into the concat's. Each output element is computed by
the same ops as before (codegen may contract a product and a sum into an fma in one form and
not the other: one rounding apart at most, tests/myelin/test_kernels_concat.py); the collapse
is a view; and the new op is elementwise, so IREE fuses its producers into it as it did into
the operands' ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.placement import find_ops


@dataclass(frozen=True)
class ConcatSite:
    """One concat and what the rewrite did with it."""

    function: str
    location: str
    shape: tuple[int, ...]
    operands: int
    fused: bool
    reason: str

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "location": self.location,
            "op": "concat",
            "shape": list(self.shape),
            "operands": self.operands,
            "kernel": "elementwise" if self.fused else None,
            "reason": self.reason,
        }


def _op(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    return owner if isinstance(owner, ir.Operation) else None


def _why_not(generic: ir.Operation | None, concat: ir.Operation) -> str:
    """Why this concat operand's producer cannot join the fused op ("" when it can)."""
    if generic is None or generic.name != "linalg.generic":
        return "an operand is not the result of a linalg.generic"
    if len(generic.results) != 1 or len(generic.regions[0].blocks) != 1:
        return "an operand's generic has more than one result"
    uses = list(generic.results[0].uses)
    if len(uses) != 1 or getattr(uses[0].owner, "operation", uses[0].owner) != concat:
        return "an operand has another use besides the concat"
    iterators = str(generic.attributes["iterator_types"])
    if "reduction" in iterators or "window" in iterators:
        return "an operand's generic is not all-parallel"
    maps = ir.ArrayAttr(generic.attributes["indexing_maps"])
    out_map = ir.AffineMapAttr(maps[len(maps) - 1]).value
    if not out_map.is_permutation or str(out_map) != str(ir.AffineMap.get_identity(out_map.n_dims)):
        return "an operand's generic does not write its result in iteration order"
    block = generic.regions[0].blocks[0]
    if list(block.arguments[len(block.arguments) - 1].uses):
        return "an operand's generic reads its output"
    for op in block.operations:
        if op.name == "linalg.index":
            return "an operand's generic reads its indices"
        if len(op.regions):
            return f"an operand's generic holds {op.name}, which has regions"
    return ""


def _function_name(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None and parent.name not in ("util.func", "func.func"):
        parent = parent.parent
    return "?" if parent is None else ir.StringAttr(parent.attributes["sym_name"]).value


def fuse_concats(module: ir.Operation) -> list[ConcatSite]:
    """Rewrite every concat the module-level rule above covers; report every concat."""
    sites = []
    for concat in find_ops(module, lambda op: op.name == "tensor.concat"):
        result = ir.RankedTensorType(concat.results[0].type)
        shape = tuple(result.shape)
        operands = list(concat.operands)
        dim = ir.IntegerAttr(concat.attributes["dim"]).value
        generics = [_op(v) for v in operands]
        reason = ""
        types = {str(v.type) for v in operands}
        if not result.has_static_shape:
            reason = "dynamic shape"
        elif len(types) != 1:
            reason = "operands of different shapes"
        elif any(a == b for i, a in enumerate(operands) for b in operands[i + 1 :]):
            reason = "an operand appears twice"
        else:
            reason = next((w for w in (_why_not(g, concat) for g in generics) if w), "")
        function, location = _function_name(concat), str(concat.location)
        fused = not reason
        if fused:
            _rewrite(concat, generics, dim)  # type: ignore[arg-type]
            reason = f"{len(generics)} elementwise operands computed in one op"
        sites.append(ConcatSite(function, location, shape, len(operands), fused, reason))
    return sites


def _rewrite(concat: ir.Operation, generics: list[ir.Operation], dim: int) -> None:
    n = len(generics)
    part = ir.RankedTensorType(generics[0].results[0].type)
    rank = part.rank
    element = part.element_type
    wide_shape = [*part.shape[:dim], n, *part.shape[dim:]]
    wide = ir.RankedTensorType.get(wide_shape, element, loc=concat.location)
    # (d0 .. d_rank) of the new op -> the operands' (d0 .. d_{rank-1}): the new dim dropped
    drop = ir.AffineMap.get(
        rank + 1, 0, [ir.AffineDimExpr.get(k) for k in range(rank + 1) if k != dim]
    )
    inputs, maps = [], []
    for g in generics:
        old_maps = ir.ArrayAttr(g.attributes["indexing_maps"])
        ins = len(g.operands) - 1
        for i in range(ins):
            inputs.append(g.operands[i])
            old_map = ir.AffineMapAttr(old_maps[i]).value
            exprs = [e.compose(drop) for e in old_map.results]
            maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(rank + 1, 0, exprs)))
    maps.append(ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank + 1)))
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    location = concat.location
    with ir.InsertionPoint(concat), location:
        empty = ir.Operation.create("tensor.empty", results=[wide])
        fused = ir.Operation.create(
            "linalg.generic",
            results=[wide],
            operands=[*inputs, empty.results[0]],
            attributes={
                "indexing_maps": ir.ArrayAttr.get(maps),
                "iterator_types": ir.ArrayAttr.get([parallel] * (rank + 1)),
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(inputs), 1]),
            },
            regions=1,
        )
        block = fused.regions[0].blocks.append(*[v.type.element_type for v in inputs], element)
    with ir.InsertionPoint(block), location:
        values = []
        arg = 0
        for g in generics:
            old = g.regions[0].blocks[0]
            mapping = {}
            for i in range(len(g.operands) - 1):
                mapping[old.arguments[i]] = block.arguments[arg]
                arg += 1
            for op in old.operations:
                if op.name == "linalg.yield":
                    values.append(mapping.get(op.operands[0], op.operands[0]))
                    break
                new = ir.Operation.create(
                    op.name,
                    results=[r.type for r in op.results],
                    operands=[mapping.get(v, v) for v in op.operands],
                    attributes={name: op.attributes[name] for name in op.attributes},
                )
                for old_result, new_result in zip(op.results, new.results, strict=True):
                    mapping[old_result] = new_result
        index = ir.IndexType.get()
        j = ir.Operation.create(
            "linalg.index",
            results=[index],
            attributes={"dim": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)},
        ).results[0]
        chosen = values[-1]
        for i in range(n - 2, -1, -1):
            c = ir.Operation.create(
                "arith.constant",
                results=[index],
                attributes={"value": ir.IntegerAttr.get(index, i)},
            ).results[0]
            eq = ir.Operation.create(
                "arith.cmpi",
                results=[ir.IntegerType.get_signless(1)],
                operands=[j, c],
                attributes={"predicate": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)},
            ).results[0]
            chosen = ir.Operation.create(
                "arith.select", results=[element], operands=[eq, values[i], chosen]
            ).results[0]
        ir.Operation.create("linalg.yield", operands=[chosen])
    groups = [[k] for k in range(dim)] + [[dim, dim + 1]] + [[k + 1] for k in range(dim + 1, rank)]
    with ir.InsertionPoint(concat), location:
        collapsed = ir.Operation.create(
            "tensor.collapse_shape",
            results=[concat.results[0].type],
            operands=[fused.results[0]],
            attributes={"reassociation": ir.Attribute.parse(str(groups))},
        )
    concat.results[0].replace_all_uses_with(collapsed.results[0])
    concat.erase()
    for g in generics:
        g.erase()
