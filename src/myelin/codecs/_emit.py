"""The emission toolkit: building decode IR from MLIR text templates and moving it into place.

A codec's decode (`Layout.decode`, MLIR lines over the parts' scalars) becomes a
`linalg.generic` over the consumer's operand (`decode_ops`, `emit_tensor_decode`), with the
layout ops of the use folded into its indexing maps; a split layout (q4: the contracted axis in
groups) decodes over (group, element in group) and collapses. Templates are parsed in the
module's context and their ops moved before the consumer (`parse_template`, `template_body`,
`remap`)."""

from __future__ import annotations

import re

from iree.compiler import ir

from myelin.codecs._contract import Layout
from myelin.codecs._uses import DIM, Chain
from myelin.errors import CompileError

DECODE_ATTRIBUTE = "plex.decode"  # on decode generics: "scope::key" (for people reading IR)


def tensor_type(shape: tuple[int, ...], element: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + f"{element}>"


def substitute(expr: str, src: list[int]) -> str:
    """`expr` over logical dims, rewritten over the dims of the consumer's operand."""
    return DIM.sub(lambda m: f"d{src[int(m.group(1))]}", expr)


def parse_template(context: ir.Context, text: str) -> ir.Module:
    try:
        return ir.Module.parse(text, context=context)
    except ir.MLIRError as e:  # a bug here, not the user's: say what we built
        raise CompileError(f"internal error building decode IR: {e}\n{text}") from e


def template_body(template: ir.Module) -> tuple[ir.Block, list[ir.Operation]]:
    func = template.body.operations[0]
    block = func.regions[0].blocks[0]
    return block, [op.operation for op in block.operations]


def remap(ops: list[ir.Operation], mapping: list[tuple[ir.Value, ir.Value]]) -> None:
    for op in ops:
        for i, v in enumerate(list(op.operands)):
            for old, new in mapping:
                if v == old:
                    op.operands[i] = new
                    break


def decode_lines(layout: Layout, result_element: str) -> list[str]:
    lines = list(layout.decode)
    if result_element != "f32":
        lines.append(f"%r_cast = arith.truncf %r : f32 to {result_element}")
    return lines


def result_name(result_element: str) -> str:
    return "%r" if result_element == "f32" else "%r_cast"


def load_part(part_global: str, part_type: ir.Type, before: ir.Operation) -> ir.Value:
    with ir.InsertionPoint(before), before.location:
        op = ir.Operation.create(
            "util.global.load",
            results=[part_type],
            attributes={
                "global": ir.FlatSymbolRefAttr.get(part_global),
                "is_immutable": ir.UnitAttr.get(),
            },
        )
    return op.results[0]


def _split_expr(expr: str, src: list[int], axis: int, group: int, at: int) -> str:
    """A part's index expression over logical dims, rewritten over the dims of the consumer's
    operand with its dim `at` (the logical `axis`) split in two: (group, element in group)."""
    expr = expr.replace(f"d{axis} floordiv {group}", "G").replace(f"d{axis} mod {group}", "B")
    if f"d{axis}" in DIM.sub(lambda m: m.group(0) + " ", expr).split():
        raise CompileError(f"internal error: split decode reads d{axis} whole in {expr!r}")

    def dim(m: re.Match) -> str:
        d = src[int(m.group(1))]
        return f"d{d if d < at else d + 1}"

    return DIM.sub(dim, expr).replace("G", f"d{at}").replace("B", f"d{at + 1}")


def emit_tensor_decode(
    chain: Chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> list[ir.Operation]:
    """A bit-extend linalg.generic producing `chain.value`'s type from the parts, placed right
    before the consumer; the consumer reads it instead of the layout chain. Returns the ops
    placed (the decode, and the reshape after it for a split layout)."""
    target = ir.RankedTensorType(chain.value.type)
    reuse = None
    if chain.ops and decode_split(layout) is None:
        last = chain.ops[-1]
        reuse = last.operands[len(last.operands) - 1]  # a layout op's init has the result's type
    placed = decode_ops(
        layout,
        parts,
        target,
        chain.src,
        sizes_source(chain),
        chain.consumer,
        what,
        context,
        init=reuse,
    )
    chain.consumer.operands[chain.operand] = placed[-1].results[0]
    for op in reversed(chain.ops):
        op.erase()
    return placed


def sizes_source(chain: Chain) -> ir.Value:
    """A value with the sizes of what the consumer reads that outlives the layout ops (they are
    erased): their last one's init, or the loaded parameter itself."""
    if chain.ops:
        last = chain.ops[-1]
        return last.operands[len(last.operands) - 1]
    return chain.value


def decode_ops(
    layout: Layout,
    parts: list[ir.Value],
    target: ir.RankedTensorType,
    src: list[int],
    sized: ir.Value,
    before: ir.Operation,
    what: str,
    context: ir.Context,
    *,
    init: ir.Value | None = None,
) -> list[ir.Operation]:
    """The decode of `parts` into `target` (the consumer's operand, logical dim l at dim
    src[l]), placed before `before`: a linalg.generic, then for a split layout the reshape.

    A layout with `split` (q4: the contracted axis in groups) or `blocked` (fp16: the outputs
    in blocks) decodes over an iteration space with that axis as two dims, (group, element),
    then collapses them: every part is then read
    through a plain projection of the loop dims, which IREE's vectorizer needs; a per-group
    scale read at `k floordiv g` inside a 2-D decode compiled to a scalar loop."""
    element = str(target.element_type)
    shape = [target.get_dim_size(d) for d in range(target.rank)]
    split = decode_split(layout)
    if split is not None:
        axis, group = split
        at = src[axis]
        decoded_shape = [*shape[:at], shape[at] // group, group, *shape[at + 1 :]]

        def index(e: str) -> str:
            return _split_expr(e, src, axis, group, at)
    else:
        decoded_shape = shape

        def index(e: str) -> str:
            return substitute(e, src)

    rank = len(decoded_shape)
    decoded = ir.RankedTensorType.get(
        decoded_shape, target.element_type, loc=ir.Location.unknown(context)
    )
    dims = ", ".join(f"d{i}" for i in range(rank))
    maps = [
        f"affine_map<({dims}) -> ({', '.join(index(e) for e in p.index)})>" for p in layout.parts
    ]
    maps.append(f"affine_map<({dims}) -> ({dims})>")
    part_types = [str(v.type) for v in parts]
    args = ", ".join(f"%a{i}: {t}" for i, t in enumerate(part_types))
    block_args = ", ".join(f"%p{i}: {p.element}" for i, p in enumerate(layout.parts))
    body = "\n".join(f"      {line}" for line in decode_lines(layout, element))
    result = f"%out : {decoded}"
    tail = ""
    if split is not None:
        groups = (
            [[d] for d in range(at)]
            + [[at, at + 1]]
            + [[d + 1] for d in range(at + 1, target.rank)]
        )
        tail = f"  %flat = tensor.collapse_shape %out {groups} : {decoded} into {target}\n"
        result = f"%flat : {target}"
    text = f"""
func.func private @decode({args}, %init: {decoded}) -> {target} {{
  %out = linalg.generic {{indexing_maps = [{", ".join(maps)}],
      iterator_types = [{", ".join(['"parallel"'] * rank)}]}}
      ins({", ".join(f"%a{i}" for i in range(len(parts)))} : {", ".join(part_types)})
      outs(%init : {decoded}) {{
    ^bb0({block_args}, %o: {element}):
{body}
      linalg.yield {result_name(element)} : {element}
  }} -> {decoded}
{tail}  return {result}
}}"""
    template = parse_template(context, text)
    block, ops = template_body(template)
    placed = ops[:-1]  # the decode (and its reshape), without the return
    if init is None:
        init = empty_tensor(decoded, sized, before, context)
    for op in placed:
        op.move_before(before)
    remap(placed, [*zip(block.arguments, [*parts, init], strict=True)])
    placed[0].attributes[DECODE_ATTRIBUTE] = ir.StringAttr.get(what, context)
    return placed


def dynamic_sizes(value: ir.Value, before: ir.Operation, context: ir.Context) -> list[ir.Value]:
    """`tensor.dim`s of `value`'s dynamic dims, placed before `before`."""
    t = ir.RankedTensorType(value.type)
    index = ir.IndexType.get(context)
    sizes = []
    with ir.InsertionPoint(before), ir.Location.unknown(context):
        for d in range(t.rank):
            if t.is_dynamic_dim(d):
                c = ir.Operation.create(
                    "arith.constant",
                    results=[index],
                    attributes={"value": ir.IntegerAttr.get(index, d)},
                )
                sizes.append(
                    ir.Operation.create(
                        "tensor.dim", results=[index], operands=[value, c.results[0]]
                    ).results[0]
                )
    return sizes


def empty_tensor(
    t: ir.RankedTensorType, sized: ir.Value, before: ir.Operation, context: ir.Context
) -> ir.Value:
    """A tensor.empty of type `t` whose dynamic sizes are those of `sized` (the same dims)."""
    sizes = dynamic_sizes(sized, before, context)
    with ir.InsertionPoint(before), ir.Location.unknown(context):
        return ir.Operation.create("tensor.empty", results=[t], operands=sizes).results[0]


def zeros(like: ir.Value, before: ir.Operation, context: ir.Context) -> ir.Value:
    """A zero-filled tensor of `like`'s type and sizes (a linalg.fill of a tensor.empty)."""
    t = ir.RankedTensorType(like.type)
    element = str(t.element_type)
    zero = "0.0" if isinstance(t.element_type, ir.FloatType) else "0"
    text = f"""
func.func private @z(%init: {t}) -> {t} {{
  %c = arith.constant {zero} : {element}
  %f = linalg.fill ins(%c : {element}) outs(%init : {t}) -> {t}
  return %f : {t}
}}"""
    template = parse_template(context, text)  # owns the ops until they are moved
    block, ops = template_body(template)
    init = empty_tensor(t, like, before, context)
    for op in ops[:-1]:
        op.move_before(before)
    remap(ops[:-1], [(block.arguments[0], init)])
    return ops[1].results[0]


# The split decode (Layout.split) needs a weight with more outputs than this: with 64 or fewer
# (measured: 16, 32, 64 fail; 80, 96, 128 and up compile), IREE 3.13 propagates the decode's
# reshape into the contraction and its CPU backend then refuses the resulting vectors ("large
# vector sizes"). Such small weights keep the plain decode (correct, not vectorized).
_SPLIT_MIN_OUTPUTS = 65


def split_of(layout: Layout) -> tuple[int, int] | None:
    """`layout.split` if the decode of this weight can use it (see _SPLIT_MIN_OUTPUTS)."""
    if layout.split is None or len(layout.logical_shape) != 2:
        return layout.split
    axis, _ = layout.split
    return layout.split if layout.logical_shape[1 - axis] >= _SPLIT_MIN_OUTPUTS else None


def decode_split(layout: Layout) -> tuple[int, int] | None:
    """(logical axis, size) the decode iterates as two dims: q4's groups where `split_of`
    keeps them, fp16's blocks of outputs."""
    return split_of(layout) or layout.blocked
