"""Chunked K: a q4 contraction whose contracted axis is longer than CHUNK_K, as one decode +
contraction dispatch per chunk of the axis and their sum (the decoded tile of each CPU worker
then fits IREE's 32 KiB stack limit)."""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir
from iree.compiler.dialects import linalg

from myelin.codecs._blocked import blocked_contraction
from myelin.codecs._contract import Layout
from myelin.codecs._emit import (
    decode_ops,
    dynamic_sizes,
    empty_tensor,
    parse_template,
    remap,
    sizes_source,
    template_body,
    zeros,
)
from myelin.codecs._regions import wrap_in_dispatch_region
from myelin.codecs._uses import Chain, dps_inputs, map_dims, opview
from myelin.errors import CompileError

# A q4 contraction decodes its weight into a tile of [K, output tile] floats on the stack of each
# CPU worker (IREE fuses the decode through its reshape only at the output tiling level), and
# IREE's llvm-cpu backend refuses more than 32 KiB of stack. So a contracted axis longer than
# this is split into chunks of at most this many elements, one dispatch each, summed after: 256
# keeps the tile at 32 KiB for output tiles of up to 32 floats (AVX-512 batch matmuls). A
# matvec (one activation row) takes q4's grouped form instead: no such tile (codecs._matvec).
CHUNK_K = 256
# The chunks' sum reads every chunk's result, and IREE passes each as an offset into one buffer:
# a pair of push constants per input. IREE 3.13's CUDA HAL refuses an executable of more than 64
# ("constant_count 90 exceeds maximum of 64" when a 7B model's 11008-long axis, 43 chunks, was
# summed in one dispatch), so at most this many are summed at once, each partial sum a dispatch of
# its own (IREE would fuse elementwise sums back into one), then the partial sums.
SUM_FAN_IN = 16


def _chunks(layout: Layout) -> list[tuple[int, int]]:
    """(first group, group count) of each chunk of the contracted axis; one chunk if short."""
    assert layout.split is not None
    axis, group = layout.split
    groups = layout.logical_shape[axis] // group
    per = max(1, CHUNK_K // group)
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
    dyn = dynamic_sizes(value, before, context)
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
    template = parse_template(context, text)  # owns the ops until they are moved
    block, ops = template_body(template)
    init = empty_tensor(t, inputs[0], before, context)
    ops[0].move_before(before)
    remap([ops[0]], [*zip(block.arguments, [*inputs, init], strict=True)])
    return ops[0].results[0]


def emit_chunked(
    chain: Chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> bool:
    """A contraction whose contracted axis is longer than CHUNK_K, as one decode + contraction
    dispatch per chunk of the axis (the first accumulating into the consumer's init, the others
    into zeros) and their sum. False (nothing changed) if the consumer's other input or its
    init is not one this can slice."""
    assert layout.split is not None
    consumer = chain.consumer
    if len(_chunks(layout)) < 2:
        return False
    axis, group = layout.split
    n_inputs = dps_inputs(consumer)
    if n_inputs != 2 or len(consumer.results) != 1:
        return False
    try:
        maps = [ir.AffineMapAttr(m).value for m in linalg.get_indexing_maps(opview(consumer))]
    except (TypeError, ValueError, RuntimeError):
        return False
    weight_dims = map_dims(maps[chain.operand])
    other = 1 - chain.operand
    other_dims = map_dims(maps[other])
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
    sized = sizes_source(chain)
    # the dim of each part that runs over groups (q4: "d<axis> floordiv g"), None if none
    group_dims = [
        next((i for i, e in enumerate(p.index) if e == f"d{axis} floordiv {group}"), None)
        for p in layout.parts
    ]
    # blocks of outputs decoded in place (through `floordiv` / `mod`) unless the chunk's
    # contraction can read them as blocks
    plain = replace(layout, blocked=None)
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
        placed = decode_ops(
            plain, chunk_parts, chunk_target, chain.src, sized, consumer, what, context
        )
        piece = _slice(activation, k_dim, first * group, count * group, consumer, context)
        start = init if c == 0 else zeros(init, consumer, context)
        clone = consumer.clone(ip=ir.InsertionPoint(consumer))
        clone.operands[chain.operand] = placed[-1].results[0]
        clone.operands[other] = piece
        clone.operands[len(clone.operands) - 1] = start
        if layout.blocked is not None:
            # the chunk's contraction over the blocks, with its own decode (myelin.codecs._blocked)
            chunk = Chain(placed[-1].results[0], clone, chain.operand, chain.src, [])
            result = blocked_contraction(chunk, layout, chunk_parts, what, context)
            if result is not None:
                for op in reversed(placed):
                    op.erase()
                results.append(result)
                continue
        wrap_in_dispatch_region([*placed, clone], context)
        results.append(clone.parent.operation.results[0])
    total = _sum(results, element, consumer, context)
    consumer.results[0].replace_all_uses_with(total)
    consumer.erase()
    for op in reversed(chain.ops):
        op.erase()
    return True


def _sum(
    values: list[ir.Value], element: str, before: ir.Operation, context: ir.Context
) -> ir.Value:
    """values[0] + values[1] + ..., at most SUM_FAN_IN in one dispatch."""
    while len(values) > SUM_FAN_IN:
        partial = []
        for start in range(0, len(values), SUM_FAN_IN):
            group = values[start : start + SUM_FAN_IN]
            if len(group) == 1:
                partial.append(group[0])
                continue
            total = _elementwise(group, _sum_body(len(group), element), before, context)
            wrap_in_dispatch_region([total.owner], context)
            partial.append(total.owner.parent.operation.results[0])
        values = partial
    return _elementwise(values, _sum_body(len(values), element), before, context)


def _sum_body(n: int, element: str) -> list[str]:
    """Lines adding %v0 ... %v<n-1> into %r."""
    add = "arith.addf" if element.startswith(("f", "bf")) else "arith.addi"
    lines, previous = [], "%v0"
    for i in range(1, n):
        name = "%r" if i == n - 1 else f"%s{i}"
        lines.append(f"{name} = {add} {previous}, %v{i} : {element}")
        previous = name
    return lines
