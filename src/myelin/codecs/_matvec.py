"""Encoded matrix-vector products (one activation row: a decode step) on CPU.

Two things IREE 3.13's default llvm-cpu codegen does not do for a decode + matvec, measured on
a Llama decode step (docs/codecs.md, "Matrix-vector products"):

- its default tiles for a 1-row matmul (8 outputs x 8 contracted elements per step) leave an
  8-bit or 16-bit decode compute-bound: with 32 outputs per vector step and the contracted
  axis unrolled by 1, int8's matvec runs 1.3-2.2x faster. The codec marks the contraction with
  those tiles (`CPU_TILES_ATTRIBUTE`); the compile step turns the mark into IREE's
  `compilation_info` for llvm-cpu variants and drops it for every other target
  (`apply_cpu_tiles`), since one encoded graph serves every variant.
- q4's decode is `q * scale + offset` per group, and decoding every weight to f32 before the
  dot product costs two more instructions per weight than int8's. A grouped matvec instead
  computes, per group g, the partial dot product `P[g, n] = sum_e x[g, e] * q[g, e, n]` (the
  4-bit codes as floats: unpack + convert + one FMA per weight) and folds the group's
  factors in once per group: `out[n] = sum_g P[g, n] * scale[g, n] + xs[g] * offset[g, n]`,
  with `xs[g] = sum_e x[g, e]`. The same value up to rounding, with no per-weight scale and
  no `[K, outputs]` tile of decoded floats (so no chunking of the contracted axis either).
  `emit_grouped` builds it, all in one dispatch region.
- int8's decode is `q * scale[n]`; its matvec likewise takes the dot product of the codes as
  floats and multiplies each output by its scale once (`emit_scaled`): one instruction less
  per 8 weights (13% faster on a 32000x512 weight, no change on 1408x512).
"""

from __future__ import annotations

import math
from dataclasses import replace

from iree.compiler import ir

from myelin.codecs import _cpu_kernels as cpu_kernels
from myelin.codecs._contract import Layout
from myelin.codecs._emit import (
    DECODE_ATTRIBUTE,
    decode_ops,
    parse_template,
    remap,
    split_of,
    template_body,
    zeros,
)
from myelin.codecs._regions import wrap_in_dispatch_region
from myelin.codecs._uses import dps_inputs, indexing_maps, map_dims, reduction_loops
from myelin.compiler.placement import find_ops

# A discardable attribute on a contraction: the llvm-cpu lowering config PLeX wants for it.
CPU_TILES_ATTRIBUTE = "plex.cpu_tiles"
# The matvec tiles: outputs per workgroup, outputs per vector step (4 AVX2 / 2 AVX-512
# registers), contracted elements per step. Measured on 32000x512, 1408x512, 512x1408 and
# 512x512 weights (2-vCPU znver3): int8 1.3-2.2x faster than IREE's default [8, 8] tiles, q4's
# grouped matvec 1.4x; 16 outputs per step with 128 per workgroup was within 15% of these.
MATVEC_DISTRIBUTION = 64
MATVEC_VECTOR = 32


def matvec_tiles(outputs: int) -> tuple[int, int] | None:
    """(outputs per workgroup, per vector step) for a matvec with this many outputs: the
    largest tiles up to the ones above that divide it, since a partial tile reads the weight
    through masked vector loads, which IREE cannot emulate for 4-bit data ("failed to emulate
    bit width"); None below 8 outputs or for a count that is no multiple of 8."""
    for distribution in (MATVEC_DISTRIBUTION, 32, 16, 8):
        if outputs % distribution == 0:
            return distribution, min(MATVEC_VECTOR, distribution)
    return None


_PIPELINE = "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>"


def _static(value: ir.Value) -> list[int] | None:
    t = ir.RankedTensorType(value.type)
    if not t.has_static_shape:
        return None
    return [t.get_dim_size(d) for d in range(t.rank)]


def matvec_loops(consumer: ir.Operation, weight_operand: int) -> tuple[int, int] | None:
    """(output loop, contracted loop) of a contraction that reads one activation row (every
    size static, the activation's non-contracted sizes all 1, f32 result) with a rank-2 weight
    behind `weight_operand`; None for anything else (IREE's own tiles then)."""

    if dps_inputs(consumer) != 2 or len(consumer.results) != 1 or weight_operand > 1:
        return None
    maps = indexing_maps(consumer)
    if maps is None:
        return None
    dims = [map_dims(m) for m in maps]
    if any(d is None for d in dims):
        return None
    weight, activation, out = dims[weight_operand], dims[1 - weight_operand], dims[2]
    reductions = reduction_loops(consumer)
    if reductions is None or len(reductions) != 1:
        return None
    (k,) = reductions
    a_shape = _static(consumer.operands[1 - weight_operand])
    w_shape = _static(consumer.operands[weight_operand])
    if a_shape is None or w_shape is None or k not in activation or k not in weight:
        return None
    if math.prod(s for d, s in zip(activation, a_shape, strict=True) if d != k) != 1:
        return None
    if str(ir.RankedTensorType(consumer.results[0].type).element_type) != "f32":
        return None
    wide = [(d, s) for d, s in zip(weight, w_shape, strict=True) if d != k and s > 1]
    if len(wide) != 1 or wide[0][0] not in out:  # one output axis (broadcast batch dims are 1)
        return None
    if matvec_tiles(wide[0][1]) is None:
        return None
    return wide[0][0], k


def _out_dim(out_map: ir.AffineMap, loop: int) -> int:

    dims = map_dims(out_map)
    assert dims is not None
    return dims.index(loop)


def mark_matvec(op: ir.Operation, n_loop: int, k_loop: int, context: ir.Context) -> None:
    """Give `op` (all loops parallel but `k_loop`) the matvec tiles as CPU_TILES_ATTRIBUTE."""
    maps = indexing_maps(op)
    assert maps is not None
    loops = maps[0].n_dims
    outputs = ir.RankedTensorType(op.results[0].type).get_dim_size(
        _out_dim(maps[len(maps) - 1], n_loop)
    )
    tiles = matvec_tiles(outputs)
    assert tiles is not None  # matvec_loops checked it
    distribution = [tiles[0] if d == n_loop else 0 for d in range(loops)]
    vector = [tiles[1] if d == n_loop else 0 if d == k_loop else 1 for d in range(loops)]
    reduction = [1 if d == k_loop else 0 for d in range(loops)]
    set_cpu_tiles(op, distribution, vector, reduction, context)


def set_cpu_tiles(
    op: ir.Operation,
    distribution: list[int],
    vector: list[int],
    reduction: list[int],
    context: ir.Context,
) -> None:
    """Mark `op` with the llvm-cpu tiles PLeX wants for it, per loop (`CPU_TILES_ATTRIBUTE`,
    which the compile step turns into IREE's lowering config)."""
    text = (
        f"#iree_cpu.lowering_config<distribution = {distribution}, "
        f"vector_common_parallel = {vector}, vector_reduction = {reduction}>"
    )
    op.attributes[CPU_TILES_ATTRIBUTE] = ir.StringAttr.get(text, context)


def mark_cpu_matvec(op: ir.Operation, form: str, layout: Layout, context: ir.Context) -> None:
    """Mark `op`, the op yielding a matvec's dispatch region result, as a matvec of codec form
    `form` the compile step may give to a CPU kernel (myelin.codecs._cpu_kernels), if its
    weight is stored K-major (rank 2, the contracted axis first): the only order they read."""
    order = layout.order or tuple(range(len(layout.logical_shape)))
    if len(order) == 2 and order[0] in layout.reduce_axes:
        op.attributes[cpu_kernels.MARK] = ir.StringAttr.get(form, context)


def apply_cpu_tiles(module: ir.Operation, cpu: bool) -> int:
    """Turn every CPU_TILES_ATTRIBUTE into IREE's `compilation_info` if the module compiles for
    llvm-cpu only (`cpu`), else drop it; returns how many ops took a config."""
    marked = find_ops(module, lambda op: CPU_TILES_ATTRIBUTE in op.attributes)
    for op in marked:
        text = ir.StringAttr(op.attributes[CPU_TILES_ATTRIBUTE]).value
        del op.attributes[CPU_TILES_ATTRIBUTE]
        if cpu:
            op.attributes["compilation_info"] = ir.Attribute.parse(
                f"#iree_codegen.compilation_info<lowering_config = {text}, "
                f"translation_info = {_PIPELINE}>"
            )
    return len(marked) if cpu else 0


def _map(loops: int, results: list[str]) -> str:
    dims = ", ".join(f"d{i}" for i in range(loops))
    return f"affine_map<({dims}) -> ({', '.join(results)})>"


def _iterators(loops: int, reduction: int) -> str:
    return ", ".join('"reduction"' if i == reduction else '"parallel"' for i in range(loops))


def _f32(shape: list[int]) -> str:
    return f"tensor<{'x'.join(map(str, shape))}xf32>"


def _generic(maps: list[str], iterators: str, ins: list[tuple[str, str]], out: tuple) -> str:
    """The head of a linalg.generic: `ins` and `out` are (value, type) pairs."""
    names = ", ".join(v for v, _ in ins)
    types = ", ".join(t for _, t in ins)
    return (
        f"linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{iterators}]}}"
        f" ins({names} : {types}) outs({out[0]} : {out[1]})"
    )


def emit_grouped(chain, layout: Layout, parts: list[ir.Value], what: str, context) -> bool:
    """Replace a q4 matvec (`chain.consumer`, see matvec_loops) by the grouped matvec (module
    docstring). False (nothing changed) if the consumer is not one.

    Over a blocked weight (`Layout.blocked`, [N / B][K][B]) the output loop runs as two,
    (block, element in block), like myelin.codecs._blocked's contraction: the init expanded to
    [..., N / B, B] inside the dispatch region, the result collapsed after it, so every part
    is read through plain loop dims."""

    if layout.grouped is None or split_of(layout) is None:
        return False
    consumer = chain.consumer
    loops_nk = matvec_loops(consumer, chain.operand)
    if loops_nk is None or consumer.name not in ("linalg.matmul", "linalg.batch_matmul"):
        return False
    n_loop, k = loops_nk
    axis, group = layout.split
    maps = indexing_maps(consumer)
    assert maps is not None
    w_dims, a_dims, o_dims = (map_dims(maps[i]) for i in (chain.operand, 1 - chain.operand, 2))
    activation, init = consumer.operands[1 - chain.operand], consumer.operands[2]
    if str(ir.RankedTensorType(activation.type).element_type) != "f32":
        return False  # the sums below are f32 throughout (an f16 model takes the chunked form)
    a_shape, o_shape = _static(activation), _static(init)
    last = len(o_shape) - 1
    block = layout.blocked[1] if layout.blocked is not None else None
    if block is not None and o_dims[last] != n_loop:
        return False  # the blocks expand the result's last dim, its outputs
    target = ir.RankedTensorType(chain.value.type)
    at = chain.src[axis]  # the weight operand's contracted dim
    at_n = chain.src[1 - axis]  # its outputs'
    kd = a_dims.index(k)  # the activation's
    groups = target.get_dim_size(at) // group
    # the sum's loops: the consumer's (k standing for the group), with the element in the block
    # right after n where blocked; P's add e, the element in the group, last
    wide = 1 if block is not None else 0

    def moved(d: int) -> int:
        return d if d <= n_loop else d + wide

    b = n_loop + 1  # the element in the block (blocked only)
    kk = moved(k)  # the contracted loop, here the group's
    loops = maps[0].n_dims + wide
    e = loops

    # 1. the 4-bit codes as floats, over the weight operand's dims with K as (group, element)
    #    (and N as (block, element) where blocked)
    codes = replace(layout, parts=layout.parts[:1], decode=layout.grouped[0])
    unpack, collapse = decode_ops(
        codes, parts[:1], target, chain.src, chain.value, consumer, what, context
    )
    collapse.erase()
    codes_value = unpack.results[0]

    def split(dims: list[int], at_k: int, at_out: int | None = None) -> list[str]:
        out: list[str] = []
        for j, loop in enumerate(dims):
            if j == at_k:
                out += [f"d{kk}", f"d{e}"]
            elif j == at_out and block is not None:
                out += [f"d{n_loop}", f"d{b}"]
            else:
                out.append(f"d{moved(loop)}")
        return out

    a_split = [*a_shape[:kd], groups, group, *a_shape[kd + 1 :]]
    xs_shape = [*a_shape[:kd], groups, *a_shape[kd + 1 :]]
    out_shape = o_shape if block is None else [*o_shape[:last], o_shape[last] // block, block]
    out_index = [f"d{moved(x)}" for x in o_dims[:last]]
    out_index += [f"d{o_dims[last]}"] if block is None else [f"d{n_loop}", f"d{b}"]
    p_shape = [*o_shape[:last], groups, *out_shape[last:]]
    p_index = [*out_index[:last], f"d{kk}", *out_index[last:]]
    reassoc = [[i] for i in range(kd)] + [[kd, kd + 1]]
    reassoc += [[i + 1] for i in range(kd + 1, len(a_shape))]
    a_t, xs_t, p_t = _f32(a_split), _f32(xs_shape), _f32(p_shape)
    codes_t, init_t, out_t = str(codes_value.type), str(init.type), _f32(out_shape)
    # the group factors' parts, read per (group, output): logical dims -> the sum's loops
    loop_of = {f"d{i}": f"d{moved(w_dims[s])}" for i, s in enumerate(chain.src)}
    loop_of[f"d{axis} floordiv {group}"] = f"d{kk}"
    if block is not None:
        loop_of[f"d{1 - axis} floordiv {block}"] = f"d{n_loop}"
        loop_of[f"d{1 - axis} mod {block}"] = f"d{b}"
    factors = [(f"%f{i}", str(v.type)) for i, v in enumerate(parts[1:])]
    factor_maps = [_map(loops, [loop_of[x] for x in p.index]) for p in layout.parts[1:]]
    factor_args = ", ".join(f"{v}: {t}" for v, t in factors)
    factor_block = ", ".join(f"%p{i + 1}: {p.element}" for i, p in enumerate(layout.parts[1:]))
    group_lines = "\n".join(f"      {line}" for line in layout.grouped[1])
    xs_rank = len(a_split)
    xs_loops = [f"d{i}" for i in range(xs_rank)]
    xs_head = _generic(
        [
            _map(xs_rank, xs_loops),
            _map(xs_rank, [d for i, d in enumerate(xs_loops) if i != kd + 1]),
        ],
        _iterators(xs_rank, kd + 1),
        [("%xe", a_t)],
        ("%xs_init", xs_t),
    )
    p_head = _generic(
        [
            _map(loops + 1, split(a_dims, kd)),
            _map(loops + 1, split(w_dims, at, at_n)),
            _map(loops + 1, p_index),
        ],
        _iterators(loops + 1, e),
        [("%xe", a_t), ("%codes", codes_t)],
        ("%p_init", p_t),
    )
    expand = collapse_back = ""
    out_name, result = "%init", "%out"
    if block is not None:
        expanded = [[i] for i in range(last)] + [[last, last + 1]]
        expand = (
            f"  %ie = tensor.expand_shape %init {expanded} output_shape {out_shape}"
            f" : {init_t} into {out_t}\n"
        )
        collapse_back = f"  %flat = tensor.collapse_shape %out {expanded} : {out_t} into {init_t}\n"
        out_name, result = "%ie", "%flat"
    sum_head = _generic(
        [
            _map(loops, p_index),
            _map(loops, [f"d{moved(x)}" for x in a_dims]),
            *factor_maps,
            _map(loops, out_index),
        ],
        _iterators(loops, kk),
        [("%p", p_t), ("%xs", xs_t), *factors],
        (out_name, out_t),
    )
    text = f"""
func.func private @grouped(%x: {activation.type}, %codes: {codes_t}, {factor_args},
                           %init: {init_t}) -> {init_t} {{
  %zero = arith.constant 0.0 : f32
  %xe = tensor.expand_shape %x {reassoc} output_shape {a_split}
      : {activation.type} into {a_t}
  %xs_empty = tensor.empty() : {xs_t}
  %xs_init = linalg.fill ins(%zero : f32) outs(%xs_empty : {xs_t}) -> {xs_t}
  %xs = {xs_head} {{
    ^bb0(%a: f32, %acc: f32):
      %s = arith.addf %acc, %a : f32
      linalg.yield %s : f32
  }} -> {xs_t}
  %p_empty = tensor.empty() : {p_t}
  %p_init = linalg.fill ins(%zero : f32) outs(%p_empty : {p_t}) -> {p_t}
  %p = {p_head} {{
    ^bb0(%a: f32, %q: f32, %acc: f32):
      %m = arith.mulf %a, %q : f32
      %s = arith.addf %acc, %m : f32
      linalg.yield %s : f32
  }} -> {p_t}
{expand}  %out = {sum_head} {{
    ^bb0(%part: f32, %xsum: f32, {factor_block}, %acc: f32):
{group_lines}
      %t1 = arith.mulf %part, %s : f32
      %t2 = arith.mulf %xsum, %b : f32
      %t3 = arith.addf %t1, %t2 : f32
      %t4 = arith.addf %acc, %t3 : f32
      linalg.yield %t4 : f32
  }} -> {out_t}
{collapse_back}  return {result} : {init_t}
}}"""
    template = parse_template(context, text)  # owns the ops until they are moved
    template_block, ops = template_body(template)
    body = ops[:-1]  # without the return
    for op in body:
        op.move_before(consumer)
    remap(
        body,
        [*zip(template_block.arguments, [activation, codes_value, *parts[1:], init], strict=True)],
    )
    result_op = body[-1]
    total = body[-2] if block is not None else result_op
    total.attributes[DECODE_ATTRIBUTE] = ir.StringAttr.get(what, context)
    if block is None:
        mark_matvec(total, n_loop, kk, context)
    else:
        tiles = matvec_tiles(block)
        assert tiles is not None  # every q4 block is a multiple of 64
        mark_blocked_matvec(total, n_loop, b, kk, tiles, loops, context)
    mark_cpu_matvec(total, "q4", layout, context)
    consumer.results[0].replace_all_uses_with(result_op.results[0])
    # all but the constant, the activation's reshape (and the result's): one dispatch (xs in
    # it is recomputed per workgroup, K additions, cheaper than a dispatch of its own)
    in_region = body[5:] if block is None else body[5:-1]
    wrap_in_dispatch_region([*body[2:5], unpack, *in_region], context)
    consumer.erase()
    for op in reversed(chain.ops):
        op.erase()
    return True


def mark_blocked_matvec(
    op: ir.Operation,
    n: int,
    e: int,
    k: int,
    tiles: tuple[int, int],
    loops: int,
    context: ir.Context,
) -> None:
    """The matvec tiles (`mark_matvec`) on a contraction over stored blocks of outputs (loop n
    the block, e the output in it): one block at a time, the tiles along the outputs within it."""
    distribution = [tiles[0] if d == e else 1 if d == n else 0 for d in range(loops)]
    vector = [tiles[1] if d == e else 0 if d == k else 1 for d in range(loops)]
    reduction = [1 if d == k else 0 for d in range(loops)]
    set_cpu_tiles(op, distribution, vector, reduction, context)


def emit_scaled(chain, layout: Layout, parts: list[ir.Value], what: str, context) -> bool:
    """Replace an int8 matvec (`chain.consumer`, see matvec_loops) by the dot product of the
    codes as floats, then one multiply by the output's scale (and the add of the consumer's
    init), in one dispatch: the per-weight multiply by the scale goes. False (nothing
    changed) if the consumer is not one."""

    if layout.scaled is None or layout.blocked is not None:
        return False  # blocked codes: myelin.codecs._blocked's scaled form
    consumer = chain.consumer
    loops_nk = matvec_loops(consumer, chain.operand)
    if loops_nk is None or consumer.name not in ("linalg.matmul", "linalg.batch_matmul"):
        return False
    n_loop, k = loops_nk
    maps = indexing_maps(consumer)
    assert maps is not None
    w_dims, o_dims = map_dims(maps[chain.operand]), map_dims(maps[2])
    init = consumer.operands[2]
    target = ir.RankedTensorType(chain.value.type)
    codes = replace(layout, parts=layout.parts[:1], decode=layout.scaled)
    (unpack,) = decode_ops(
        codes, parts[:1], target, chain.src, chain.value, consumer, what, context
    )
    consumer.operands[chain.operand] = unpack.results[0]
    zeroed = zeros(init, consumer, context)
    consumer.operands[2] = zeroed
    # the scale, read per output: its logical dims -> the dims of the consumer's result
    scale_index = [f"d{o_dims.index(w_dims[chain.src[int(x[1:])]])}" for x in layout.parts[1].index]
    rank = len(o_dims)
    identity = _map(rank, [f"d{i}" for i in range(rank)])
    result_t, scale_t = str(init.type), str(parts[1].type)
    head = _generic(
        [identity, _map(rank, scale_index), identity, identity],
        ", ".join(['"parallel"'] * rank),
        [("%p", result_t), ("%s", scale_t), ("%init", result_t)],
        ("%e", result_t),
    )
    text = f"""
func.func private @scaled(%p: {result_t}, %s: {scale_t}, %init: {result_t}) -> {result_t} {{
  %e = tensor.empty() : {result_t}
  %out = {head} {{
    ^bb0(%dot: f32, %scale: f32, %acc: f32, %o: f32):
      %m = arith.mulf %dot, %scale : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  }} -> {result_t}
  return %out : {result_t}
}}"""
    template = parse_template(context, text)  # owns the ops until they are moved
    block, ops = template_body(template)
    empty, scale = ops[0], ops[1]
    empty.move_before(consumer)
    scale.move_after(consumer)
    consumer.results[0].replace_all_uses_with(scale.results[0])
    remap([scale], [*zip(block.arguments, [consumer.results[0], parts[1], init], strict=True)])
    scale.attributes[DECODE_ATTRIBUTE] = ir.StringAttr.get(what, context)
    mark_matvec(consumer, n_loop, k, context)
    mark_cpu_matvec(scale, "int8", layout, context)
    fill = zeroed.owner
    wrap_in_dispatch_region([unpack, fill.operands[1].owner, fill, consumer, scale], context)
    for op in reversed(chain.ops):
        op.erase()
    return True
