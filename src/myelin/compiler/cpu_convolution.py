"""1-D convolutions on llvm-cpu as one matmul over gathered columns (im2col).

IREE 3.13 compiles `linalg.conv_1d_ncw_fcw` on llvm-cpu to a direct convolution loop nest that
ran Whisper-tiny's two front-end convolutions (80 -> 384 and 384 -> 384 channels, 3 taps, 3000
frames) at ~2 GFLOP/s: 45% of the encoder's call (`plex profile`, 2026-12-06). Its
`--iree-global-opt-use-im2col-for-convs` takes only 2-D convolutions. Here each static-shaped
1-D convolution of a variant whose devices are all llvm-cpu becomes, at the input phase,

    col[n, c, k, w] = x[n, c, w * stride + k * dilation]      (a gather, C*K x Wo per batch)
    y[n, f, w] += sum over (c, k) of filter[f, (c, k)] * col[n, (c, k), w]   (a contraction)

so the product runs as IREE's matmul (packed for its microkernels under data tiling). The
gathered columns are K times the input: transient, 13.8 MiB for Whisper's second convolution.
"""

from __future__ import annotations

from iree.compiler import ir

CONV_1D = "linalg.conv_1d_ncw_fcw"
FUNCTION_PREFIX = "plex_cpu_conv1d"


def _attribute_value(op: ir.Operation, name: str) -> int:
    attribute = op.attributes[name]
    return int(str(attribute).split("<", 1)[1].split(">", 1)[0])


def _covered(op: ir.Operation) -> bool:
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    return all(t.has_static_shape and isinstance(t.element_type, ir.F32Type) for t in types)


def _function_text(name: str, op: ir.Operation) -> str:
    x_t, f_t, y_t = (ir.RankedTensorType(v.type) for v in op.operands)
    n, c, _ = x_t.shape
    f, _, k = f_t.shape
    wo = y_t.shape[2]
    stride = _attribute_value(op, "strides")
    dilation = _attribute_value(op, "dilations")
    col = f"tensor<{n}x{c}x{k}x{wo}xf32>"
    cols = f"tensor<{n}x{c * k}x{wo}xf32>"
    filters = f"tensor<{f}x{c * k}xf32>"
    return f"""
util.func private @{name}(%x: {x_t}, %f: {f_t}, %y0: {y_t}) -> {y_t} {{
  %e = tensor.empty() : {col}
  %col = linalg.generic {{
      indexing_maps = [affine_map<(n, c, k, w) -> (n, c, w * {stride} + k * {dilation})>,
                       affine_map<(n, c, k, w) -> (n, c, k, w)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : {x_t}) outs(%e : {col}) {{
    ^bb0(%a: f32, %o: f32):
      linalg.yield %a : f32
  }} -> {col}
  %cols = tensor.collapse_shape %col [[0], [1, 2], [3]] : {col} into {cols}
  %filters = tensor.collapse_shape %f [[0], [1, 2]] : {f_t} into {filters}
  %y = linalg.generic {{
      indexing_maps = [affine_map<(n, f, w, r) -> (f, r)>,
                       affine_map<(n, f, w, r) -> (n, r, w)>,
                       affine_map<(n, f, w, r) -> (n, f, w)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
      ins(%filters, %cols : {filters}, {cols}) outs(%y0 : {y_t}) {{
    ^bb0(%a: f32, %b: f32, %o: f32):
      %p = arith.mulf %a, %b : f32
      %s = arith.addf %o, %p : f32
      linalg.yield %s : f32
  }} -> {y_t}
  util.return %y : {y_t}
}}
"""


def rewrite_cpu_convolutions(module: ir.Operation) -> int:
    """Rewrite every covered 1-D convolution of `module`; the number rewritten."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == CONV_1D and _covered(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    block = module.regions[0].blocks[0]
    for index, op in enumerate(found):
        name = f"{FUNCTION_PREFIX}_{index}"
        parsed = ir.Module.parse(_function_text(name, op))
        for fn in list(parsed.body.operations):
            fn.operation.detach_from_parent()
            block.append(fn)
        call = ir.Operation.create(
            "util.call",
            results=[op.results[0].type],
            operands=list(op.operands),
            attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
            loc=op.location,
        )
        ir.InsertionPoint(op).insert(call)
        op.results[0].replace_all_uses_with(call.results[0])
        op.erase()
    return len(found)
