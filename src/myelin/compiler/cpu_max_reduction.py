"""A written-out softmax on llvm-cpu kept as IREE's ordinary reductions, not raised to its
softmax op.

torch-mlir lowers `softmax` (the `softmax(q @ k^T * scale)` of an attention written out,
transformers' `attn_implementation="eager"`) to a row max (which also tracks the index of each
maximum, `aten.max.dim`, though nothing reads it), the differences' exponentials, row sums and
quotients. IREE 3.13's global optimization recognizes that chain and raises it to its own
softmax op, whose CPU code ran Whisper-tiny's eager encoder's [6, 1500, 1500] softmax at 2.3-3.2
s a layer: 88% of the call, 8x torch's whole encoder (`plex profile`, 2026-12-06, data tiling
on). The same chain left as separate reductions and element-wise ops took 0.1-0.2 s a layer, and
the whole call went from 14.5 s to 1.6 s. So each such row max of a variant whose devices are
all llvm-cpu is replaced, at the input phase, by a call of a private function computing the
maxima alone (the unused index dropped) behind an optimization barrier, which the raising
pattern does not see through. PLeX's own attention decomposition (backend_attention) writes its
softmax in a form IREE does not raise either (measured ~1.7x faster than the raised op there).
"""

from __future__ import annotations

from iree.compiler import ir

GENERIC = "linalg.generic"
FUNCTION_PREFIX = "plex_cpu_row_max"


def _covered(op: ir.Operation) -> bool:
    """A generic of one input and two outputs (f32, i64) whose index result nobody reads and
    whose body is the max-with-index pattern."""
    if op.name != GENERIC or len(op.results) != 2 or len(op.operands) != 3:
        return False
    value_t, index_t = (ir.RankedTensorType(r.type) for r in op.results)
    if not (isinstance(value_t.element_type, ir.F32Type) and str(index_t.element_type) == "i64"):
        return False
    if not value_t.has_static_shape or list(op.results[1].uses):
        return False
    body = [o.name for o in op.regions[0].blocks[0].operations]
    return "arith.maximumf" in body and "linalg.index" in body and "arith.select" in body


def _function_text(name: str, op: ir.Operation) -> str:
    x_t, init_t = str(op.operands[0].type), str(op.operands[1].type)
    maps = ir.ArrayAttr(op.attributes["indexing_maps"])
    # `#linalg.iterator_type<parallel>` -> "parallel": the generic's custom syntax takes names
    kinds = [
        str(a).split("<", 1)[1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])
    ]
    iterators = "[" + ", ".join(f'"{k}"' for k in kinds) + "]"
    return f"""
util.func private @{name}(%x: {x_t}, %init: {init_t}) -> {init_t} {{
  %r = linalg.generic {{indexing_maps = [{maps[0]}, {maps[1]}], iterator_types = {iterators}}}
      ins(%x : {x_t}) outs(%init : {init_t}) {{
    ^bb0(%a: f32, %o: f32):
      %m = arith.maximumf %a, %o : f32
      linalg.yield %m : f32
  }} -> {init_t}
  %b = util.optimization_barrier %r : {init_t}
  util.return %b : {init_t}
}}
"""


def rewrite_cpu_max_reductions(module: ir.Operation) -> int:
    """Replace every covered max-with-index reduction of `module`; the number replaced."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == GENERIC and _covered(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    block = module.regions[0].blocks[0]
    names: dict[str, str] = {}  # the reduction's text without its operands -> its function
    for op in found:
        text = _function_text("@", op)
        if text not in names:
            names[text] = f"{FUNCTION_PREFIX}_{len(names)}"
            parsed = ir.Module.parse(_function_text(names[text], op))
            for fn in list(parsed.body.operations):
                fn.operation.detach_from_parent()
                block.append(fn)
        call = ir.Operation.create(
            "util.call",
            results=[op.results[0].type],
            operands=[op.operands[0], op.operands[1]],
            attributes={"callee": ir.FlatSymbolRefAttr.get(names[text])},
            loc=op.location,
        )
        ir.InsertionPoint(op).insert(call)
        op.results[0].replace_all_uses_with(call.results[0])
        op.erase()
    return len(found)
