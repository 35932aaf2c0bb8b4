"""Attention on a backend: one fused call where the backend implements `attention`, else
two batch matmuls on it and a codegen softmax.

Where a graph's attentions are placed on a backend that implements the op (`"<graph>:attention"
= "<device>"`), each covered attention becomes one dispatch whose workgroups call the backend's
`attention` on their heads (myelin.compiler.backend_ops builds it from `executable_text`): the
scores of one head never leave the core's cache, and no codegen dispatch runs in between.
Measured on MiniLM (batch 32, `plex profile`, 2 threads): the decomposition's softmax
dispatches took ~45% of the codegen time of a call. What follows is the decomposition.


IREE 3.13 lowers its fused attention op on the CPU to one online-softmax loop nest; on MiniLM
with dynamic shapes it took ~63% of a call (`plex profile`, batch 1, seq 128), more than the
36 projections together. Where a graph's matmuls are placed on a backend, each attention whose
shape the decomposition covers (f32 Q, K, V of rank 3 with IREE's standard indexing maps, an i1
or f32 mask or none) is replaced by a call of a private function computing

    S = Q @ K^T (batch matmul, K transposed in the call)              -> the backend
    P = softmax(S * scale, masked: i1 false -> lowest f32, f32 added)  -> IREE codegen
    O = P @ V (batch matmul)                                           -> the backend

The two batch matmuls are then taken by the matmul rewrite like any other (myelin.compiler
.backend_ops), so each head's products run in the vendor library, split over the heads across
the device's workers. The score matrix [batch*heads, L, S] is materialized (the fused op keeps
it in tiles): for MiniLM at batch 32, seq 128, 25 MiB per layer, transient.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.workgroup_split import workgroup_share

ATTENTION = "iree_linalg_ext.attention"

# d0 batch, d1 L (queries), d2 Ev, d3 E, d4 S (keys): Q, K, V, scale, [mask], out
_MAPS = (
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>",
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>",
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>",
    "affine_map<(d0, d1, d2, d3, d4) -> ()>",
)
_MASK_MAP = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>"
_OUT_MAP = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>"

_DYN = "tensor<?x?x?xf32>"
_LOWEST = "-3.40282347E+38"  # a masked score: exp() of it is 0, and a fully masked row is no NaN


def why_not(op: ir.Operation) -> str | None:
    """None when `op` (an attention) is covered by the decomposition, else why it is not."""
    maps = [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    ins = list(op.operands)[:-1]
    if len(ins) not in (4, 5) or len(op.results) != 1:
        return "not the Q, K, V, scale[, mask] form"
    expected = [*_MAPS, *([_MASK_MAP] if len(ins) == 5 else []), _OUT_MAP]
    if maps != expected:
        return "indexing maps other than batch x L x S"
    for v in (*ins[:3], op.results[0]):
        t = v.type
        if not isinstance(t, ir.RankedTensorType) or not isinstance(
            ir.RankedTensorType(t).element_type, ir.F32Type
        ):
            return "not f32"
    if not isinstance(ins[3].type, ir.F32Type):
        return "a scale that is not f32"
    if len(ins) == 5:
        element = ir.RankedTensorType(ins[4].type).element_type
        if not isinstance(element, (ir.F32Type, ir.IntegerType)):
            return "a mask that is neither i1 nor f32"
        if isinstance(element, ir.IntegerType) and ir.IntegerType(element).width != 1:
            return "a mask that is neither i1 nor f32"
    region = op.regions[0].blocks[0] if op.regions and op.regions[0].blocks else None
    if region is not None:
        body = list(region.operations)
        if len(body) != 1 or body[0].operation.operands[0] != region.arguments[0]:
            return "a score modification region"
    return None


def _function_text(name: str, op: ir.Operation, ins: list[ir.Value], rows: Rows) -> str:
    q_t, k_t, v_t = (str(v.type) for v in ins[:3])
    out_t = str(op.results[0].type)
    mask_t = str(ins[4].type) if len(ins) == 5 else None
    mask_arg = f", %mask: {mask_t}" if mask_t else ""
    # The softmax as generics: row max and exponentials each recompute the scaled, masked
    # score; then row sums and quotients. Measured on [384, 128, 128] with dynamic shapes (CPU
    # time): linalg.softmax ~1.7x this form plus a dispatch of its own for scale and mask; a
    # row sum fused with the quotient (no materialized exponentials) 10x.
    mask_in = mask_ty = mask_block = mask_cast = mask_map = ""
    score = "%y = arith.mulf %x, %scale : f32"
    if mask_t is not None:
        element = str(ir.RankedTensorType(ins[4].type).element_type)
        mask_dyn = f"tensor<?x?x?x{element}>"
        # the barrier keeps the mask's producer (a broadcast over the heads, in MiniLM) out of
        # the softmax dispatches: fused there, its index arithmetic made them ~15x slower.
        # IREE's compute barrier, not `util.optimization_barrier`: on this dynamic shape Stream
        # makes the host await the latter's operand, which ended a queue submission at every
        # attention (a causal LM's decode step: 24 submissions, one a layer, the workers idle
        # while the host woke between them; MiniLM's call: 9 -> 3). The compute barrier fences
        # the passes up to dispatch formation only and is gone before Stream (docs/llm.md, "One
        # queue submission a step")
        mask_cast = (
            f"%maskc = tensor.cast %mask : {mask_t} to {mask_dyn}\n"
            + "".join(f"  %md{i} = tensor.dim %maskc, %c{i} : {mask_dyn}\n" for i in range(3))
            + f"  %maskd = iree_tensor_ext.compute_barrier.start %maskc : "
            f"{mask_dyn}{{%md0, %md1, %md2}} -> {mask_dyn}"
        )
        mask_in, mask_ty, mask_block = ", %maskd", f", {mask_dyn}", f", %keep: {element}"
        mask_map = ", #all"
        combine = (
            "arith.select %keep, %y0, %lowest : f32"
            if element == "i1"
            else "arith.addf %y0, %keep : f32"
        )
        score = f"%y0 = arith.mulf %x, %scale : f32\n      %y = {combine}"
    return f"""
#all = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
util.func private @{name}(%q0: {q_t}, %k0: {k_t}, %v0: {v_t}, %scale: f32{mask_arg}) -> {out_t} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %lowest = arith.constant {_LOWEST} : f32
  %q = tensor.cast %q0 : {q_t} to {_DYN}
  %k = tensor.cast %k0 : {k_t} to {_DYN}
  %v = tensor.cast %v0 : {v_t} to {_DYN}
  {mask_cast}
  %b = tensor.dim %q, %c0 : {_DYN}
  %l = tensor.dim %q, %c1 : {_DYN}
  %e = tensor.dim %q, %c2 : {_DYN}
  %s = tensor.dim %k, {"%c0" if rows.keys else "%c1"} : {_DYN}
  %ev = tensor.dim %v, %c2 : {_DYN}
  %s0 = tensor.empty(%b, %l, %s) : {_DYN}
  %sz = linalg.fill ins(%zero : f32) outs(%s0 : {_DYN}) -> {_DYN}
  {_scores(rows.keys)}
  %r0 = tensor.empty(%b, %l) : tensor<?x?xf32>
  %mi = linalg.fill ins(%lowest : f32) outs(%r0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %mx = linalg.generic {{indexing_maps = [#all{mask_map}, #row],
      iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%qk{mask_in} : {_DYN}{mask_ty}) outs(%mi : tensor<?x?xf32>) {{
    ^bb0(%x: f32{mask_block}, %o: f32):
      {score}
      %r = arith.maximumf %y, %o : f32
      linalg.yield %r : f32
  }} -> tensor<?x?xf32>
  %ex = linalg.generic {{indexing_maps = [#all{mask_map}, #row, #all],
      iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%qk{mask_in}, %mx : {_DYN}{mask_ty}, tensor<?x?xf32>) outs(%s0 : {_DYN}) {{
    ^bb0(%x: f32{mask_block}, %m: f32, %o: f32):
      {score}
      %d = arith.subf %y, %m : f32
      %r = math.exp %d : f32
      linalg.yield %r : f32
  }} -> {_DYN}
  %si = linalg.fill ins(%zero : f32) outs(%r0 : tensor<?x?xf32>) -> tensor<?x?xf32>
  %sum = linalg.generic {{indexing_maps = [#all, #row],
      iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%ex : {_DYN}) outs(%si : tensor<?x?xf32>) {{
    ^bb0(%x: f32, %o: f32):
      %r = arith.addf %x, %o : f32
      linalg.yield %r : f32
  }} -> tensor<?x?xf32>
  %p = linalg.generic {{indexing_maps = [#all, #row, #all],
      iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%ex, %sum : {_DYN}, tensor<?x?xf32>) outs(%s0 : {_DYN}) {{
    ^bb0(%x: f32, %t: f32, %o: f32):
      %r = arith.divf %x, %t : f32
      linalg.yield %r : f32
  }} -> {_DYN}
  %o0 = tensor.empty(%b, %l, %ev) : {_DYN}
  %oz = linalg.fill ins(%zero : f32) outs(%o0 : {_DYN}) -> {_DYN}
  {_weighted_values(rows.values)}
  %out = tensor.cast %o : {_DYN} to {out_t}
  util.return %out : {out_t}
}}
"""


@dataclass(frozen=True)
class Rows:
    """Which of an attention's keys and values the decomposition reads as cache rows: x [S,
    B*H, E] (a causal LM's held rows, `cache_rows_source`), indexed in that layout by the products,
    instead of [B*H, S, E]."""

    keys: bool = False
    values: bool = False


# The mark of the products a decomposition computes as generics (Rows), for callers that give
# them a strategy (myelin.compiler.cpu_attention).
PRODUCT_MARK = "plex.attention_product"


def _scores(keys_as_rows: bool) -> str:
    """%qk = Q K^T: a batch matmul with K transposed in the call, or over cache rows a generic
    contraction that reads each key in the rows' layout (its map (b, l, s, e) -> (s, b, e))."""
    if not keys_as_rows:
        return f"""%kt0 = tensor.empty(%b, %e, %s) : {_DYN}
  %kt = linalg.transpose ins(%k : {_DYN}) outs(%kt0 : {_DYN}) permutation = [0, 2, 1]
  %qk = linalg.batch_matmul ins(%q, %kt : {_DYN}, {_DYN}) outs(%sz : {_DYN}) -> {_DYN}"""
    return _rows_product("%qk", "%q", "%k", "%sz", "(b, l, s, e)", "(b, l, e)", "(b, l, s)")


def _weighted_values(values_as_rows: bool) -> str:
    """%o = P V: a batch matmul, or over cache rows a generic contraction (as `_scores`)."""
    if not values_as_rows:
        return f"%o = linalg.batch_matmul ins(%p, %v : {_DYN}, {_DYN}) outs(%oz : {_DYN}) -> {_DYN}"
    return _rows_product("%o", "%p", "%v", "%oz", "(b, l, e, s)", "(b, l, s)", "(b, l, e)")


def _rows_product(result: str, lhs: str, rows: str, init: str, loops: str, lhs_dims: str,
                  out_dims: str) -> str:  # fmt: skip
    """`result` = sum over the last loop of `lhs` times `rows` [s, b, e] (cache rows)."""
    return f"""{result} = linalg.generic {{indexing_maps = [
        affine_map<{loops} -> {lhs_dims}>, affine_map<{loops} -> (s, b, e)>,
        affine_map<{loops} -> {out_dims}>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"], {PRODUCT_MARK}}}
      ins({lhs}, {rows} : {_DYN}, {_DYN}) outs({init} : {_DYN}) {{
    ^bb0(%x: f32, %y: f32, %a: f32):
      %m = arith.mulf %x, %y : f32
      %r = arith.addf %a, %m : f32
      linalg.yield %r : f32
  }} -> {_DYN}"""


def decompose_attention(
    module: ir.Operation, op: ir.Operation, name: str, *, cache_rows: bool = False
) -> None:
    """Replace `op` by a call of a new private function `name` (see the module docstring).
    With `cache_rows`, keys and values that are a causal LM's held rows (`cache_rows_source`)
    are read in the rows' own layout."""
    ins = list(op.operands)[:-1]
    rows = Rows()
    if cache_rows:
        keys, values = cache_rows_source(ins[1], op), cache_rows_source(ins[2], op)
        rows = Rows(keys=keys is not None, values=values is not None)
        ins[1] = keys if keys is not None else ins[1]
        ins[2] = values if values is not None else ins[2]
    parsed = ir.Module.parse(_function_text(name, op, ins, rows))
    block = module.regions[0].blocks[0]
    for fn in list(parsed.body.operations):
        fn.operation.detach_from_parent()
        block.append(fn)
    call = ir.Operation.create(
        "util.call",
        results=[op.results[0].type],
        operands=ins,
        attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
        loc=op.location,
    )
    ir.InsertionPoint(op).insert(call)
    op.results[0].replace_all_uses_with(call.results[0])
    op.erase()


# the flags of plex_attention_args_t (abi/plex_backend.h)
MASK_BOOL = 1  # PLEX_ATTENTION_MASK_BOOL
MASK_ADD = 2  # PLEX_ATTENTION_MASK_ADD
HEADS_INTERLEAVED = 4  # PLEX_ATTENTION_HEADS_INTERLEAVED
MASK_PER_BATCH = 8  # PLEX_ATTENTION_MASK_PER_BATCH


def scale_bits(op: ir.Operation) -> int | None:
    """The f32 bits of the attention's scale where it is a constant (the fused call passes it
    as an index operand), else None (then the decomposition takes the op)."""
    scalar = _producer(op.operands[3])
    if scalar is None or scalar.name != "arith.constant":
        return None
    value = ir.FloatAttr(scalar.attributes["value"]).value
    return struct.unpack("<I", struct.pack("<f", value))[0]


def mask_flags(op: ir.Operation) -> int:
    """MASK_BOOL, MASK_ADD or 0 (no mask) for a covered attention."""
    ins = list(op.operands)[:-1]
    if len(ins) < 5:
        return 0
    element = ir.RankedTensorType(ins[4].type).element_type
    return MASK_BOOL if isinstance(element, ir.IntegerType) else MASK_ADD


def _producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _collapsed_heads(value: ir.Value) -> ir.Operation | None:
    """The producer of `value` where it collapses [batch, heads, ...] (rank 4, static heads)
    into [batch * heads, ...], else None."""
    op = _producer(value)
    if op is None or op.name != "tensor.collapse_shape":
        return None
    source = ir.RankedTensorType(op.operands[0].type)
    groups = [[int(ir.IntegerAttr(i).value) for i in ir.ArrayAttr(g)]
              for g in ir.ArrayAttr(op.attributes["reassociation"])]  # fmt: skip
    if source.rank != 4 or groups != [[0, 1], [2], [3]] or source.is_dynamic_dim(1):
        return None
    return op


def heads_source(value: ir.Value) -> tuple[ir.Value, int] | None:
    """(x, heads) where `value` is x [batch, len, heads, e] with its heads moved in front of
    len and collapsed into the batch (how BERT-style models split Q, K, V into heads): the call
    reads x as it is (no transposed copy). Else None."""
    collapse = _collapsed_heads(value)
    x = _transposed_source(collapse, [0, 2, 1, 3])
    if collapse is None or x is None:
        return None
    return x, ir.RankedTensorType(collapse.operands[0].type).shape[1]


def _transposed_source(collapse: ir.Operation | None, permutation: list[int]) -> ir.Value | None:
    """x where `collapse` (from `_collapsed_heads`) collapses a `permutation` transpose of x."""
    if collapse is None:
        return None
    transpose = _producer(collapse.operands[0])
    if transpose is None or transpose.name != "linalg.transpose":
        return None
    if list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"])) != permutation:
        return None
    return transpose.operands[0]


def cache_rows_source(value: ir.Value, before: ir.Operation) -> ir.Value | None:
    """x [S, B, H, E] collapsed to [S, B*H, E] (inserted before `before`) where `value` is x with
    its length moved behind the heads and the heads collapsed into the batch: how a causal LM's
    held keys and values reach attention from its cache rows (myelin.frontends.causal_lm,
    row `slot` holding every sequence's heads). Else None.

    Why: as [B*H, S, E] operands they were a transposing copy of every held row, two a layer
    and step, growing with the tokens held; in the rows' layout, the products index them
    without that copy."""
    x = _transposed_source(_collapsed_heads(value), [1, 2, 0, 3])
    if x is None:
        return None
    shape = ir.RankedTensorType(x.type)
    if shape.is_dynamic_dim(1) or shape.is_dynamic_dim(2) or shape.is_dynamic_dim(3):
        return None
    rows_type = ir.RankedTensorType.get(
        [shape.shape[0], shape.shape[1] * shape.shape[2], shape.shape[3]],
        shape.element_type,
        loc=before.location,
    )
    collapse_rows = ir.Operation.create(
        "tensor.collapse_shape",
        results=[rows_type],
        operands=[x],
        attributes={"reassociation": ir.Attribute.parse("[[0], [1, 2], [3]]")},
        loc=before.location,
    )
    ir.InsertionPoint(before).insert(collapse_rows)
    return collapse_rows.results[0]


def mask_source(value: ir.Value) -> tuple[ir.Value, int] | None:
    """(m, heads) where `value` is m [batch, 1, l, s] broadcast over the heads and collapsed
    into the batch: the call reads each batch's mask for all its heads. Else None."""
    collapse = _collapsed_heads(value)
    if collapse is None:
        return None
    broadcast = _producer(collapse.operands[0])
    if broadcast is None or broadcast.name != "linalg.generic" or len(broadcast.operands) != 2:
        return None
    maps = [str(m) for m in ir.ArrayAttr(broadcast.attributes["indexing_maps"])]
    if maps != [
        "affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>",
        "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>",
    ]:
        return None
    block = broadcast.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 1 or body[0].operation.operands[0] != block.arguments[0]:
        return None
    return broadcast.operands[0], ir.RankedTensorType(collapse.operands[0].type).shape[1]


def executable_text(name: str, symbol: str, flags: int) -> str:
    """A stream.executable whose workgroup w of W calls `symbol` on its share of the heads.

    An i1 mask is read as bytes (IREE stores i1 tensors one byte per element); without a mask,
    Q's pointer stands in for it (the flags say it is not read). The entry is named after the
    executable: IREE links a device's executables into one module, where two entries of one
    name clash."""
    mask = {MASK_BOOL: "i8", MASK_ADD: "f32"}.get(flags & (MASK_BOOL | MASK_ADD))
    mask_memref = f"memref<{mask or 'f32'}>"
    mask_arg = ", %bm: !stream.binding" if mask else ""
    if mask:
        mask_view = f"""
      %m = stream.binding.subspan %bm[%c0] : !stream.binding -> memref<?x{mask}, #dyn>{{%lm}}
      %m0, %mo, %ms, %mst = memref.extract_strided_metadata %m
          : memref<?x{mask}, #dyn> -> {mask_memref}, index, index, index"""
        mask_ptr, mask_off = "%m0", "%mo"
    else:
        mask_view, mask_ptr, mask_off = "", "%q0", "%c0"
    return f"""
#dyn = strided<[1], offset: ?>
stream.executable private @{name} {{
  stream.executable.export public @{name} workgroups(%w: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    stream.return %w, %c1, %c1 : index, index, index
  }}
  builtin.module {{
    func.func private @{symbol}(memref<f32>, index, memref<f32>, index, memref<f32>, index,
        {mask_memref}, index, memref<f32>, index, index, index, index, index, index, index,
        index, index, index) attributes {{llvm.bareptr = true}}
    func.func @{name}(%bq: !stream.binding, %bk: !stream.binding, %bv: !stream.binding{mask_arg},
        %bo: !stream.binding, %units: index, %heads: index, %l: index, %s: index, %e: index,
        %ev: index, %lm: index, %scale: index, %flags: index) {{
      %c0 = arith.constant 0 : index
      %ul = arith.muli %units, %l : index
      %us = arith.muli %units, %s : index
      %lq = arith.muli %ul, %e : index
      %lk = arith.muli %us, %e : index
      %lv = arith.muli %us, %ev : index
      %lo = arith.muli %ul, %ev : index
      %q = stream.binding.subspan %bq[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lq}}
      %k = stream.binding.subspan %bk[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lk}}
      %v = stream.binding.subspan %bv[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lv}}
      %o = stream.binding.subspan %bo[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lo}}
      %q0, %qo, %qs, %qst = memref.extract_strided_metadata %q
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %k0, %ko, %ks, %kst = memref.extract_strided_metadata %k
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %v0, %vo, %vs, %vst = memref.extract_strided_metadata %v
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %o0, %oo, %os, %ost = memref.extract_strided_metadata %o
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index{mask_view}
      {workgroup_share("%units")}
      %fl = arith.muli %first, %l : index
      %skip_o = arith.muli %fl, %ev : index
      %oo2 = arith.addi %oo, %skip_o : index
      func.call @{symbol}(%q0, %qo, %k0, %ko, %v0, %vo, {mask_ptr}, {mask_off}, %o0, %oo2,
          %first, %count, %heads, %l, %s, %e, %ev, %scale, %flags)
          : (memref<f32>, index, memref<f32>, index, memref<f32>, index, {mask_memref}, index,
             memref<f32>, index, index, index, index, index, index, index, index, index, index)
          -> ()
      return
    }}
  }}
}}
"""
