"""Convolutions on llvm-cpu: 1-D ones as one matmul over gathered columns (im2col), 2-D ones
of a batch one image at a time under data tiling (`conv_batch = "images"`).

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

The elementwise ops that take the convolution's result one after another (a batch norm, a
residual add, an activation: `_image_chain`) are split with it. Split alone, each image's
product was put back into the batch tensor and those ops ran over the whole batch after it:
at batch 16 a separate pass over 51 MiB per ResNet block end, 11% of the call (`plex profile`,
1 thread, 2026-12-07), where at batch 1 IREE fuses them into the product's unpack. Split with
the convolution, they fuse there again: ResNet-50 at batch 16 in 0.93x the time, the outputs
bit-identical.

An image's input is taken before the batch-wide ops that would copy it: a zero border is
padded on the image alone (`_padding_of_images`), a concat along channels joins that image's
parts (`_concat_of_channels`), and an initial output that is a fill or a broadcast bias is
made for the image (`_fill_of_images`). Depthwise convolutions (`linalg.depthwise_conv_2d_
nchw_chw`, Segformer's Mix-FFN) are split the same way: IREE's over a batch of 16 took 1.7x
the time of its images one at a time. Segformer-b0 at batch 16 (`plex profile`, 1 thread):
its four stages' features joined in a strided copy, 4 x 96 ms a call, gone; its depthwise
convolutions 1.29 s -> 0.49 s. Without the bias made per image, the depthwise convolution's
sliced initial output became a copy IREE 3.13 fails to compile.

Tried and not taken (ResNet-50, batch 16, 1 thread, 2026-12-06): one product over all images,
`[N*OH*OW, C*KH*KW] x [F, C*KH*KW]^T`, is packed but needs a transpose back to NCHW after
every convolution (a quarter of the call); written channels-last, IREE's transpose propagation
folds the transposes into the product and leaves two dimensions on one side again (3x slower);
IREE's `iree-preprocessing-convert-conv-to-channels-last` with its im2col: 1.4-1.7x faster, not
packed.
"""

from __future__ import annotations

from iree.compiler import ir

CONV_1D = "linalg.conv_1d_ncw_fcw"
CONV_2D = "linalg.conv_2d_nchw_fchw"
DEPTHWISE = "linalg.depthwise_conv_2d_nchw_chw"
FUNCTION_PREFIX = "plex_cpu_conv1d"
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


def _splits(op: ir.Operation) -> bool:
    """Whether a covered 2-D convolution of a batch is split by image. A depthwise one needs a
    window of at least 2 x 2: a 1-D depthwise convolution written as 2-D (a window of width 1,
    as ONNX's causal convolutions import) split by image fails IREE 3.13's compile ("slice
    along dimension 3 runs out-of-bounds") and keeps IREE's batch form."""
    if not (_covered(op) and 1 < _batch(op) <= MAX_SPLIT):
        return False
    if op.name == DEPTHWISE:
        return min(ir.RankedTensorType(op.operands[1].type).shape[1:]) > 1
    return True


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


def _slice_op(source: ir.Value, image: int, image_type: ir.RankedTensorType) -> ir.Value:
    """`tensor.extract_slice` of image `image` of a batch tensor, at the insertion point."""
    rank = image_type.rank
    return ir.Operation.create(
        "tensor.extract_slice",
        results=[image_type],
        operands=[source],
        attributes={
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 0, 0, 0]),
            "static_offsets": ir.DenseI64ArrayAttr.get([image] + [0] * (rank - 1)),
            "static_sizes": ir.DenseI64ArrayAttr.get(list(image_type.shape)),
            "static_strides": ir.DenseI64ArrayAttr.get([1] * rank),
        },
    ).results[0]


def _insert_op(source: ir.Value, dest: ir.Value, image: int) -> ir.Value:
    """`tensor.insert_slice` of one image's result into the batch tensor `dest`."""
    image_type = ir.RankedTensorType(source.type)
    rank = image_type.rank
    return ir.Operation.create(
        "tensor.insert_slice",
        results=[dest.type],
        operands=[source, dest],
        attributes={
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1, 0, 0, 0]),
            "static_offsets": ir.DenseI64ArrayAttr.get([image] + [0] * (rank - 1)),
            "static_sizes": ir.DenseI64ArrayAttr.get(list(image_type.shape)),
            "static_strides": ir.DenseI64ArrayAttr.get([1] * rank),
        },
    ).results[0]


def _reads_batch_index(expr: ir.AffineExpr) -> bool | None:
    """Whether an operand's index `expr` reads dimension 0 (the image); None where it is more
    than a dimension or a constant (not taken)."""
    if isinstance(expr, ir.AffineDimExpr):
        return expr.position == 0
    if isinstance(expr, ir.AffineConstantExpr):
        return False
    return None


def _image_operands(op: ir.Operation, batch_type: ir.Type) -> list[bool] | None:
    """For an elementwise `linalg.generic` over a whole batch tensor of `batch_type` (all loops
    parallel, the result of that type written in order, no `linalg.index`): for each operand,
    whether it is read image by image (the same type, in order) rather than whole (a
    per-channel constant, read the same for every image). None where `op` is not one."""
    if op.name != "linalg.generic" or len(op.results) != 1 or op.results[0].type != batch_type:
        return None
    if any("parallel" not in str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"])):
        return None
    rank = ir.RankedTensorType(batch_type).rank
    identity = ir.AffineMap.get_identity(rank)
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    found: list[bool] = []
    for operand, index_map in zip(op.operands, maps, strict=True):
        if index_map == identity and operand.type == batch_type:
            found.append(True)
            continue
        reads = [_reads_batch_index(e) for e in index_map.results]
        if any(r is not False for r in reads):
            return None
        found.append(False)
    if not found[-1]:  # the result is written image by image
        return None
    indexed: list[bool] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if inner.name == "linalg.index":
            indexed.append(True)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return None if indexed else found


def _image_chain(conv: ir.Operation) -> list[tuple[ir.Operation, list[bool]]]:
    """The elementwise ops that take the convolution's result, one after another, each the only
    user of the one before (a batch norm, a bias, a residual add, an activation): split with the
    convolution, so that each image's runs in its product's dispatch."""
    chain: list[tuple[ir.Operation, list[bool]]] = []
    value = conv.results[0]
    while True:
        uses = list(value.uses)
        if len(uses) != 1:
            break
        user = uses[0].owner
        per_image = _image_operands(user, value.type)
        if per_image is None or uses[0].operand_number == len(user.operands) - 1:
            break  # not elementwise over the batch, or the value is its output's init
        chain.append((user, per_image))
        value = user.results[0]
    return chain


def _concat_of_channels(value: ir.Value) -> ir.Operation | None:
    """The `tensor.concat` that made `value` along a dimension other than the batch (Segformer's
    decode head joins its four stages' features), else None. An image of it is the concat of
    that image of each part: a batch's concat along channels writes each image's parts apart
    (IREE 3.13 copies them strided: 4 x 96 ms a call of Segformer-b0 at batch 16, 1 thread),
    one image's are one contiguous block, written in place."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner
    op = op.operation if hasattr(op, "operation") else op
    if op.name != "tensor.concat" or ir.IntegerAttr(op.attributes["dim"]).value == 0:
        return None
    return op


def _padding_of_images(value: ir.Value) -> ir.Operation | None:
    """The `tensor.pad` that made `value` where it pads each image alike (static, nothing
    added along the batch): the convolution's zero border, taken image by image."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner
    op = op.operation if hasattr(op, "operation") else op
    if op.name != "tensor.pad" or len(op.operands) != 1:
        return None
    low = ir.DenseI64ArrayAttr(op.attributes["static_low"])
    high = ir.DenseI64ArrayAttr(op.attributes["static_high"])
    return op if low[0] == 0 and high[0] == 0 else None


def _fill_of_images(value: ir.Value) -> ir.Operation | None:
    """The op that made `value` where it writes every image alike from values without a batch:
    a `linalg.fill`, a `linalg.broadcast` of a bias, or an elementwise op broadcasting one. A
    depthwise convolution's initial output, sliced from such a batch tensor, became a copy
    IREE 3.13 fails to compile ("write affecting operations on global resources are
    restricted to workgroup distributed contexts"); made for the image, it is the image's
    own."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner
    op = op.operation if hasattr(op, "operation") else op
    if op.name == "linalg.fill" and len(op.results) == 1:
        return op
    if op.name == "linalg.broadcast":  # a bias: the batch is one of the dimensions it adds
        return op if 0 in list(ir.DenseI64ArrayAttr(op.attributes["dimensions"])) else None
    per_image = _image_operands(op, value.type)
    if per_image is None or any(per_image[:-1]):
        return None
    return op


def _split_by_image(conv: ir.Operation) -> None:
    """Replace a batch's 2-D convolution, and the elementwise ops after it (_image_chain), by
    the same ops on one image at a time (each IREE's packed batch-1 case), put back into one
    batch result. The packed filter is shared: the same value for every image."""
    chain = _image_chain(conv)
    last = chain[-1][0] if chain else conv
    batch = _batch(conv)
    slices: list[tuple[ir.Value, int, ir.Value]] = []

    def image_of(value: ir.Value, image: int) -> ir.Value:
        for source, index, sliced in slices:
            if source == value and index == image:
                return sliced
        whole = ir.RankedTensorType(value.type)
        image_type = ir.RankedTensorType.get([1, *whole.shape[1:]], whole.element_type)
        concat = _concat_of_channels(value)
        padding = _padding_of_images(value)
        filled = _fill_of_images(value)
        if filled is not None:  # computed for the image: no slice of the batch's init to copy
            init = image_of(filled.operands[len(filled.operands) - 1], image)
            copy = filled.clone(ip=ir.InsertionPoint(last))
            copy.operands[len(copy.operands) - 1] = init
            copy.results[0].set_type(image_type)
            sliced = copy.results[0]
        elif padding is not None:  # the image, padded: no padded copy of the whole batch
            source = image_of(padding.operands[0], image)  # before the op that reads it
            padded = padding.clone(ip=ir.InsertionPoint(last))
            padded.operands[0] = source
            padded.results[0].set_type(image_type)
            sliced = padded.results[0]
        elif concat is not None:  # the image's parts, joined: one contiguous block each
            parts = [image_of(part, image) for part in concat.operands]
            sliced = ir.Operation.create(
                "tensor.concat",
                results=[image_type],
                operands=parts,
                attributes={"dim": concat.attributes["dim"]},
            ).results[0]
        else:
            sliced = _slice_op(value, image, image_type)
        slices.append((value, image, sliced))
        return sliced

    def image_value(value: ir.Value, image: int, done: list[tuple[ir.Value, ir.Value]]) -> ir.Value:
        """One image of `value`: the image's copy of the op that made it, else a slice."""
        return next((new for old, new in done if old == value), None) or image_of(value, image)

    with ir.InsertionPoint(last), last.location:
        result = last.operands[len(last.operands) - 1]  # a batch tensor of the result's type
        for image in range(batch):
            done: list[tuple[ir.Value, ir.Value]] = []
            for op, per_image in [(conv, [True, False, True]), *chain]:
                # the operands first: an op is cloned after the slices it reads
                operands = [
                    image_value(operand, image, done) if sliced else operand
                    for operand, sliced in zip(op.operands, per_image, strict=True)
                ]
                copy = op.clone(ip=ir.InsertionPoint(last))
                for k, operand in enumerate(operands):
                    copy.operands[k] = operand
                copy.results[0].set_type(operands[-1].type)  # the output's, one image
                done.append((op.results[0], copy.results[0]))
            result = _insert_op(done[-1][1], result, image)
    last.results[0].replace_all_uses_with(result)
    for op, _ in reversed(chain):
        op.erase()
    conv.erase()


def rewrite_cpu_convolutions(module: ir.Operation, *, by_image: bool = False) -> int:
    """Rewrite every covered 1-D convolution of `module`, and with `by_image` (every device of
    the variant packs its matmuls and takes `conv_batch = "images"`) every covered 2-D NCHW
    one of a batch; the number rewritten."""
    found: list[ir.Operation] = []
    batches: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        split = by_image and op.name in (CONV_2D, DEPTHWISE)
        if op.name == CONV_1D and _covered(op):
            found.append(op)
        elif split and _splits(op):
            batches.append(op)
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
    for op in batches:
        _split_by_image(op)
    return len(found) + len(batches)
