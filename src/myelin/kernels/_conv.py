"""2-D convolutions as one matmul over gathered columns (im2col), so the matmul kernels take them.

IREE 3.13 compiles a `linalg.conv_2d_nchw_fchw` for CUDA with its own sm_80 codegen: timm's
ResNet-50 in f16 ran at 0.01x torch eager on an H100 and gave a wrong answer (cosine 0.66 to
torch's output; docs/kernels.md). IREE 3.13 has no input-level pass that turns a convolution
into a 2-D matmul (`iree-preprocessing-convert-1x1-filter-conv2d-to-matmul` takes 1x1 filters
only; `--iree-global-opt-use-im2col-for-convs` makes an `iree_linalg_ext.im2col` after the input
phase, where no kernel can be matched), so the kernels step rewrites each static NCHW
convolution itself, at the input phase, to

    xt = x transposed to NHWC (and padded there, when torch padded it: below)
    cols[(n, oh, ow), (i, j, c)] = xt[n, oh * sh + i * dh, ow * sw + j * dw, c]   (a gather)
    y[(n, oh, ow), f] = sum over (i, j, c) of cols * filter'[f, (i, j, c)]    (A x B^T matmul)

then `y` back to [n, f, oh, ow] (an elementwise transpose). Channels-last throughout: the
gather moves runs of C contiguous channels, and IREE's transpose propagation cancels each
convolution's transpose back against the next one's transpose to NHWC through the batch norm and
ReLU between, so a ResNet's activations stay NHWC from one matmul to the next. A zero
`tensor.pad` of the NCHW input (torch's `padding=`) is replaced by the same pad after the
transpose: between the two transposes it would stop their cancelling. The filter is reordered to
[f, kh, kw, c] (`filter'`), a transpose of a weight, which IREE hoists and computes once at load.
A 1x1 convolution of stride 1 needs no gather: its columns are the input read channels-last. K
(C x KH x KW) is padded with zeros to a multiple of 64, the kernels' K step (ResNet's stem:
3 x 7 x 7 = 147 -> 192); zeros add nothing.

The torch frontend writes f16 convolutions as f16 x f16 accumulated in f32, then a `truncf`;
the truncf moves to the 2-D matmul, where the kernel folds it. A bias is the accumulator's
initial value (torch broadcasts it): `y` is accumulated into it, in the accumulator's type, by
the op that transposes `y` back, and the matmul starts from zero, as the kernels need.

Each rewritten matmul carries `plex.conv` (what the convolution was) until the kernels step has
reported it; a convolution left as it was carries `plex.conv_reason` (why), which the coverage
report gives.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.placement import find_ops
from myelin.kernels._ir import owner_op, sole_user
from myelin.kernels._normalize import inline_ops
from myelin.kernels._rewrite import CONV_MARK, IM2COL_MARK, _is_zero_fill

CONV_2D = "linalg.conv_2d_nchw_fchw"
CONV_1D = "linalg.conv_1d_ncw_fcw"
ONE_D = "plex.conv_1d"  # on a 2-D convolution that was a 1-D one (the report names it so)
MARK = CONV_MARK  # on a rewritten matmul: JSON of `ConvForm.describe()`
WHY = "plex.conv_reason"  # on a convolution left as it was
KERNEL_DTYPES = ("f16", "bf16")
_K_STEP = 64  # the matmul kernels' K tile: K % 64 == 0
_N_STEP = 16  # the matmul kernels' N alignment: N % 16 == 0


@dataclass(frozen=True)
class ConvForm:
    """One NCHW convolution's sizes, and the matmul it becomes."""

    n: int
    c: int
    h: int  # the padded input's
    w: int
    f: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    dtype: str
    acc: str
    one_d: bool = False  # a 1-D convolution, as a 2-D one of height 1

    @property
    def k(self) -> int:
        return self.c * self.kh * self.kw

    @property
    def k_padded(self) -> int:
        return -(-self.k // _K_STEP) * _K_STEP

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow

    @property
    def im2col_in_place(self) -> bool:
        """Whether the convolution kernel reads the columns from the NHWC input: every
        convolution with a gather (masked per column where C does not fill whole K steps)."""
        return not self.pointwise

    def geometry(self) -> dict[str, int]:
        """What the convolution kernel needs besides M, N, K (myelin.kernels._triton)."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        return {
            "oh": self.oh, "ow": self.ow, "hp": self.h, "wp": self.w, "c": self.c,
            "kw": self.kw, "sh": sh, "sw": sw, "dh": dh, "dw": dw, "kr": self.k,
        }  # fmt: skip

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1: the columns are the input, channels-last (no gather)."""
        return (self.kh, self.kw, *self.stride) == (1, 1, 1, 1)

    def describe(self) -> dict:
        form = "matmul (1x1, stride 1: no gather)" if self.pointwise else "im2col + matmul"
        padded = f", K {self.k} padded to {self.k_padded}" if self.k_padded != self.k else ""
        if self.one_d:
            size = f"{self.kw} taps stride {self.stride[1]} dilation {self.dilation[1]}"
        else:
            size = (
                f"{self.kh}x{self.kw} stride {_pair(self.stride)} dilation {_pair(self.dilation)}"
            )
        return {
            "op": (CONV_1D if self.one_d else CONV_2D).removeprefix("linalg."),
            "conv": f"{size}, {self.c} -> {self.f} channels, as {form}{padded}",
            "flops": 2 * self.m * self.f * self.k,
        }


@dataclass(frozen=True)
class ZeroPad:
    """The zeros a `tensor.pad` adds around an NCHW input's height and width."""

    top: int
    bottom: int
    left: int
    right: int


def _zero_pad_of(x: ir.Value, rank: int) -> tuple[ir.Operation, list[int], list[int]] | None:
    """The `tensor.pad` of rank `rank` that made `x` (its one use: the convolution), when it
    pads only the spatial dims (not batch or channels) with zeros: torch's `padding=`, as
    (pad, low, high)."""
    pad = owner_op(x)
    if pad is None or pad.name != "tensor.pad" or len(list(x.uses)) != 1:
        return None
    low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
    if len(low) != rank or low[:2] != [0, 0] or high[:2] != [0, 0] or min(low + high) < 0:
        return None
    body = list(pad.regions[0].blocks[0].operations)
    value = owner_op(body[-1].operands[0]) if body[-1].operands else None
    if value is None or value.name != "arith.constant":
        return None
    if str(value.attributes["value"]).split(":")[0].strip() not in ("0.000000e+00", "0.0"):
        return None
    return pad, low, high


def _zero_pad(x: ir.Value) -> tuple[ir.Operation, ZeroPad] | None:
    """The zero pad of an NCHW input's height and width that made `x`. The rewrite then pads
    channels-last itself, so the transpose to NHWC meets the input before the pad, where IREE
    cancels it against the previous convolution's transpose back (a pad between them stops
    that)."""
    found = _zero_pad_of(x, 4)
    if found is None:
        return None
    pad, low, high = found
    return pad, ZeroPad(low[2], high[2], low[3], high[3])


def _pair(values: tuple[int, int]) -> str:
    return str(values[0]) if values[0] == values[1] else f"{values[0]}x{values[1]}"


def _element(t: ir.Type) -> str:
    return str(ir.RankedTensorType(t).element_type)


def _pair_attribute(op: ir.Operation, name: str) -> tuple[int, int]:
    """`dense<2> : vector<2xi64>` or `dense<[2, 1]> : vector<2xi64>` as (2, 2) or (2, 1)."""
    if name not in op.attributes:
        return (1, 1)
    body = str(op.attributes[name]).split("<", 1)[1].split(">", 1)[0]
    values = [int(v) for v in re.findall(r"-?\d+", body)]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _narrowing(result: ir.Value) -> ir.Operation | None:
    """The elementwise generic that only narrows this f32 result (to f16/bf16), when it is the
    result's one use."""
    user = sole_user(result)
    if user is None or user.name != "linalg.generic":
        return None
    if len(user.operands) != 2 or user.operands[0] != result:
        return None
    rank = ir.RankedTensorType(result.type).rank
    identity = str(ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank)))
    if [str(m) for m in ir.ArrayAttr(user.attributes["indexing_maps"])] != [identity] * 2:
        return None
    block = user.regions[0].blocks[0]
    body = list(block.operations)
    if [o.name for o in body] != ["arith.truncf", "linalg.yield"]:
        return None
    if body[0].operands[0] != block.arguments[0] or body[1].operands[0] != body[0].results[0]:
        return None
    return user if _element(user.results[0].type) in KERNEL_DTYPES else None


def conv_form(op: ir.Operation, dtypes: tuple[str, ...] | None) -> ConvForm | str:
    """The convolution's form, or why it is not rewritten (`dtypes`: the input types rewritten;
    None: any)."""
    x, w = op.operands[0], op.operands[1]
    types = [ir.RankedTensorType(v.type) for v in (x, w, op.results[0])]
    if not all(t.has_static_shape for t in types):
        return "convolution with dynamic shapes: im2col needs static ones"
    (n, c, h, width), (f, _, kh, kw), (_, _, oh, ow) = (t.shape for t in types)
    dtype, acc = _element(x.type), _element(op.results[0].type)
    if _element(w.type) != dtype:
        return f"convolution of {dtype} by {_element(w.type)}: no kernel form"
    if dtypes is not None and dtype not in dtypes:
        return f"convolution inputs {dtype}: kernels take f16 or bf16 (build the model in f16)"
    if acc not in ("f32", dtype):
        return f"convolution accumulating in {acc}: no kernel form"
    if dtypes is not None and f % _N_STEP:
        return f"convolution with {f} output channels: kernels need N % 16 == 0"
    stride, dilation = _pair_attribute(op, "strides"), _pair_attribute(op, "dilations")
    one_d = ONE_D in op.attributes
    return ConvForm(n, c, h, width, f, kh, kw, oh, ow, stride, dilation, dtype, acc, one_d)


def _parallel(rank: int) -> str:
    return ", ".join(['"parallel"'] * rank)


def _tensor(dims: list[int], element: str) -> str:
    return "tensor<" + "x".join(str(d) for d in dims) + f"x{element}>"


def _function_text(form: ConvForm, bias: bool, out: str | None, pad: ZeroPad | None) -> str:
    """(x, filter, init) -> the convolution's result (or its narrowing's, `out`), as a gather,
    a 2-D A x B^T matmul and a transpose back to NCHW. With `pad`, x is the unpadded input and
    the zeros are added channels-last, after its transpose."""
    s = form
    el, acc = s.dtype, s.acc
    x_t = _tensor([s.n, s.c, s.h, s.w], el)
    if pad is not None:
        x_t = _tensor([s.n, s.c, s.h - pad.top - pad.bottom, s.w - pad.left - pad.right], el)
    w_t = _tensor([s.f, s.c, s.kh, s.kw], el)
    y_t = _tensor([s.n, s.f, s.oh, s.ow], acc)
    cols_t, wk_t = _tensor([s.m, s.k], el), _tensor([s.f, s.k], el)
    fhwc = _tensor([s.f, s.kh, s.kw, s.c], el)
    lines = []
    if s.pointwise:
        nhwc = _tensor([s.n, s.h, s.w, s.c], el)
        lines += [
            f"%e = tensor.empty() : {nhwc}",
            f"%t = linalg.transpose ins(%x : {x_t}) outs(%e : {nhwc}) permutation = [0, 2, 3, 1]",
            f"%cols = tensor.collapse_shape %t [[0, 1, 2], [3]] : {nhwc} into {cols_t}",
        ]
    else:
        # Channels-last columns, in (i, j, c) order: the gather reads and writes runs of C
        # contiguous channels, and the transpose to NHWC cancels against the one that made the
        # input NCHW (the previous convolution's way back), which IREE folds through the
        # elementwise ops between. The filter is reordered to match ([f, kh, kw, c]: a weight's
        # transpose, which IREE computes once, at load).
        (sh, sw), (dh, dw) = s.stride, s.dilation
        nhwc = _tensor([s.n, s.h, s.w, s.c], el)
        col6 = _tensor([s.n, s.oh, s.ow, s.kh, s.kw, s.c], el)
        gather = (
            f"affine_map<(n, h, w, i, j, c) -> (n, h * {sh} + i * {dh}, w * {sw} + j * {dw}, c)>"
        )
        x_dims = ir.RankedTensorType.parse(x_t).shape
        source = _tensor([x_dims[0], x_dims[2], x_dims[3], x_dims[1]], el)
        lines += [
            f"%xe = tensor.empty() : {source}",
            f"%xt = linalg.transpose ins(%x : {x_t}) outs(%xe : {source}) "
            "permutation = [0, 2, 3, 1]",
        ]
        if pad is not None:
            lines += [
                f"%xz = arith.constant 0.000000e+00 : {el}",
                f"%xp = tensor.pad %xt low[0, {pad.top}, {pad.left}, 0] "
                f"high[0, {pad.bottom}, {pad.right}, 0] {{",
                "^bb0(%p0: index, %p1: index, %p2: index, %p3: index):",
                f"  tensor.yield %xz : {el}",
                f"}} : {source} to {nhwc}",
            ]
        lines += [
            f"%e = tensor.empty() : {col6}",
            f"%g = linalg.generic {{indexing_maps = [{gather}, "
            "affine_map<(n, h, w, i, j, c) -> (n, h, w, i, j, c)>], "
            f"iterator_types = [{_parallel(6)}]}} "
            f"ins({'%xp' if pad is not None else '%xt'} : {nhwc}) outs(%e : {col6}) {{",
            f"^bb0(%v: {el}, %o: {el}):",
            f"  linalg.yield %v : {el}",
            f"}} -> {col6}",
            f"%cols = tensor.collapse_shape %g [[0, 1, 2], [3, 4, 5]] : {col6} into {cols_t}",
            f"%we = tensor.empty() : {fhwc}",
            f"%wt = linalg.transpose ins(%w : {w_t}) outs(%we : {fhwc}) permutation = [0, 2, 3, 1]",
        ]
    weight, weight_t = ("%w", w_t) if s.pointwise else ("%wt", fhwc)
    lines.append(f"%wk = tensor.collapse_shape {weight} [[0], [1, 2, 3]] : {weight_t} into {wk_t}")
    a, b = "%cols", "%wk"
    if s.k_padded != s.k:
        extra = s.k_padded - s.k
        cols_p, wk_p = _tensor([s.m, s.k_padded], el), _tensor([s.f, s.k_padded], el)
        lines.append(f"%pz = arith.constant 0.000000e+00 : {el}")
        for name, value, src_t, dst_t in (("%colsp", a, cols_t, cols_p), ("%wkp", b, wk_t, wk_p)):
            lines += [
                f"{name} = tensor.pad {value} low[0, 0] high[0, {extra}] {{",
                "^bb0(%i0: index, %i1: index):",
                f"  tensor.yield %pz : {el}",
                f"}} : {src_t} to {dst_t}",
            ]
        a, b, cols_t, wk_t = "%colsp", "%wkp", cols_p, wk_p
    mm_t = _tensor([s.m, s.f], acc)
    lines += [
        f"%me = tensor.empty() : {mm_t}",
        f"%zero = arith.constant 0.000000e+00 : {acc}",
        f"%init0 = linalg.fill ins(%zero : {acc}) outs(%me : {mm_t}) -> {mm_t}",
        "%mm = linalg.matmul indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, "
        "affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>] "
        f"ins({a}, {b} : {cols_t}, {wk_t}) outs(%init0 : {mm_t}) -> {mm_t}",
    ]
    result, res_el = "%mm", acc
    if out is not None:
        out_t = _tensor([s.m, s.f], out)
        identity = "affine_map<(d0, d1) -> (d0, d1)>"
        lines += [
            f"%ne = tensor.empty() : {out_t}",
            f"%narrow = linalg.generic {{indexing_maps = [{identity}, {identity}], "
            f'iterator_types = ["parallel", "parallel"]}} ins(%mm : {mm_t}) '
            f"outs(%ne : {out_t}) {{",
            f"^bb0(%v: {acc}, %o: {out}):",
            f"  %t2 = arith.truncf %v : {acc} to {out}",
            f"  linalg.yield %t2 : {out}",
            f"}} -> {out_t}",
        ]
        result, res_el = "%narrow", out
    nhwf = _tensor([s.n, s.oh, s.ow, s.f], res_el)
    back_t = _tensor([s.n, s.f, s.oh, s.ow], res_el)
    lines.append(
        f"%y4 = tensor.expand_shape {result} [[0, 1, 2], [3]] "
        f"output_shape [{s.n}, {s.oh}, {s.ow}, {s.f}] : {_tensor([s.m, s.f], res_el)} into {nhwf}"
    )
    read = "affine_map<(n, f, h, w) -> (n, h, w, f)>"
    same = "affine_map<(n, f, h, w) -> (n, f, h, w)>"
    parallel = _parallel(4)
    if bias:
        # accumulated into the initial value, in its type, as the convolution did (written as
        # an input instead, IREE 3.13's fusion of the bias's widening made an f16 + f32 add)
        lines += [
            f"%y = linalg.generic {{indexing_maps = [{read}, {same}], "
            f"iterator_types = [{parallel}]}} ins(%y4 : {nhwf}) outs(%init : {y_t}) {{",
            f"^bb0(%v: {acc}, %o: {acc}):",
            f"  %sum = arith.addf %v, %o : {acc}",
            f"  linalg.yield %sum : {acc}",
            f"}} -> {back_t}",
        ]
    else:
        lines += [
            f"%ye = tensor.empty() : {back_t}",
            f"%y = linalg.generic {{indexing_maps = [{read}, {same}], "
            f"iterator_types = [{parallel}]}} ins(%y4 : {nhwf}) outs(%ye : {back_t}) {{",
            f"^bb0(%v: {res_el}, %o: {res_el}):",
            f"  linalg.yield %v : {res_el}",
            f"}} -> {back_t}",
        ]
    lines.append(f"util.return %y : {back_t}")
    body = "\n  ".join(lines)
    return (
        f"util.func private @conv(%x: {x_t}, %w: {w_t}, %init: {y_t}) -> {back_t} {{\n  {body}\n}}"
    )


def _conv_1d_text(op: ir.Operation, pad: tuple[int, int] | None) -> str | None:
    """A static 1-D NCW convolution as a 2-D NCHW one of height 1 (Whisper's front end): the
    input, filter and initial output get a unit dim (reshapes only), the result loses it. With
    `pad` (left, right), `%x` is the input before torch's zero pad, and the pad is made again
    on the 4-D input, where the 2-D rewrite moves it after the transpose to NHWC."""
    types = [ir.RankedTensorType(v.type) for v in (*op.operands[:3], op.results[0])]
    if not all(t.has_static_shape for t in types):
        return None
    (x_t, w_t, i_t, y_t), (x, w, i, y) = (str(t) for t in types), (t.shape for t in types)
    stride = _pair_attribute(op, "strides")[0]
    dilation = _pair_attribute(op, "dilations")[0]
    el = _element(op.operands[0].type)
    x4 = _tensor([x[0], x[1], 1, x[2]], el)
    w4 = _tensor([w[0], w[1], 1, w[2]], _element(op.operands[1].type))
    y4 = _tensor([y[0], y[1], 1, y[2]], _element(op.results[0].type))
    expand = "[[0], [1], [2, 3]]"
    widen = f"%x4 = tensor.expand_shape %x {expand} output_shape {[x[0], x[1], 1, x[2]]} : {x_t}"
    if pad is None:
        widen += f" into {x4}"
    else:
        left, right = pad
        width = x[2] - left - right
        x_t = _tensor([x[0], x[1], width], el)
        u4 = _tensor([x[0], x[1], 1, width], el)
        widen = "\n  ".join(
            [
                f"%u4 = tensor.expand_shape %x {expand} output_shape {[x[0], x[1], 1, width]} "
                f": {x_t} into {u4}",
                f"%xz = arith.constant 0.000000e+00 : {el}",
                f"%x4 = tensor.pad %u4 low[0, 0, 0, {left}] high[0, 0, 0, {right}] {{",
                "^bb0(%p0: index, %p1: index, %p2: index, %p3: index):",
                f"  tensor.yield %xz : {el}",
                f"}} : {u4} to {x4}",
            ]
        )
    return f"""util.func private @conv(%x: {x_t}, %w: {w_t}, %i: {i_t}) -> {y_t} {{
  {widen}
  %w4 = tensor.expand_shape %w {expand} output_shape {[w[0], w[1], 1, w[2]]} : {w_t} into {w4}
  %i4 = tensor.expand_shape %i {expand} output_shape {[i[0], i[1], 1, i[2]]} : {i_t} into {y4}
  %y4 = linalg.conv_2d_nchw_fchw {{dilations = dense<[1, {dilation}]> : vector<2xi64>,
      strides = dense<[1, {stride}]> : vector<2xi64>, {ONE_D}}}
      ins(%x4, %w4 : {x4}, {w4}) outs(%i4 : {y4}) -> {y4}
  %y = tensor.collapse_shape %y4 {expand} : {y4} into {y_t}
  util.return %y : {y_t}
}}"""


def _convs_1d_as_2d(module: ir.Operation) -> None:
    """Every static `linalg.conv_1d_ncw_fcw` as a 2-D convolution of height 1 (marked `ONE_D`),
    so that the im2col rewrite takes it as any 2-D one."""
    for op in find_ops(module, lambda o: o.name == CONV_1D):
        padded = _zero_pad_of(op.operands[0], 3)
        text = _conv_1d_text(op, (padded[1][2], padded[2][2]) if padded else None)
        if text is None:
            op.attributes[WHY] = ir.StringAttr.get(
                "convolution with dynamic shapes: im2col needs static ones"
            )
            continue
        x = padded[0].operands[0] if padded else op.operands[0]
        with op.location:
            value, _ = inline_ops(text, op, [x, *op.operands[1:3]])
        op.results[0].replace_all_uses_with(value)
        op.erase()
        if padded:
            padded[0].erase()


def convs_as_matmuls(module: ir.Operation, dtypes: tuple[str, ...] | None = KERNEL_DTYPES) -> int:
    """Rewrite every static `linalg.conv_2d_nchw_fchw` (and `linalg.conv_1d_ncw_fcw`, as one of
    height 1) whose inputs are of `dtypes` (None: any) and whose matmul the kernels could take
    to the gather + matmul form (see the module doc); the others get the reason
    (`plex.conv_reason`). Returns how many were rewritten."""
    _convs_1d_as_2d(module)
    rewritten = 0
    for op in find_ops(module, lambda o: o.name == CONV_2D):
        form = conv_form(op, dtypes)
        if isinstance(form, str):
            op.attributes[WHY] = ir.StringAttr.get(form)
            continue
        init = op.operands[2]
        bias = not _is_zero_fill(init)
        truncf = _narrowing(op.results[0]) if form.acc == "f32" and not bias else None
        out = _element(truncf.results[0].type) if truncf is not None else None
        replaced = truncf or op
        padded = None if form.pointwise else _zero_pad(op.operands[0])
        x = padded[0].operands[0] if padded else op.operands[0]
        text = _function_text(form, bias, out, padded[1] if padded else None)
        with op.location:
            value, moved = inline_ops(text, replaced, [x, op.operands[1], init])
        described = {**form.describe(), "location": str(op.location)}
        for m in moved:
            if m.name == "linalg.matmul":
                m.attributes[MARK] = ir.StringAttr.get(json.dumps(described))
            gather = m.name == "linalg.generic" and ir.RankedTensorType(m.results[0].type).rank == 6
            if gather and form.im2col_in_place:
                m.attributes[IM2COL_MARK] = ir.StringAttr.get(json.dumps(form.geometry()))
        replaced.results[0].replace_all_uses_with(value)
        replaced.erase()
        if replaced is not op:
            op.erase()
        fill = owner_op(init)
        if fill is not None and fill.name == "linalg.fill" and not list(fill.results[0].uses):
            fill.erase()
        if padded:
            padded[0].erase()
        rewritten += 1
    return rewritten


def forget_marks(module: ir.Operation) -> None:
    """Drop the report's marks once it is written: they mean nothing to IREE."""
    marks = (MARK, WHY, IM2COL_MARK)
    for op in find_ops(module, lambda o: any(name in o.attributes for name in marks)):
        for name in marks:
            if name in op.attributes:
                del op.attributes[name]
