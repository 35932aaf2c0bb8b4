"""Convolutions on llvm-cpu: 1-D ones as one matmul over gathered columns (im2col), 2-D ones
of a batch one image at a time under data tiling.

**1-D.** IREE 3.13 compiles `linalg.conv_1d_ncw_fcw` on llvm-cpu to a direct convolution loop
nest that ran Whisper-tiny's two front-end convolutions (80 -> 384 and 384 -> 384 channels, 3
taps, 3000 frames) at ~2 GFLOP/s: 45% of the encoder's call (`plex profile`, 2026-12-06). Its
`--iree-global-opt-use-im2col-for-convs` takes only 2-D convolutions. Here each static-shaped
1-D convolution of a variant whose devices are all llvm-cpu becomes, at the input phase,

    col[n, c, k, w] = x[n, c, w * stride + k * dilation]      (a gather, C*K x Wo per batch)
    y[n, f, w] += sum over (c, k) of filter[f, (c, k)] * col[n, (c, k), w]   (a contraction)

so the product runs as IREE's matmul (packed for its microkernels under data tiling). The
gathered columns are K times the input: transient, 13.8 MiB for Whisper's second convolution.

**2-D, a batch under data tiling.** IREE's im2col (`--iree-global-opt-use-im2col-for-convs`,
on with data tiling) turns an NCHW convolution into `[F, C*KH*KW] x [N, C*KH*KW, OH*OW]`. At
batch 1 the N dimension folds away and data tiling packs the product for the `mmt4d`
microkernels; at a larger batch the product has two dimensions on one side, which IREE 3.13's
data tiling does not encode, so every convolution ran as a plain codegen matmul (ResNet-50 at
batch 16, `plex profile`: 90% of the call in such matmuls, no `mmt4d`; 0.55x torch eager at 1
thread). Here each static-shaped f32 `linalg.conv_2d_nchw_fchw` with a batch above 1, on a
variant whose devices all use data tiling, becomes N convolutions of one image each (slices of
the input and of the initial output, put back into one result): each is the batch-1 case, the
packed microkernel's, and the packed filter is shared. ResNet-50 at batch 16: 2.3x faster
(1.04x torch eager, 0.56x ONNX Runtime, 1 thread, load 13-15). Batches up to MAX_SPLIT.

Tried and not taken (ResNet-50, batch 16, 1 thread, 2026-12-06): one product over all images,
`[N*OH*OW, C*KH*KW] x [F, C*KH*KW]^T`, is packed but needs a transpose back to NCHW after
every convolution (a quarter of the call); written channels-last, IREE's transpose propagation
folds the transposes into the product and leaves two dimensions on one side again (3x slower);
IREE's `iree-preprocessing-convert-conv-to-channels-last` with its im2col: 1.4-1.7x faster, not
packed.
"""

from __future__ import annotations

from collections.abc import Callable

from iree.compiler import ir

CONV_1D = "linalg.conv_1d_ncw_fcw"
CONV_2D = "linalg.conv_2d_nchw_fchw"
FUNCTION_PREFIX = "plex_cpu_conv1d"
FUNCTION_PREFIX_2D = "plex_cpu_conv2d"
# The largest batch split into one-image convolutions: each image is one more convolution to
# compile (ResNet-50 at batch 16: 114-155 s against 28-100 s), so a larger batch keeps IREE's
# own form rather than a compile time that grows without bound.
MAX_SPLIT = 16


def _attribute_value(op: ir.Operation, name: str) -> int:
    attribute = op.attributes[name]
    return int(str(attribute).split("<", 1)[1].split(">", 1)[0])


def _attribute_pair(op: ir.Operation, name: str) -> tuple[int, int]:
    """A 2-D convolution's strides or dilations: `dense<2>` (a splat) or `dense<[2, 1]>`; IREE
    leaves them out when they are 1."""
    if name not in op.attributes:
        return 1, 1
    text = str(op.attributes[name]).split("<", 1)[1].split(">", 1)[0].strip("[] ")
    values = [int(v) for v in text.split(",")]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _covered(op: ir.Operation) -> bool:
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    return all(t.has_static_shape and isinstance(t.element_type, ir.F32Type) for t in types)


def _batch(op: ir.Operation) -> int:
    return ir.RankedTensorType(op.operands[0].type).shape[0]


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


def _function_text_2d(name: str, op: ir.Operation) -> str:
    """The batch's convolution as N one-image convolutions (each IREE's packed batch-1 case)."""
    x_t, f_t, y_t = (ir.RankedTensorType(v.type) for v in op.operands)
    n, c, h, w = x_t.shape
    f = f_t.shape[0]
    oh, ow = y_t.shape[2], y_t.shape[3]
    sh, sw = _attribute_pair(op, "strides")
    dh, dw = _attribute_pair(op, "dilations")
    x1 = f"tensor<1x{c}x{h}x{w}xf32>"
    y1 = f"tensor<1x{f}x{oh}x{ow}xf32>"
    lines = []
    current = "%y0"
    for i in range(n):
        lines.append(
            f"  %x{i} = tensor.extract_slice %x[{i}, 0, 0, 0] [1, {c}, {h}, {w}] [1, 1, 1, 1]"
            f" : {x_t} to {x1}\n"
            f"  %a{i} = tensor.extract_slice %y0[{i}, 0, 0, 0] [1, {f}, {oh}, {ow}] [1, 1, 1, 1]"
            f" : {y_t} to {y1}\n"
            f"  %c{i} = linalg.conv_2d_nchw_fchw {{dilations = dense<[{dh}, {dw}]> : tensor<2xi64>,"
            f" strides = dense<[{sh}, {sw}]> : tensor<2xi64>}}"
            f" ins(%x{i}, %f : {x1}, {f_t}) outs(%a{i} : {y1}) -> {y1}\n"
            f"  %y{i + 1} = tensor.insert_slice %c{i} into {current}[{i}, 0, 0, 0]"
            f" [1, {f}, {oh}, {ow}] [1, 1, 1, 1] : {y1} into {y_t}\n"
        )
        current = f"%y{i + 1}"
    body = "".join(lines)
    return f"""
util.func private @{name}(%x: {x_t}, %f: {f_t}, %y0: {y_t}) -> {y_t} {{
{body}  util.return {current} : {y_t}
}}
"""


def rewrite_cpu_convolutions(module: ir.Operation, *, data_tiling: bool = False) -> int:
    """Rewrite every covered 1-D convolution of `module`, and with `data_tiling` (every device
    of the variant packs its matmuls) every covered 2-D NCHW one; the number rewritten."""
    found: list[tuple[ir.Operation, str, Callable[[str, ir.Operation], str]]] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == CONV_1D and _covered(op):
            found.append((op, FUNCTION_PREFIX, _function_text))
        elif op.name == CONV_2D and data_tiling and _covered(op) and 1 < _batch(op) <= MAX_SPLIT:
            found.append((op, FUNCTION_PREFIX_2D, _function_text_2d))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    block = module.regions[0].blocks[0]
    for index, (op, prefix, text_of) in enumerate(found):
        name = f"{prefix}_{index}"
        parsed = ir.Module.parse(text_of(name, op))
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
