"""Blocked weights in a contraction: the contraction over the stored blocks.

fp16, int8 and q4 store a K-major weight in blocks of outputs, [N / B][K][B] (`Layout.blocked`),
so that the CPU matvec kernel's walk of one block is one contiguous stream. Decoding the blocks
and collapsing (N / B, B) back into N before the consumer leaves a reshape between the decode
and the contraction that IREE 3.13 cannot tile through: the decode is then vectorized whole
("operations with large vector sizes"). So the consumer itself is rebuilt over the blocks: its
output loop as two, (block, element in block), the init expanded the same way and the result
collapsed after the dispatch region; every operand is then read through plain loop dims.

int8's matvec contracts its codes as floats and scales each output once after the dot product
(myelin.codecs._matvec.emit_scaled); over the blocks that scaling is one more op on the
expanded result, reading the scale as stored, [N / B][B].
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir

from myelin.codecs._contract import Layout
from myelin.codecs._emit import DECODE_ATTRIBUTE, decode_ops, parse_template, remap, template_body
from myelin.codecs._matvec import (
    mark_blocked_matvec,
    mark_cpu_matvec,
    matvec_loops,
    matvec_tiles,
)
from myelin.codecs._regions import wrap_in_dispatch_region
from myelin.codecs._uses import indexing_maps, map_dims, reduction_loops

_CONSUMERS = ("linalg.matmul", "linalg.batch_matmul")
_INPUTS = ("f32", "f16", "bf16")  # the element types a contraction over the blocks reads


def _expanded(shape: list[int], at: int, block: int) -> tuple[list[int], list[list[int]]]:
    """`shape` with dim `at` as (blocks, block), and the reassociation back."""
    out = [*shape[:at], shape[at] // block, block, *shape[at + 1 :]]
    groups = [[i] for i in range(at)] + [[at, at + 1]]
    groups += [[i + 1] for i in range(at + 1, len(shape))]
    return out, groups


def _type(shape: list[int], element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def _map(loops: int, names: list[str]) -> str:
    return f"affine_map<({', '.join(f'd{i}' for i in range(loops))}) -> ({', '.join(names)})>"


def emit_blocked(
    chain, layout: Layout, parts: list[ir.Value], what: str, context, *, scaled: bool = False
) -> bool:
    """Replace `chain.consumer` (a matmul reading a blocked weight, an f32 result) by the same
    contraction over the blocks, in its own dispatch region; a matvec's is marked for the CPU
    kernel and given the matvec tiles. `scaled` (int8's matvec, `Layout.scaled`): the codes
    contracted as floats, then each output times its scale. False (nothing changed) for any
    other consumer."""
    return blocked_contraction(chain, layout, parts, what, context, scaled=scaled) is not None


def blocked_contraction(
    chain, layout: Layout, parts: list[ir.Value], what: str, context, *, scaled: bool = False
) -> ir.Value | None:
    """`emit_blocked`'s work; returns the value that replaced the consumer's result (the
    collapse of the blocks, after the dispatch region), None if nothing changed."""
    if layout.blocked is None or (scaled and layout.scaled is None):
        return None
    consumer = chain.consumer
    maps = indexing_maps(consumer)
    if consumer.name not in _CONSUMERS or maps is None or len(consumer.operands) != 3:
        return None
    dims = [map_dims(m) for m in maps]
    types = [ir.RankedTensorType(v.type) for v in consumer.operands]
    if any(d is None for d in dims) or any(not t.has_static_shape for t in types):
        return None
    elements = [str(t.element_type) for t in types]
    if elements[2] != "f32" or any(e not in _INPUTS for e in elements[:2]):
        return None  # the products are summed in f32 (16-bit inputs extended first)
    if scaled and elements != ["f32"] * 3:
        return None
    reductions = reduction_loops(consumer)
    if reductions is None or len(reductions) != 1:
        return None
    matvec = matvec_loops(consumer, chain.operand)
    if scaled and matvec is None:
        return None  # the scaled form is a matvec's (as emit_scaled's)
    activation_at = 1 - chain.operand
    axis, block = layout.blocked
    n = dims[chain.operand][chain.src[axis]]  # the loop of the weight's outputs
    if n in dims[activation_at] or n not in dims[2]:
        return None  # only the weight and the result carry the outputs (a matmul's do)
    loops = maps[0].n_dims
    e = n + 1  # the new loop, the output's place in its block, right after the block's

    def moved(d: int) -> int:  # the consumer's loops after it: one on
        return d if d <= n else d + 1

    def loop_dims(ds: list[int]) -> str:
        names = [x for d in ds for x in ((f"d{n}", f"d{e}") if d == n else (f"d{moved(d)}",))]
        return _map(loops + 1, names)

    decoded_layout = layout
    if scaled:
        decoded_layout = replace(layout, parts=layout.parts[:1], decode=layout.scaled)
    target = ir.RankedTensorType(chain.value.type)
    decode = decode_ops(
        decoded_layout,
        parts[: len(decoded_layout.parts)],
        target,
        chain.src,
        chain.value,
        consumer,
        what,
        context,
        keep_blocks=True,
    )
    decoded = decode[-1].results[0]

    activation = consumer.operands[activation_at]
    init = consumer.operands[2]
    o_shape = [types[2].get_dim_size(d) for d in range(types[2].rank)]
    o_at = dims[2].index(n)
    oe_shape, groups = _expanded(o_shape, o_at, block)
    o_t, oe_t = str(init.type), _type(oe_shape, "f32")
    ins = [("%x", str(types[activation_at])), ("%w", str(decoded.type))]
    if chain.operand == 0:
        ins.reverse()
    iterators = ", ".join(
        '"reduction"' if i in {moved(r) for r in reductions} else '"parallel"'
        for i in range(loops + 1)
    )
    contract_head = (
        f"linalg.generic {{indexing_maps = [{loop_dims(dims[0])}, {loop_dims(dims[1])}, "
        f"{loop_dims(dims[2])}], iterator_types = [{iterators}]}} "
        f"ins({ins[0][0]}, {ins[1][0]} : {ins[0][1]}, {ins[1][1]})"
    )
    widen = "".join(
        f"\n      {v}f = arith.extf {v} : {e} to f32"
        for v, e in zip(("%a", "%b"), elements[:2], strict=True)
        if e != "f32"
    )
    a, b = (f"{v}f" if e != "f32" else v for v, e in zip(("%a", "%b"), elements[:2], strict=True))
    contract_body = f"""{{
    ^bb0(%a: {elements[0]}, %b: {elements[1]}, %acc: f32):{widen}
      %m = arith.mulf {a}, {b} : f32
      %s = arith.addf %acc, %m : f32
      linalg.yield %s : f32
  }}"""
    rank = len(oe_shape)
    identity = _map(rank, [f"d{i}" for i in range(rank)])
    if scaled:
        scale_t = str(parts[1].type)
        scale_map = _map(rank, [f"d{o_at}", f"d{o_at + 1}"])
        text = f"""
func.func private @blocked(%x: {types[activation_at]}, %w: {decoded.type},
                           %scales: {scale_t}, %init: {o_t}) -> {o_t} {{
  %ie = tensor.expand_shape %init {groups} output_shape {oe_shape} : {o_t} into {oe_t}
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : {oe_t}
  %z = linalg.fill ins(%zero : f32) outs(%e0 : {oe_t}) -> {oe_t}
  %dot = {contract_head} outs(%z : {oe_t}) {contract_body} -> {oe_t}
  %e1 = tensor.empty() : {oe_t}
  %out = linalg.generic {{indexing_maps = [{identity}, {scale_map}, {identity}, {identity}],
      iterator_types = [{", ".join(['"parallel"'] * rank)}]}}
      ins(%dot, %scales, %ie : {oe_t}, {scale_t}, {oe_t}) outs(%e1 : {oe_t}) {{
    ^bb0(%d: f32, %sc: f32, %acc: f32, %o: f32):
      %m = arith.mulf %d, %sc : f32
      %r = arith.addf %acc, %m : f32
      linalg.yield %r : f32
  }} -> {oe_t}
  %flat = tensor.collapse_shape %out {groups} : {oe_t} into {o_t}
  return %flat : {o_t}
}}"""
        arguments = [activation, decoded, parts[1], init]
    else:
        text = f"""
func.func private @blocked(%x: {types[activation_at]}, %w: {decoded.type},
                           %init: {o_t}) -> {o_t} {{
  %ie = tensor.expand_shape %init {groups} output_shape {oe_shape} : {o_t} into {oe_t}
  %out = {contract_head} outs(%ie : {oe_t}) {contract_body} -> {oe_t}
  %flat = tensor.collapse_shape %out {groups} : {oe_t} into {o_t}
  return %flat : {o_t}
}}"""
        arguments = [activation, decoded, init]
    template = parse_template(context, text)  # owns the ops until they are moved
    block_, ops = template_body(template)
    body = ops[:-1]  # without the return
    for op in body:
        op.move_before(consumer)
    remap(body, [*zip(block_.arguments, arguments, strict=True)])
    flat = body[-1]
    last = body[-2]  # the op yielding the region's result
    contraction = body[4] if scaled else body[1]
    last.attributes[DECODE_ATTRIBUTE] = ir.StringAttr.get(what, context)
    consumer.results[0].replace_all_uses_with(flat.results[0])
    consumer.erase()
    for op in reversed(chain.ops):
        op.erase()
    if scaled:  # the constant and the scaling's own init stay outside, as emit_scaled's
        expand, _, empty, fill, _, _, _, _ = body
        in_region = [expand, empty, fill, contraction, last]
    else:
        in_region = [body[0], contraction]
    wrap_in_dispatch_region([*decode, *in_region], context)
    # the matvec tiles and the kernels: f32 matvecs (the tiles' config fails IREE's pipeline
    # on 16-bit inputs); int8's kernel takes its scaled form, q4's its grouped matvec (_matvec)
    tiles = matvec_tiles(block) if matvec is not None and elements == ["f32"] * 3 else None
    if tiles is not None:
        mark_blocked_matvec(contraction, n, e, moved(matvec[1]), tiles, loops + 1, context)
        if scaled or (layout.scaled is None and layout.split is None):
            mark_cpu_matvec(last, "int8" if scaled else "fp16", layout, context)
    return flat.results[0]
