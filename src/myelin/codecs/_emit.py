"""The emission toolkit: building decode IR from MLIR text templates and moving it into place.

A codec's decode (`Layout.decode`, MLIR lines over the parts' scalars) becomes a
`linalg.generic` over the consumer's operand (`decode_ops`, `emit_tensor_decode`), with the
layout ops of the use folded into its indexing maps; a split layout (q4: the contracted axis in
groups) decodes over (group, element in group) and collapses. Templates are parsed in the
module's context and their ops moved before the consumer (`parse_template`, `template_body`,
`remap`)."""

from __future__ import annotations

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


def _split_expr(expr: str, src: list[int], splits: dict[int, tuple[int, int]]) -> str:
    """A part's index expression over logical dims, rewritten over the dims of the consumer's
    operand with each dim `at` of `splits` (at -> (logical axis, size)) split in two: (group,
    element in group) for q4's groups, (block, element in block) for blocks of outputs."""
    marks: dict[str, tuple[int, int]] = {}
    for at, (axis, size) in splits.items():
        for half, op in enumerate(("floordiv", "mod")):
            mark = f"@{at}_{half}@"
            expr = expr.replace(f"d{axis} {op} {size}", mark)
            marks[mark] = (at, half)
    for axis, _ in splits.values():
        if f"d{axis}" in DIM.sub(lambda m: m.group(0) + " ", expr).split():
            raise CompileError(f"internal error: split decode reads d{axis} whole in {expr!r}")

    def moved(d: int) -> int:  # the operand's dim d after the split dims before it
        return d + sum(1 for at in splits if at < d)

    expr = DIM.sub(lambda m: f"d{moved(src[int(m.group(1))])}", expr)
    for mark, (at, half) in marks.items():
        expr = expr.replace(mark, f"d{moved(at) + half}")
    return expr


def emit_tensor_decode(
    chain: Chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> list[ir.Operation]:
    """A bit-extend linalg.generic producing `chain.value`'s type from the parts, placed right
    before the consumer; the consumer reads it instead of the layout chain. Returns the ops
    placed (the decode, and the reshape after it for a split layout)."""
    target = ir.RankedTensorType(chain.value.type)
    reuse = None
    if chain.ops and not decode_splits(layout):
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
    keep_blocks: bool = False,
) -> list[ir.Operation]:
    """The decode of `parts` into `target` (the consumer's operand, logical dim l at dim
    src[l]), placed before `before`: a linalg.generic, then for a split layout the reshape.

    A layout with `split` (q4: the contracted axis in groups) or `blocked` (fp16, int8, q4: the
    outputs in blocks), or both, decodes over an iteration space with each such axis as two
    dims, (group, element) and (block, element), then collapses them: every part is then read
    through a plain projection of the loop dims, which IREE's vectorizer needs; a per-group
    scale read at `k floordiv g` inside a 2-D decode compiled to a scalar loop. `keep_blocks`:
    the result keeps the blocks of outputs as two dims (a contraction over the blocks reads
    it, myelin.codecs._blocked); only the groups are collapsed."""
    element = str(target.element_type)
    shape = [target.get_dim_size(d) for d in range(target.rank)]
    splits = {src[axis]: (axis, size) for axis, size in decode_splits(layout)}
    decoded_shape = [
        x
        for d, size in enumerate(shape)
        for x in ((size // splits[d][1], splits[d][1]) if d in splits else (size,))
    ]

    def index(e: str) -> str:
        return _split_expr(e, src, splits) if splits else substitute(e, src)

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
    kept = layout.blocked[0] if keep_blocks and layout.blocked is not None else None
    groups: list[list[int]] = []
    result_shape: list[int] = []
    for d, size in enumerate(shape):
        first = sum(len(g) for g in groups)
        if d in splits and splits[d][0] != kept:
            groups.append([first, first + 1])
            result_shape.append(size)
        elif d in splits:
            groups += [[first], [first + 1]]
            result_shape += [size // splits[d][1], splits[d][1]]
        else:
            groups.append([first])
            result_shape.append(size)
    if len(groups) != rank:
        result_t = ir.RankedTensorType.get(
            result_shape, target.element_type, loc=ir.Location.unknown(context)
        )
        tail = f"  %flat = tensor.collapse_shape %out {groups} : {decoded} into {result_t}\n"
        result = f"%flat : {result_t}"
    else:
        result_t = decoded
    text = f"""
func.func private @decode({args}, %init: {decoded}) -> {result_t} {{
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


def decode_splits(layout: Layout) -> list[tuple[int, int]]:
    """(logical axis, size) of each axis the decode iterates as two dims: q4's groups where
    `split_of` keeps them, the blocks of outputs (fp16, int8, q4)."""
    return [s for s in (split_of(layout), layout.blocked) if s is not None]
