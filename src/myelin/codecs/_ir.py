"""Codecs on the imported (input-phase) IR, through the compiler's Python bindings.

For an encoded parameter, its `util.global` is replaced by one global per stored part, and every
use of a `util.global.load` of it gets its own decode, emitted right next to the consumer:

- the use is followed through pure layout ops (linalg.transpose, linalg.broadcast, copy-only
  linalg.generic, each with one use) to the op that really consumes the weight; the decode
  produces that op's operand directly, with the layout folded into its indexing maps, so no
  transposed or broadcast copy of the weight exists either;
- a contraction consumer (matmul, batch_matmul, conv, a linalg.generic with reductions) gets the
  decode as a bit-extend `linalg.generic` placed before it, and the two are wrapped in one
  `flow.dispatch.region`: IREE 3.13 blocks producer fusion into matmuls on CPU
  (`--iree-dispatch-creation-block-matmul-producer-fusion`, a process-global flag the compiler
  C API cannot set per session), and would otherwise hoist small decodes into initializers;
- a `tensor.extract` of the weight (an embedding gather inside a linalg.generic body) becomes
  extracts of the stored parts at the same element plus the scalar decode, so only the rows
  read are decoded;
- any other consumer gets the decode before it and IREE decides (the no-materialization check
  reports the parameter if the decoded weight ends up in a dispatch of its own).

A matmul that is not a matvec also gets a second, load-time form, kept by data-tiled variants
(myelin.codecs._loadtime).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from iree.compiler import ir
from iree.compiler.dialects import linalg

from myelin.codecs import Layout, StoredPart
from myelin.errors import CompileError

DECODE_ATTRIBUTE = "plex.decode"  # on decode generics: "scope::key" (for people reading IR)

_ELEMENT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_DIM = re.compile(r"d([0-9]+)")


@dataclass
class Use:
    """Where one use of a parameter's value ends up after its layout ops."""

    kind: str  # "contraction" | "gather" | "other"
    consumer: str  # op name, for reports
    reduce_axes: tuple[int, ...] | None  # logical axes the consumer contracts (None: unknown)
    order: tuple[int, ...] = ()  # logical axes in the order the consumer's operand has them


@dataclass
class UseReport:
    """What the rewrite did with one parameter, for the build record."""

    uses: list[str] = field(default_factory=list)  # one entry per use: "contraction linalg.matmul"


# -- finding things -------------------------------------------------------------------------------


def module_globals(module: ir.Operation) -> dict[str, ir.Operation]:
    found = {}
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "util.global":
            found[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op.operation
    return found


def symbol_users(module: ir.Operation) -> dict[str, list[ir.Operation]]:
    """global name -> ops that name it in a `global` attribute (loads, stores, addresses)."""
    users: dict[str, list[ir.Operation]] = {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name != "util.global" and "global" in op.attributes:
            attr = op.attributes["global"]
            if isinstance(attr, ir.FlatSymbolRefAttr):
                users.setdefault(attr.value, []).append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return users


# -- layout chains --------------------------------------------------------------------------------


def _dense_i64(attr: ir.Attribute) -> list[int]:
    return [int(v) for v in ir.DenseI64ArrayAttr(attr)]


def _map_dims(m: ir.AffineMap) -> list[int] | None:
    """The loop dim of each result, if every result is a plain dim."""
    dims = []
    for e in m.results:
        match = _DIM.fullmatch(str(e))
        if match is None:
            return None
        dims.append(int(match.group(1)))
    return dims


def _segments(op: ir.Operation) -> tuple[int, int]:
    sizes = [int(v) for v in ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])]
    return sizes[0], sizes[1]


def _is_copy_generic(op: ir.Operation) -> bool:
    if op.name != "linalg.generic" or _segments(op) != (1, 1):
        return False
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in it for it in iterators):
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 1 or body[0].operation.name != "linalg.yield":
        return False
    if body[0].operation.operands[0] != block.arguments[0]:
        return False
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    out = _map_dims(maps[1])
    return out == list(range(maps[1].n_dims)) and _map_dims(maps[0]) is not None


def _layout_step(op: ir.Operation, operand: int, src: list[int]) -> list[int] | None:
    """`src` (logical dim -> dim of the op's input) carried to the op's result, if `op` only
    moves data (a transpose, a broadcast, a copy); None otherwise."""
    if operand != 0 or len(op.results) != 1:
        return None
    if op.name == "linalg.transpose":
        perm = _dense_i64(op.attributes["permutation"])
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        return [inverse[s] for s in src]
    if op.name == "linalg.broadcast":
        added = set(_dense_i64(op.attributes["dimensions"]))
        rank = ir.RankedTensorType(op.results[0].type).rank
        kept = [d for d in range(rank) if d not in added]
        return [kept[s] for s in src]
    if _is_copy_generic(op):
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        loops = _map_dims(maps[0])
        assert loops is not None
        return [loops[s] for s in src]
    return None


@dataclass
class _Chain:
    value: ir.Value  # what the consumer reads
    consumer: ir.Operation
    operand: int  # which operand of the consumer
    src: list[int]  # logical dim l is dim src[l] of `value`
    ops: list[ir.Operation]  # layout ops between the load and the consumer, in order


def _only_use(value: ir.Value) -> tuple[ir.Operation, int] | None:
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    return uses[0].owner, uses[0].operand_number


def _follow(value: ir.Value, owner: ir.Operation, operand: int, rank: int) -> _Chain:
    src = list(range(rank))
    ops: list[ir.Operation] = []
    while True:
        step = _layout_step(owner, operand, src)
        if step is None:
            break
        nxt = _only_use(owner.results[0])
        if nxt is None:
            break
        ops.append(owner)
        value, src = owner.results[0], step
        owner, operand = nxt
    return _Chain(value, owner, operand, src, ops)


def _opview(op: ir.Operation):
    return op.opview


def _reduction_loops(op: ir.Operation) -> set[int] | None:
    """Reduction loop dims of a linalg op, or None if it is not a contraction-like op."""
    if op.name == "linalg.generic":
        iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        loops = {i for i, it in enumerate(iterators) if "reduction" in it}
        return loops or None
    if not op.name.startswith("linalg."):
        return None
    try:
        view = _opview(op)
        if linalg.isa_contraction_op(view):
            dims = linalg.infer_contraction_dimensions(view)
            return set(dims.k) or None
        if linalg.isa_convolution_op(view):
            dims = linalg.infer_convolution_dimensions(view)
            return set(dims.filter_loop) | set(dims.input_channel) or None
    except (TypeError, ValueError, RuntimeError):
        return None
    return None


def _dps_inputs(op: ir.Operation) -> int:
    if "operandSegmentSizes" in op.attributes:
        return _segments(op)[0]
    return len(op.operands) - len(op.results)


def classify(chain: _Chain) -> Use:
    consumer = chain.consumer
    name = consumer.name
    if name == "tensor.extract" and chain.operand == 0:
        rank = len(chain.src)
        return Use("gather", name, (rank - 1,) if rank else ())
    loops = _reduction_loops(consumer) if name.startswith("linalg.") else None
    if loops is not None and chain.operand < _dps_inputs(consumer):
        try:
            maps = linalg.get_indexing_maps(_opview(consumer))
        except (TypeError, ValueError, RuntimeError):
            maps = None
        if maps is not None:
            dims = _map_dims(ir.AffineMapAttr(maps[chain.operand]).value)
            axes = None
            if dims is not None:
                axes = tuple(d for d, s in enumerate(chain.src) if dims[s] in loops)
            order = tuple(sorted(range(len(chain.src)), key=lambda d: chain.src[d]))
            return Use("contraction", name, axes, order)
    return Use("other", name, None)


def analyze(module: ir.Operation, names: list[str]) -> dict[str, list[Use] | str]:
    """Per global: how each use of it is consumed, or why it cannot be encoded."""
    users = symbol_users(module)
    globals_ = module_globals(module)
    result: dict[str, list[Use] | str] = {}
    for name in names:
        rank = ir.RankedTensorType(ir.TypeAttr(globals_[name].attributes["type"]).value).rank
        ops = users.get(name, [])
        other = sorted({op.name for op in ops if op.name != "util.global.load"})
        if other:
            result[name] = f"the graph uses it through {', '.join(other)}, not only loads"
            continue
        uses: list[Use] = []
        for load in ops:
            for use in list(load.results[0].uses):
                uses.append(classify(_follow(load.results[0], use.owner, use.operand_number, rank)))
        result[name] = uses
    return result


def storage_order_of(uses: list[Use], rank: int) -> tuple[int, ...]:
    """The axis order to store a parameter's data in: the one its (first) contraction reads,
    so its decode streams the bytes in order; the logical order for a table that is gathered
    (rows stay contiguous) or a parameter no contraction reads."""
    if any(u.kind == "gather" for u in uses):
        return tuple(range(rank))
    for u in uses:
        if u.kind == "contraction" and u.order:
            return u.order
    return tuple(range(rank))


def reduce_axes_of(uses: list[Use], rank: int) -> tuple[int, ...]:
    """The axes a codec should share scales along: those the consumers contract (the first
    contraction's if they differ), else the last axis (rows stay addressable)."""
    for u in uses:
        if u.kind == "contraction" and u.reduce_axes:
            return u.reduce_axes
    return (rank - 1,) if rank else ()


# -- rewriting ------------------------------------------------------------------------------------


def _tensor_type(shape: tuple[int, ...], element: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + f"{element}>"


def _substitute(expr: str, src: list[int]) -> str:
    """`expr` over logical dims, rewritten over the dims of the consumer's operand."""
    return _DIM.sub(lambda m: f"d{src[int(m.group(1))]}", expr)


def _parse_template(context: ir.Context, text: str) -> ir.Module:
    try:
        return ir.Module.parse(text, context=context)
    except ir.MLIRError as e:  # a bug here, not the user's: say what we built
        raise CompileError(f"internal error building decode IR: {e}\n{text}") from e


def _template_body(template: ir.Module) -> tuple[ir.Block, list[ir.Operation]]:
    func = template.body.operations[0]
    block = func.regions[0].blocks[0]
    return block, [op.operation for op in block.operations]


def _remap(ops: list[ir.Operation], mapping: list[tuple[ir.Value, ir.Value]]) -> None:
    for op in ops:
        for i, v in enumerate(list(op.operands)):
            for old, new in mapping:
                if v == old:
                    op.operands[i] = new
                    break


def _decode_lines(layout: Layout, result_element: str) -> list[str]:
    lines = list(layout.decode)
    if result_element != "f32":
        lines.append(f"%r_cast = arith.truncf %r : f32 to {result_element}")
    return lines


def _result_name(result_element: str) -> str:
    return "%r" if result_element == "f32" else "%r_cast"


def _load(part_global: str, part_type: ir.Type, before: ir.Operation) -> ir.Value:
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
    if f"d{axis}" in _DIM.sub(lambda m: m.group(0) + " ", expr).split():
        raise CompileError(f"internal error: split decode reads d{axis} whole in {expr!r}")

    def dim(m: re.Match) -> str:
        d = src[int(m.group(1))]
        return f"d{d if d < at else d + 1}"

    return _DIM.sub(dim, expr).replace("G", f"d{at}").replace("B", f"d{at + 1}")


def _emit_tensor_decode(
    chain: _Chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> list[ir.Operation]:
    """A bit-extend linalg.generic producing `chain.value`'s type from the parts, placed right
    before the consumer; the consumer reads it instead of the layout chain. Returns the ops
    placed (the decode, and the reshape after it for a split layout)."""
    target = ir.RankedTensorType(chain.value.type)
    reuse = None
    if chain.ops and _split_of(layout) is None:
        last = chain.ops[-1]
        reuse = last.operands[len(last.operands) - 1]  # a layout op's init has the result's type
    placed = _decode_ops(
        layout,
        parts,
        target,
        chain.src,
        _sizes_source(chain),
        chain.consumer,
        what,
        context,
        init=reuse,
    )
    chain.consumer.operands[chain.operand] = placed[-1].results[0]
    for op in reversed(chain.ops):
        op.erase()
    return placed


def _sizes_source(chain: _Chain) -> ir.Value:
    """A value with the sizes of what the consumer reads that outlives the layout ops (they are
    erased): their last one's init, or the loaded parameter itself."""
    if chain.ops:
        last = chain.ops[-1]
        return last.operands[len(last.operands) - 1]
    return chain.value


def _decode_ops(
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

    A layout with `split` (q4: the contracted axis in groups) decodes over an iteration space
    with that axis as two dims, (group, element), then collapses them: every part is then read
    through a plain projection of the loop dims, which IREE's vectorizer needs; a per-group
    scale read at `k floordiv g` inside a 2-D decode compiled to a scalar loop."""
    element = str(target.element_type)
    shape = [target.get_dim_size(d) for d in range(target.rank)]
    split = _split_of(layout)
    if split is not None:
        axis, group = split
        at = src[axis]
        decoded_shape = [*shape[:at], shape[at] // group, group, *shape[at + 1 :]]

        def index(e: str) -> str:
            return _split_expr(e, src, axis, group, at)
    else:
        decoded_shape = shape

        def index(e: str) -> str:
            return _substitute(e, src)

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
    body = "\n".join(f"      {line}" for line in _decode_lines(layout, element))
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
      linalg.yield {_result_name(element)} : {element}
  }} -> {decoded}
{tail}  return {result}
}}"""
    template = _parse_template(context, text)
    block, ops = _template_body(template)
    placed = ops[:-1]  # the decode (and its reshape), without the return
    if init is None:
        init = _empty(decoded, sized, before, context)
    for op in placed:
        op.move_before(before)
    _remap(placed, [*zip(block.arguments, [*parts, init], strict=True)])
    placed[0].attributes[DECODE_ATTRIBUTE] = ir.StringAttr.get(what, context)
    return placed


def _dynamic_sizes(value: ir.Value, before: ir.Operation, context: ir.Context) -> list[ir.Value]:
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


def _empty(
    t: ir.RankedTensorType, sized: ir.Value, before: ir.Operation, context: ir.Context
) -> ir.Value:
    """A tensor.empty of type `t` whose dynamic sizes are those of `sized` (the same dims)."""
    sizes = _dynamic_sizes(sized, before, context)
    with ir.InsertionPoint(before), ir.Location.unknown(context):
        return ir.Operation.create("tensor.empty", results=[t], operands=sizes).results[0]


# The split decode (Layout.split) needs a weight with more outputs than this: with 64 or fewer
# (measured: 16, 32, 64 fail; 80, 96, 128 and up compile), IREE 3.13 propagates the decode's
# reshape into the contraction and its CPU backend then refuses the resulting vectors ("large
# vector sizes"). Such small weights keep the plain decode (correct, not vectorized).
_SPLIT_MIN_OUTPUTS = 65


def _split_of(layout: Layout) -> tuple[int, int] | None:
    """`layout.split` if the decode of this weight can use it (see _SPLIT_MIN_OUTPUTS)."""
    if layout.split is None or len(layout.logical_shape) != 2:
        return layout.split
    axis, _ = layout.split
    return layout.split if layout.logical_shape[1 - axis] >= _SPLIT_MIN_OUTPUTS else None


# A q4 contraction decodes its weight into a tile of [K, output tile] floats on the stack of each
# CPU worker (IREE fuses the decode through its reshape only at the output tiling level), and
# IREE's llvm-cpu backend refuses more than 32 KiB of stack. So a contracted axis longer than
# this is split into chunks of at most this many elements, one dispatch each, summed after: 256
# keeps the tile at 32 KiB for output tiles of up to 32 floats (AVX-512 batch matmuls). A
# matvec (one activation row) takes q4's grouped form instead: no such tile (codecs._matvec).
_CHUNK_K = 256


def _chunks(layout: Layout) -> list[tuple[int, int]]:
    """(first group, group count) of each chunk of the contracted axis; one chunk if short."""
    assert layout.split is not None
    axis, group = layout.split
    groups = layout.logical_shape[axis] // group
    per = max(1, _CHUNK_K // group)
    return [(g, min(per, groups - g)) for g in range(0, groups, per)]


def _slice(
    value: ir.Value, dim: int, start: int, size: int, before: ir.Operation, context: ir.Context
) -> ir.Value:
    """`value`[..., start:start+size, ...] along `dim` (a tensor.extract_slice)."""
    t = ir.RankedTensorType(value.type)
    dynamic = ir.ShapedType.get_dynamic_size()
    sizes = [dynamic if t.is_dynamic_dim(d) else t.get_dim_size(d) for d in range(t.rank)]
    sizes[dim] = size
    offsets = [0] * t.rank
    offsets[dim] = start
    result = ir.RankedTensorType.get(sizes, t.element_type, loc=ir.Location.unknown(context))
    dyn = _dynamic_sizes(value, before, context)
    if t.is_dynamic_dim(dim):
        raise CompileError("internal error: chunking a dynamic contracted axis")
    with ir.InsertionPoint(before), ir.Location.unknown(context):
        return ir.Operation.create(
            "tensor.extract_slice",
            results=[result],
            operands=[value, *dyn],
            attributes={
                "static_offsets": ir.DenseI64ArrayAttr.get(offsets),
                "static_sizes": ir.DenseI64ArrayAttr.get(sizes),
                "static_strides": ir.DenseI64ArrayAttr.get([1] * t.rank),
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 0, len(dyn), 0]),
            },
        ).results[0]


def _elementwise(
    inputs: list[ir.Value], body: list[str], before: ir.Operation, context: ir.Context
) -> ir.Value:
    """A linalg.generic over `inputs` (all of one tensor type) with `body` computing %r from
    %v0, %v1, ..., placed before `before`."""
    t = ir.RankedTensorType(inputs[0].type)
    element = str(t.element_type)
    dims = ", ".join(f"d{i}" for i in range(t.rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    args = ", ".join(f"%a{i}: {t}" for i in range(len(inputs)))
    text = f"""
func.func private @f({args}, %init: {t}) -> {t} {{
  %out = linalg.generic {{indexing_maps = [{", ".join([identity] * (len(inputs) + 1))}],
      iterator_types = [{", ".join(['"parallel"'] * t.rank)}]}}
      ins({", ".join(f"%a{i}" for i in range(len(inputs)))} : {", ".join([str(t)] * len(inputs))})
      outs(%init : {t}) {{
    ^bb0({", ".join(f"%v{i}: {element}" for i in range(len(inputs)))}, %o: {element}):
{chr(10).join("      " + line for line in body)}
      linalg.yield %r : {element}
  }} -> {t}
  return %out : {t}
}}"""
    template = _parse_template(context, text)  # owns the ops until they are moved
    block, ops = _template_body(template)
    init = _empty(t, inputs[0], before, context)
    ops[0].move_before(before)
    _remap([ops[0]], [*zip(block.arguments, [*inputs, init], strict=True)])
    return ops[0].results[0]


def _emit_chunked(
    chain: _Chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> bool:
    """A contraction whose contracted axis is longer than _CHUNK_K, as one decode + contraction
    dispatch per chunk of the axis (the first accumulating into the consumer's init, the others
    into zeros) and their sum. False (nothing changed) if the consumer's other input or its
    init is not one this can slice."""
    assert layout.split is not None
    consumer = chain.consumer
    if len(_chunks(layout)) < 2:
        return False
    axis, group = layout.split
    n_inputs = _dps_inputs(consumer)
    if n_inputs != 2 or len(consumer.results) != 1:
        return False
    try:
        maps = [ir.AffineMapAttr(m).value for m in linalg.get_indexing_maps(_opview(consumer))]
    except (TypeError, ValueError, RuntimeError):
        return False
    weight_dims = _map_dims(maps[chain.operand])
    other = 1 - chain.operand
    other_dims = _map_dims(maps[other])
    if weight_dims is None or other_dims is None:
        return False
    k_loop = weight_dims[chain.src[axis]]
    if k_loop not in other_dims:
        return False
    k_dim = other_dims.index(k_loop)
    activation = consumer.operands[other]
    init = consumer.operands[len(consumer.operands) - 1]
    element = str(ir.RankedTensorType(init.type).element_type)
    target = ir.RankedTensorType(chain.value.type)
    at = chain.src[axis]
    sized = _sizes_source(chain)
    # the dim of each part that runs over groups (q4: "d<axis> floordiv g"), None if none
    group_dims = [
        next((i for i, e in enumerate(p.index) if e == f"d{axis} floordiv {group}"), None)
        for p in layout.parts
    ]
    results = []
    for c, (first, count) in enumerate(_chunks(layout)):
        chunk_parts = [
            v if d is None else _slice(v, d, first, count, consumer, context)
            for v, d in zip(parts, group_dims, strict=True)
        ]
        shape = [target.get_dim_size(d) for d in range(target.rank)]
        shape[at] = count * group
        chunk_target = ir.RankedTensorType.get(
            shape, target.element_type, loc=ir.Location.unknown(context)
        )
        placed = _decode_ops(
            layout, chunk_parts, chunk_target, chain.src, sized, consumer, what, context
        )
        piece = _slice(activation, k_dim, first * group, count * group, consumer, context)
        start = init if c == 0 else _zeros(init, consumer, context)
        clone = consumer.clone(ip=ir.InsertionPoint(consumer))
        clone.operands[chain.operand] = placed[-1].results[0]
        clone.operands[other] = piece
        clone.operands[len(clone.operands) - 1] = start
        _wrap_in_dispatch_region([*placed, clone], context)
        results.append(clone.parent.operation.results[0])
    total = _elementwise(results, _sum_body(len(results), element), consumer, context)
    consumer.results[0].replace_all_uses_with(total)
    consumer.erase()
    for op in reversed(chain.ops):
        op.erase()
    return True


def _sum_body(n: int, element: str) -> list[str]:
    """Lines adding %v0 ... %v<n-1> into %r."""
    add = "arith.addf" if element.startswith(("f", "bf")) else "arith.addi"
    lines, previous = [], "%v0"
    for i in range(1, n):
        name = "%r" if i == n - 1 else f"%s{i}"
        lines.append(f"{name} = {add} {previous}, %v{i} : {element}")
        previous = name
    return lines


def _zeros(like: ir.Value, before: ir.Operation, context: ir.Context) -> ir.Value:
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
    template = _parse_template(context, text)  # owns the ops until they are moved
    block, ops = _template_body(template)
    init = _empty(t, like, before, context)
    for op in ops[:-1]:
        op.move_before(before)
    _remap(ops[:-1], [(block.arguments[0], init)])
    return ops[1].results[0]


def _emit_scalar_decode(
    chain: _Chain, layout: Layout, parts: list[ir.Value], context: ir.Context
) -> None:
    """Replace `tensor.extract %weight[...]` by extracts of the parts at the same logical
    element and the scalar decode: only the elements read are ever decoded. A 4-bit part is
    read through its byte view (an i8 global over the same bytes): a scalar i4 extract does not
    compile for CUDA in IREE 3.13 ("failed to emulate bit width")."""
    extract = chain.consumer
    indices = list(extract.operands)[1:]
    rank = len(chain.src)
    logical = [indices[s] for s in chain.src]
    element = str(ir.RankedTensorType(chain.value.type).element_type)
    dims = ", ".join(f"d{i}" for i in range(rank))
    args = [f"%t{i}: {v.type}" for i, v in enumerate(parts)]
    args += [f"%i{d}: index" for d in range(rank)]
    lines = []
    for i, part in enumerate(layout.parts):
        names = []
        for j, expr in enumerate(part.index):
            plain = _DIM.fullmatch(expr)
            if plain is not None:
                names.append(f"%i{plain.group(1)}")
                continue
            name = f"%x{i}_{j}"
            lines.append(
                f"{name} = affine.apply affine_map<({dims}) -> ({expr})>"
                f"({', '.join(f'%i{d}' for d in range(rank))})"
            )
            names.append(name)
        if part.element != "i4":
            lines.append(f"%p{i} = tensor.extract %t{i}[{', '.join(names)}] : {parts[i].type}")
            continue
        # `parts[i]` is the byte view of 4-bit data (_byte_view): extract the byte holding the
        # element and shift its nibble down (the even element is the low nibble)
        last = part.index[-1]
        operands = ", ".join(f"%i{d}" for d in range(rank))
        apply = f"affine.apply affine_map<({dims}) -> (EXPR)>({operands})"
        lines += [
            f"%y{i} = {apply.replace('EXPR', f'({last}) floordiv 2')}",
            f"%z{i} = {apply.replace('EXPR', f'(({last}) mod 2) * 4')}",
            f"%w{i} = arith.index_cast %z{i} : index to i8",
            f"%b{i} = tensor.extract %t{i}[{', '.join([*names[:-1], f'%y{i}'])}] : {parts[i].type}",
            f"%s{i} = arith.shrui %b{i}, %w{i} : i8",
            f"%p{i} = arith.trunci %s{i} : i8 to i4",
        ]
    lines += _decode_lines(layout, element)
    body = "\n".join(f"  {line}" for line in lines)
    text = (
        f"func.func private @decode({', '.join(args)}) -> {element} {{\n{body}\n"
        f"  return {_result_name(element)} : {element}\n}}"
    )
    template = _parse_template(context, text)
    block, ops = _template_body(template)
    ret = ops[-1]
    result = ret.operands[0]
    moved = ops[:-1]
    for op in moved:
        op.move_before(extract)
    _remap(moved, [*zip(block.arguments, [*parts, *logical], strict=True)])
    extract.results[0].replace_all_uses_with(result)
    extract.erase()
    for op in reversed(chain.ops):
        op.erase()


def _init_chain(init: ir.Value) -> tuple[list[ir.Operation], list[ir.Value]] | None:
    """The ops that build a consumer's init (`tensor.empty`, then ops such as `linalg.fill`
    or a bias broadcast writing into it) and the empty's dynamic sizes; None if the init is
    built otherwise (then its sizes cannot be tied to the dispatch's workload)."""
    chain: list[ir.Operation] = []
    value = init
    while True:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return None
        op = owner.operation if hasattr(owner, "operation") else owner
        chain.append(op)
        if op.name == "tensor.empty":
            return list(reversed(chain)), list(op.operands)
        if not op.name.startswith("linalg.") or len(op.results) != 1:
            return None
        n_inputs = _dps_inputs(op)
        outs = list(op.operands)[n_inputs:]
        if len(outs) != 1:
            return None
        value = outs[0]


def _wrap_in_dispatch_region(ops: list[ir.Operation], context: ir.Context) -> None:
    """Put `ops` (the decode, then its consumer) into one flow.dispatch.region, so IREE's
    dispatch formation keeps them in one dispatch on every target.

    The region gets its own workgroup count (IREE's default: from the slice of its workload,
    the consumer's dynamic sizes) and its init is rebuilt inside from those sizes. A region
    with a workgroup count is one IREE's data tiling leaves alone: without it, data tiling
    (`--iree-global-opt-data-tiling`) packs the decoded weight inside this dispatch and the
    CPU backend refuses the result ("operations with large vector sizes"). A data-tiled
    variant keeps a matmul's load-time form instead (myelin.codecs._loadtime); what keeps this
    form there (a matvec, a conv) runs as fused decode + contraction, not data-tiled."""
    consumer = ops[-1]
    parent = consumer.parent
    if parent is not None and parent.operation.name == "flow.dispatch.region":
        return
    results = list(consumer.results)
    inits = list(consumer.operands)[len(consumer.operands) - len(results) :]
    chain = _init_chain(inits[0]) if len(inits) == 1 else None
    index = ir.IndexType.get(context)
    with ir.InsertionPoint(consumer), ir.Location.unknown(context):
        dims: list[ir.Value] = []
        if chain is not None:
            dims = chain[1]  # the init's dynamic sizes, in order: the result's dynamic dims
        else:
            for result, init in zip(results, inits, strict=True):
                t = ir.RankedTensorType(result.type)
                for d in range(t.rank):
                    if t.is_dynamic_dim(d):
                        c = ir.Operation.create(
                            "arith.constant",
                            results=[index],
                            attributes={"value": ir.IntegerAttr.get(index, d)},
                        )
                        dim = ir.Operation.create(
                            "tensor.dim", results=[index], operands=[init, c.results[0]]
                        )
                        dims.append(dim.results[0])
        workload = dims if chain is not None else []
        region = ir.Operation.create(
            "flow.dispatch.region",
            results=[r.type for r in results],
            operands=[*dims, *workload],
            attributes={
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(dims), len(workload)])
            },
            regions=2,  # the body, and the workgroup count
        )
    for old, new in zip(results, region.results, strict=True):
        old.replace_all_uses_with(new)
    block = region.regions[0].blocks.append()
    with ir.InsertionPoint(block), ir.Location.unknown(context):
        ret = ir.Operation.create("flow.return", operands=results)
    if chain is not None:
        _count_from_workload(region, block, ret, chain[0], workload, consumer, context)
    for op in ops:
        op.move_before(ret)


def _count_from_workload(
    region: ir.Operation,
    block: ir.Block,
    ret: ir.Operation,
    init_ops: list[ir.Operation],
    workload: list[ir.Value],
    consumer: ir.Operation,
    context: ir.Context,
) -> None:
    """IREE's default workgroup count, spelled out: the count region computes it from the
    workload, and inside the body each workload value is read through its ordinal (codegen
    ties the tile loops back to the workload that way); the init is rebuilt inside from them."""
    index = ir.IndexType.get(context)
    with ir.InsertionPoint(ret), ir.Location.unknown(context):
        ordinals = [
            ir.Operation.create(
                "iree_tensor_ext.dispatch.workload.ordinal",
                results=[index],
                operands=[w],
                attributes={"ordinal": ir.IntegerAttr.get(index, i)},
            ).results[0]
            for i, w in enumerate(workload)
        ]
    mapping = list(zip(workload, ordinals, strict=True))
    value = None
    for op in init_ops:
        clone = op.clone(ip=ir.InsertionPoint(ret))
        _remap([clone], mapping)
        if value is not None:  # the previous op's result is this one's init
            clone.operands[len(clone.operands) - 1] = value
        value = clone.results[0]
    consumer.operands[len(consumer.operands) - 1] = value
    with ir.Location.unknown(context):
        count = region.regions[1].blocks.append(*([index] * len(workload)))
    with ir.InsertionPoint(count), ir.Location.unknown(context):
        x, y, z = ir.Operation.create(
            "iree_tensor_ext.dispatch.workgroup_count_from_slice",
            results=[index, index, index],
            operands=list(count.arguments),
        ).results
        ir.Operation.create("flow.return", operands=[x, y, z])


def _part_global_name(name: str, role: str) -> str:
    return name if role == "data" else f"{name}.{role}"


def _replace_global(
    old: ir.Operation, scope: str, key: str, layout: Layout, context: ir.Context
) -> list[tuple[str, ir.Type]]:
    """New globals for the parts, bound to `scope::key<suffix>`; returns (name, type) each."""
    name = ir.StringAttr(old.attributes["sym_name"]).value
    created = []
    for part in layout.parts:
        part_type = ir.Type.parse(_tensor_type(part.shape, part.element), context)
        value = ir.Attribute.parse(
            f'#flow.parameter.named<"{scope}"::"{key}{part.suffix}"> : {part_type}', context
        )
        new = old.clone(ip=ir.InsertionPoint(old))
        new.attributes["sym_name"] = ir.StringAttr.get(
            _part_global_name(name, part.role) + ".encoded", context
        )
        new.attributes["type"] = ir.TypeAttr.get(part_type, context)
        new.attributes["initial_value"] = value
        created.append((ir.StringAttr(new.attributes["sym_name"]).value, part_type))
    return created


def _byte_view(
    old: ir.Operation, scope: str, key: str, part: StoredPart, context: ir.Context
) -> tuple[str, ir.Type]:
    """A global of i8 over a 4-bit part's bytes (the same parameter, its innermost dim
    halved): (name, type)."""
    shape = (*part.shape[:-1], part.shape[-1] // 2)
    view_type = ir.Type.parse(_tensor_type(shape, "i8"), context)
    new = old.clone(ip=ir.InsertionPoint(old))
    name = ir.StringAttr(old.attributes["sym_name"]).value
    new.attributes["sym_name"] = ir.StringAttr.get(f"{name}.bytes.encoded", context)
    new.attributes["type"] = ir.TypeAttr.get(view_type, context)
    new.attributes["initial_value"] = ir.Attribute.parse(
        f'#flow.parameter.named<"{scope}"::"{key}{part.suffix}"> : {view_type}', context
    )
    return ir.StringAttr(new.attributes["sym_name"]).value, view_type


def rewrite(
    module: ir.Operation, name: str, scope: str, key: str, layout: Layout, context: ir.Context
) -> list[str]:
    """Encode the parameter held by global `name`; returns one line per use ("contraction
    linalg.batch_matmul", ...). The old global and every load of it are gone afterwards."""
    from myelin.codecs._loadtime import emit_load_time_form, wants_load_time_form
    from myelin.codecs._matvec import emit_grouped, emit_scaled, mark_matvec, matvec_loops
    from myelin.codecs._q4_gpu import emit_kernel_form

    globals_ = module_globals(module)
    old = globals_[name]
    rank = len(layout.logical_shape)
    part_globals = _replace_global(old, scope, key, layout, context)
    loads = symbol_users(module).get(name, [])
    report: list[str] = []
    byte_views: dict[int, tuple[str, ir.Type]] = {}  # part index -> its i8 global (gathers)
    for load in loads:
        for use in list(load.results[0].uses):
            chain = _follow(load.results[0], use.owner, use.operand_number, rank)
            kind = classify(chain)
            report.append(f"{kind.kind} {kind.consumer}")
            anchor = chain.consumer if chain.consumer.parent == load.parent else load
            if anchor is load:
                parts = [_load(g, t, load) for g, t in part_globals]
                # keep them after the original load, which dominates every use
                for v in parts:
                    v.owner.move_after(load)
            else:
                parts = [_load(g, t, chain.consumer) for g, t in part_globals]
            what = f"{scope}::{key}"
            if kind.kind == "gather":
                for i, part in enumerate(layout.parts):
                    if part.element == "i4":
                        if i not in byte_views:
                            byte_views[i] = _byte_view(old, scope, key, part, context)
                        stale = parts[i].owner  # where the part's load was placed
                        parts[i] = _load(*byte_views[i], stale)
                        stale.erase()
                _emit_scalar_decode(chain, layout, parts, context)
            else:
                matvec = None
                if kind.kind == "contraction":
                    matvec = matvec_loops(chain.consumer, chain.operand)
                    if wants_load_time_form(chain, matvec):
                        emit_load_time_form(chain, load.results[0], layout, parts, what, context)
                if kind.kind == "contraction" and _split_of(layout) is not None:
                    # the Hopper kernel's form next to the fused one (myelin.codecs._q4_gpu)
                    emit_kernel_form(chain, layout, parts, what, context)
                    if emit_grouped(chain, layout, parts, what, context):
                        continue
                    if _emit_chunked(chain, layout, parts, what, context):
                        continue
                if kind.kind == "contraction" and emit_scaled(chain, layout, parts, what, context):
                    continue
                placed = _emit_tensor_decode(chain, layout, parts, what, context)
                if kind.kind == "contraction":
                    _wrap_in_dispatch_region([*placed, chain.consumer], context)
                    if matvec is not None:
                        mark_matvec(chain.consumer, *matvec, context)
        load.erase()
    old.erase()
    return report
