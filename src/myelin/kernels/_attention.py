"""Attention as IREE external dispatches: the match and rewrite of `iree_linalg_ext.attention`
(what torch's `scaled_dot_product_attention` becomes at IREE's `input` phase) into a flash-attention
Triton kernel for sm_90a (prefill, here) or the split-KV decode kernels (`_decode_attention`).

Only `kernels = "triton-attention"` uses it (`kernels = "triton"` leaves attention to IREE). Each
kind has one config, checked on the H200 at the Llama-7B-shaped block's shapes (causal prefill
2048 x 2048, decode 1 x 2049, d 128; numerics equal to torch eager's against fp32); the masked
decode kernel in the benchmark decoder (1 x 576 slots, d 64: its tokens equal the untuned
build's). Masks: torch's causal mask goes to the flash kernel's `causal`; on decode (at most 16
query rows) any additive mask of Q's dtype is read by the split-KV kernel. Without a
GPU, the kernels' numerics are checked against torch in Triton's interpreter, and their sm_90a
compile and the rewrite (tests/myelin/test_kernels_attention.py, test_kernels_decode_attention.py).
docs/kernels.md says what remains.

The flash kernel: one program per (128 query rows, batch-head); keys in blocks of 64 with the
online softmax (running max and sum in f32, exp2 with the scale folded into log2 units); causal
is torch's `is_causal` (top-left aligned: query i sees keys 0..i), and blocks past the diagonal
are skipped. Q, K, V, O are read and written through strides (i32 push constants: elements
between batches, between heads and between rows, batch-head `bh` being batch `bh // H`, head
`bh % H`): head-major [batch*heads, sequence, head_dim], or token-major when the op's operand
(result) is a transpose of (to) that: [sequence, heads, head_dim] at batch 1, or
[batch, sequence, heads, head_dim] (what a linear's output is after `view(b, s, h, d)`, and what
`transpose(1, 2)` then `reshape` turn the result back into: every transformers and timm
attention). The transposes are then never made. The sequence lengths are push constants too, so
any length works (rows and keys past the end are masked).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from iree.compiler import ir

from myelin.compiler.placement import find_ops
from myelin.kernels import _decode_attention
from myelin.kernels._decode_attention import MAX_QUERY_ROWS, DecodeAttentionConfig
from myelin.kernels._ir import owner_op
from myelin.kernels._rewrite import _function_name, _hex, add_functions, call_in_place_of
from myelin.kernels._triton import CompiledKernel, compile_triton

_TYPES = {"f16": "fp16", "bf16": "bf16"}
_HEAD_DIMS = (64, 128)
_LOG2E = 1.4426950408889634

# iree_linalg_ext.attention's maps for Q [b, m, k1], K [b, k2, k1], V [b, k2, n], the scale,
# the (optional) mask [b, m, k2] and the result [b, m, n], as IREE 3.13 prints them.
_Q, _K, _V = (
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>",
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>",
    "affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>",
)
_SCALE = "affine_map<(d0, d1, d2, d3, d4) -> ()>"
_MASK = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>"
_OUT = "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>"
_MAPS_NO_MASK = f"[{_Q}, {_K}, {_V}, {_SCALE}, {_OUT}]"
_MAPS_MASK = f"[{_Q}, {_K}, {_V}, {_SCALE}, {_MASK}, {_OUT}]"


@dataclass(frozen=True)
class AttentionConfig:
    dtype: str  # "f16" | "bf16"
    head_dim: int
    causal: bool
    scale: float  # the softmax scale, baked into the kernel
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3

    @property
    def name(self) -> str:
        kind = "causal" if self.causal else "full"
        scale = struct.pack(">f", self.scale).hex()
        return (
            f"plex_attention_{kind}_{self.dtype}_d{self.head_dim}_"
            f"{self.block_m}x{self.block_n}_w{self.num_warps}s{self.num_stages}_s{scale}"
        )


def _attention_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_attention(
        q_ptr, k_ptr, v_ptr, o_ptr, SQ, SK, H, Q_OFF, K_OFF, V_OFF,
        Q_SB, Q_SH, Q_SR, K_SB, K_SH, K_SR, V_SB, V_SH, V_SR, O_SB, O_SH, O_SR,
        D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
        QK_SCALE: tl.constexpr,
    ):  # fmt: skip
        # X_SB / X_SH / X_SR: elements between batches / heads / rows of X (its head dim is
        # contiguous); batch-head bh is batch bh // H, head bh % H; X_OFF: where X starts (Q, K,
        # V as column slices of one tensor, a fused QKV projection's output).
        pid_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        batch = bh // H
        head = bh % H
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = tl.arange(0, BN)
        offs_d = tl.arange(0, D)
        q_ptr += Q_OFF + batch * Q_SB + head * Q_SH
        k_ptr += K_OFF + batch * K_SB + head * K_SH
        v_ptr += V_OFF + batch * V_SB + head * V_SH
        o_ptr += batch * O_SB + head * O_SH
        rows = offs_m[:, None] < SQ
        q = tl.load(q_ptr + offs_m[:, None] * Q_SR + offs_d[None, :], mask=rows, other=0.0)
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        hi = SK
        if CAUSAL:  # query i sees keys 0..i: later key blocks are skipped
            hi = tl.minimum(SK, (pid_m + 1) * BM)
        for start in range(0, hi, BN):
            cols = start + offs_n
            k = tl.load(
                k_ptr + cols[None, :] * K_SR + offs_d[:, None],
                mask=cols[None, :] < SK,
                other=0.0,
            )
            s = tl.dot(q, k) * QK_SCALE  # log2 units
            valid = cols[None, :] < SK
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_ptr + cols[:, None] * V_SR + offs_d[None, :],
                mask=cols[:, None] < SK,
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        acc = acc / l_i[:, None]
        out = o_ptr + offs_m[:, None] * O_SR + offs_d[None, :]
        tl.store(out, acc.to(o_ptr.dtype.element_ty), mask=rows)

    return plex_attention


def launch_constants(config: AttentionConfig) -> dict:
    """The kernel's compile-time constants (also what the interpreter test passes)."""
    return {
        "D": config.head_dim,
        "BM": config.block_m,
        "BN": config.block_n,
        "CAUSAL": config.causal,
        "QK_SCALE": config.scale * _LOG2E,
    }


def compile_attention(config: AttentionConfig, arch: str = "sm_90a") -> CompiledKernel:
    t = _TYPES[config.dtype]
    signature = {
        "q_ptr": f"*{t}", "k_ptr": f"*{t}", "v_ptr": f"*{t}", "o_ptr": f"*{t}",
        "SQ": "i32", "SK": "i32", "H": "i32", "Q_OFF": "i32", "K_OFF": "i32", "V_OFF": "i32",
        **{f"{x}_S{y}": "i32" for x in "QKVO" for y in "BHR"},
        "D": "constexpr", "BM": "constexpr", "BN": "constexpr", "CAUSAL": "constexpr",
        "QK_SCALE": "constexpr",
    }  # fmt: skip
    # Pointers 16-byte aligned; offsets and strides multiples of 16 elements (head dims 64,
    # 128): wide loads.
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, *range(7, 22))}
    return compile_triton(
        _attention_fn, signature, launch_constants(config), attrs,
        num_warps=config.num_warps, num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip


def compile_kernels(
    config: AttentionConfig | DecodeAttentionConfig, arch: str = "sm_90a"
) -> dict[str, CompiledKernel]:
    """The kernels one config needs, by export name (flash: one; split-KV decode: two)."""
    if isinstance(config, DecodeAttentionConfig):
        return _decode_attention.compile_decode_attention(config, arch)
    return {config.name: compile_attention(config, arch)}


@dataclass
class AttentionMatch:
    site: dict  # the report entry (same fields as a matmul's; op "attention")
    config: AttentionConfig | DecodeAttentionConfig | None
    op: ir.Operation
    shape: tuple[int, int, int, int]  # (batch*heads, query length, key length, head dim)
    mask_ops: list[ir.Operation]  # the causal mask's producers, erased once unused
    # Split-KV decode whose K and V are each a concat of two parts along the keys (cache, new
    # token): the parts ([bh, n, d] views made by the rewrite) and the concat ops to erase.
    kv_parts: tuple[_Concat, _Concat] | None = None
    # Flash: Q, K, V and O as the kernel reads and writes them: head-major [b, n, d], or
    # token-major [n, b, d] when a `linalg.transpose` [1, 0, 2] makes (or takes) the op's
    # operand (result); the transposes are then skipped (erased once unused).
    layouts: tuple[_Layout, _Layout, _Layout, _Layout] | None = None
    heads: int = 1  # batch-heads per batch, as the flash kernel splits them (layouts' strides)
    # Split-KV decode with an additive mask [batch*heads, query length, key length]: the value.
    mask: ir.Value | None = None


def _static_dims(t: ir.Type) -> list[int] | None:
    rt = ir.RankedTensorType(t)
    if any(rt.is_dynamic_dim(i) for i in range(rt.rank)):
        return None
    return [rt.get_dim_size(i) for i in range(rt.rank)]


def _float_constant(value: ir.Value) -> float | None:
    owner = owner_op(value)
    if getattr(owner, "name", None) != "arith.constant":
        return None
    try:
        return ir.FloatAttr(owner.attributes["value"]).value
    except (ValueError, KeyError):
        return None


def _causal_mask(value: ir.Value) -> list[ir.Operation] | None:
    """The ops that make `value` torch's causal mask (0 where query >= key, -inf elsewhere,
    through reshapes), or None when it is any other mask."""
    chain = []
    owner = owner_op(value)
    while getattr(owner, "name", None) in ("tensor.collapse_shape", "tensor.expand_shape"):
        chain.append(owner)
        owner = owner_op(owner.operands[0])
    if getattr(owner, "name", None) != "linalg.generic" or len(owner.operands) != 1:
        return None
    rank = ir.RankedTensorType(owner.results[0].type).rank
    body = list(owner.regions[0].blocks[0].operations)
    if [o.name for o in body] != [
        "linalg.index", "linalg.index", "arith.cmpi", "arith.select", "linalg.yield"
    ]:  # fmt: skip
        return None
    dims = [ir.IntegerAttr(o.attributes["dim"]).value for o in body[:2]]
    cmp, select = body[2], body[3]
    if dims != [rank - 2, rank - 1] or "arith.cmpi sge" not in str(cmp):
        return None
    if list(cmp.operands) != [body[0].results[0], body[1].results[0]]:
        return None
    if select.operands[0] != cmp.results[0]:
        return None
    if _float_constant(select.operands[1]) != 0.0:
        return None
    if _float_constant(select.operands[2]) != float("-inf"):
        return None
    chain.append(owner)
    fill = owner_op(owner.operands[0])
    if getattr(fill, "name", None) == "linalg.fill":
        chain.append(fill)
    return chain


def _decode_mask_refusal(mask: ir.Value, shape: tuple[int, int, int, int], dtype: str) -> str:
    """Why the split-KV kernel cannot read this (non-causal) mask, or "" when it can: an
    additive mask of the query's dtype (`attn_mask=` a float tensor: 0 keeps a key, -inf hides
    it), static [batch*heads, query length, key length], on a decode (few query rows)."""
    elem = str(ir.RankedTensorType(mask.type).element_type)
    if shape[1] > MAX_QUERY_ROWS:
        return (
            f"the mask is not the causal mask: a general mask is taken by the split-KV decode "
            f"kernel only ({MAX_QUERY_ROWS} query rows at most; here {shape[1]})"
        )
    if elem != dtype:
        return (
            f"{elem} mask: the decode kernel takes an additive mask of the query's dtype "
            f"({dtype}); pass attn_mask as a float tensor (0 / -inf), not a boolean one"
        )
    if _static_dims(mask.type) != [shape[0], shape[1], shape[2]]:
        return "the mask's shape is not static [batch*heads, query length, key length]"
    return ""


_TOKEN_MAJOR = "array<i64: 1, 0, 2>"


@dataclass(frozen=True)
class _Layout:
    """Where the kernel reads (or writes) one of Q, K, V, O: the value and its strides
    (elements between heads and between rows; between batches, or None for one batch-head after
    another) and the reshapes and transpose it makes unneeded (Q, K, V: consumer first; O: from
    the op on, the last being what the kernel's call replaces)."""

    value: ir.Value | None  # None for O: the kernel writes the call's result
    head_stride: int
    row_stride: int
    batch_stride: int | None = None
    heads: int | None = None  # the heads per batch a [b, n, h, d] layout is read with
    skipped: tuple[ir.Operation, ...] = ()  # O: the last one is what the call replaces
    offset: int = 0  # elements before the first one read (a column slice's start)

    def strides(self, heads: int) -> tuple[int, int, int]:
        """(batch, head, row) strides when the batch-heads are `heads` per batch."""
        batch = heads * self.head_stride if self.batch_stride is None else self.batch_stride
        return batch, self.head_stride, self.row_stride


_TOKEN_MAJOR_4D = "array<i64: 0, 2, 1, 3>"
_HEADS_COLLAPSED = "[[0, 1], [2], [3]]"


def _named(op, name: str) -> bool:
    return getattr(op, "name", None) == name


def _operand_layout(value: ir.Value) -> _Layout:
    """The operand [bh, n, d] itself; the token-major [n, bh, d] tensor it is a transpose of
    (torch's `x.transpose(0, 1)` before `scaled_dot_product_attention`); or the [b, n, h, d]
    tensor it is the transpose to [b, h, n, d] and collapse of (`x.view(b, n, h, d)
    .transpose(1, 2)`, as every transformers and timm attention writes it)."""
    b, n, d = _static_dims(value.type) or (0, 0, 0)
    owner = owner_op(value)
    if _named(owner, "linalg.transpose") and str(owner.attributes["permutation"]) == _TOKEN_MAJOR:
        return _Layout(owner.operands[0], d, b * d, skipped=(owner,))
    if _named(owner, "tensor.collapse_shape") and (
        str(owner.attributes["reassociation"]) == _HEADS_COLLAPSED
    ):
        transpose = owner_op(owner.operands[0])
        if (
            _named(transpose, "linalg.transpose")
            and str(transpose.attributes["permutation"]) == _TOKEN_MAJOR_4D
        ):
            x = transpose.operands[0]
            dims = _static_dims(x.type)
            if dims is not None:
                _, s, h, hd = dims
                sliced = _column_slice(x)
                if sliced is None:
                    return _Layout(x, hd, h * hd, s * h * hd, h, (owner, transpose))
                source, offset, width, ops = sliced
                skipped = (owner, transpose, *ops)
                return _Layout(source, hd, width, s * width, h, skipped, offset)
    return _Layout(value, n * d, d)


def _column_slice(x: ir.Value) -> tuple[ir.Value, int, int, tuple[ir.Operation, ...]] | None:
    """When [b, n, h, d] `x` is a view of columns [offset, offset + h*d) of a [b, n, width]
    tensor (GPT-2's `c_attn(x).split(...)` then `view`), that tensor, the offset, the width and
    the view's ops (consumer first): the kernel reads the slice in place, no copy is made."""
    expand = owner_op(x)
    if not _named(expand, "tensor.expand_shape") or (
        str(expand.attributes["reassociation"]) != "[[0], [1], [2, 3]]"
    ):
        return None
    extract = owner_op(expand.operands[0])
    if not _named(extract, "tensor.extract_slice") or len(extract.operands) != 1:
        return None
    source = extract.operands[0]
    dims, sliced = _static_dims(source.type), _static_dims(extract.results[0].type)
    offsets = [int(v) for v in re.findall(r"-?\d+", str(extract.attributes["static_offsets"]))]
    strides = [int(v) for v in re.findall(r"-?\d+", str(extract.attributes["static_strides"]))]
    if dims is None or sliced is None or len(dims) != 3 or strides[-3:] != [1, 1, 1]:
        return None
    if dims[:2] != sliced[:2] or offsets[-3:-1] != [0, 0]:
        return None
    return source, offsets[-1], dims[2], (expand, extract)


def _one_user(value: ir.Value):
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner
    return getattr(user, "operation", user)


def _result_layout(result: ir.Value) -> _Layout:
    """The result [bh, m, d] itself, or, when its one use is a transpose to [m, bh, d] (or an
    expand to [b, h, m, d] whose one use is a transpose to [b, m, h, d]), that."""
    bh, m, d = _static_dims(result.type) or (0, 0, 0)
    user = _one_user(result)
    if (
        _named(user, "linalg.transpose")
        and user.operands[0] == result
        and str(user.attributes["permutation"]) == _TOKEN_MAJOR
    ):
        return _Layout(None, d, bh * d, skipped=(user,))
    if _named(user, "tensor.expand_shape") and (
        str(user.attributes["reassociation"]) == _HEADS_COLLAPSED
    ):
        transpose = _one_user(user.results[0])
        if (
            _named(transpose, "linalg.transpose")
            and transpose.operands[0] == user.results[0]
            and str(transpose.attributes["permutation"]) == _TOKEN_MAJOR_4D
        ):
            dims = _static_dims(transpose.results[0].type)
            if dims is not None:
                _, s, h, hd = dims
                return _Layout(None, hd, h * hd, s * h * hd, h, (user, transpose))
    return _Layout(None, m * d, d)


def _layouts(q: ir.Value, k: ir.Value, v: ir.Value, o: ir.Value, bh: int):
    """Q, K, V, O's layouts and the heads per batch the kernel splits batch-heads by: the
    [b, n, h, d] layouts' heads (those that disagree, or do not divide `bh`, are read as the op
    sees them), else all of `bh` (one batch)."""
    layouts = [*(_operand_layout(x) for x in (q, k, v)), _result_layout(o)]
    heads = next((x.heads for x in layouts if x.heads and bh % x.heads == 0), bh)
    for i, x in enumerate(layouts):
        if x.heads is not None and x.heads != heads:
            value = (q, k, v, None)[i]
            _, n, d = _static_dims((q, k, v, o)[i].type) or (0, 0, 0)
            layouts[i] = _Layout(value, n * d, d)
    return tuple(layouts), heads


@dataclass(frozen=True)
class _Concat:
    """K or V of a decode attention made by `tensor.concat` of two parts along the keys."""

    concat: ir.Operation
    collapse: ir.Operation | None  # the collapse of its leading dims to [bh, n, d], if any

    @property
    def lengths(self) -> tuple[int, int]:
        rank = ir.RankedTensorType(self.concat.results[0].type).rank
        a, b = (ir.RankedTensorType(x.type).get_dim_size(rank - 2) for x in self.concat.operands)
        return a, b

    def views(self) -> tuple[ir.Value, ir.Value]:
        """The two parts as [bh, n, d] (collapses made before the attention op's operand)."""
        if self.collapse is None:
            return self.concat.operands[0], self.concat.operands[1]
        out = []
        for x in self.concat.operands:
            dims = _static_dims(x.type) or []
            bh = 1
            for d in dims[:-2]:
                bh *= d
            elem = ir.RankedTensorType(x.type).element_type
            with ir.InsertionPoint(self.collapse), self.collapse.location:
                view = ir.Operation.create(
                    "tensor.collapse_shape",
                    results=[ir.RankedTensorType.get([bh, *dims[-2:]], elem)],
                    operands=[x],
                    attributes={"reassociation": self.collapse.attributes["reassociation"]},
                )
            out.append(view.results[0])
        return out[0], out[1]

    def dead_ops(self) -> list[ir.Operation]:
        return ([self.collapse] if self.collapse is not None else []) + [self.concat]


def _concat_parts(value: ir.Value) -> _Concat | None:
    """The `tensor.concat` of two static parts along the key dim (second to last) that made
    `value`, directly or through the collapse of its leading dims; None for any other producer.
    torch's `cat((cache, new), dim=-2)` before `scaled_dot_product_attention` lowers to it."""
    owner = owner_op(value)
    collapse = None
    if getattr(owner, "name", None) == "tensor.collapse_shape":
        collapse = owner
        owner = owner_op(owner.operands[0])
    if getattr(owner, "name", None) != "tensor.concat" or len(owner.operands) != 2:
        return None
    if any(_static_dims(x.type) is None for x in owner.operands):
        return None
    rank = ir.RankedTensorType(owner.results[0].type).rank
    if ir.IntegerAttr(owner.attributes["dim"]).value != rank - 2 or rank < 3:
        return None
    leading = ", ".join(str(i) for i in range(rank - 2))
    if collapse is not None and (
        str(collapse.attributes["reassociation"]) != f"[[{leading}], [{rank - 2}], [{rank - 1}]]"
    ):
        return None
    if (collapse is None) != (rank == 3):
        return None
    # Other users of the concat (or its collapse) would still need the copy: leave it to IREE.
    if len(list(owner.results[0].uses)) != 1:
        return None
    if collapse is not None and len(list(collapse.results[0].uses)) != 1:
        return None
    return _Concat(owner, collapse)


def find_attention(module: ir.Operation) -> list[AttentionMatch]:
    """Every `iree_linalg_ext.attention`, with the kernel it goes to or why it stays IREE's."""
    found = find_ops(module, lambda op: op.name == "iree_linalg_ext.attention")
    matches = []
    for op in found:
        operands = list(op.operands)
        maps = str(op.attributes["indexing_maps"])
        has_mask = maps == _MAPS_MASK and len(operands) == 6
        q, k, v, scale = operands[:4]
        dims = [_static_dims(x.type) for x in (q, k, v, op.results[0])]
        dtype = str(ir.RankedTensorType(q.type).element_type)
        shape = (0, 0, 0, 0)
        mask_ops: list[ir.Operation] = []
        reason = ""
        scale_value = _float_constant(scale)
        body = list(op.regions[0].blocks[0].operations) if op.regions else []
        if maps not in (_MAPS_NO_MASK, _MAPS_MASK) or (maps == _MAPS_MASK) != has_mask:
            reason = "layout is not Q [b, m, d], K [b, n, d], V [b, n, d]"
        elif any(d is None or len(d) != 3 for d in dims):
            reason = "shapes must be static, rank 3"
        elif dtype not in _TYPES or any(
            str(ir.RankedTensorType(x.type).element_type) != dtype for x in (k, v, op.results[0])
        ):
            reason = f"{dtype} attention: the kernel takes f16 or bf16 throughout"
        elif dims[0][2] not in _HEAD_DIMS or dims[1][2] != dims[0][2] or dims[2][2] != dims[0][2]:
            reason = f"head dim {dims[0][2]}: the kernel takes {_HEAD_DIMS} (Q, K, V equal)"
        elif scale_value is None:
            reason = "the scale is not a constant"
        elif [o.name for o in body] != ["iree_linalg_ext.yield"]:
            reason = "the scores are modified in the op's region"
        if not reason:
            shape = (dims[0][0], dims[0][1], dims[1][1], dims[0][2])
        # A mask: torch's causal mask (the flash kernel's `causal`), else, for decode, an
        # additive mask read by the split-KV kernel.
        mask = None
        if not reason and has_mask:
            mask_ops = _causal_mask(operands[4]) or []
            if not mask_ops:
                mask, reason = operands[4], _decode_mask_refusal(operands[4], shape, dtype)
        causal = has_mask and mask is None
        config: AttentionConfig | DecodeAttentionConfig | None = None
        kv_parts = None
        layouts = None
        heads = 1
        how = "matched"
        if reason:
            pass
        elif not causal and shape[1] <= MAX_QUERY_ROWS:
            # Decode: few query rows, many keys: split-KV; K and V each a concat of the same
            # two lengths (cache, new tokens) are read in their two parts.
            config = DecodeAttentionConfig(
                dtype, shape[3], scale=float(scale_value), masked=mask is not None
            )
            kc, vc = _concat_parts(k), _concat_parts(v)
            how = "matched (split-KV decode" + (", additive mask)" if mask else ")")
            if kc is not None and vc is not None and kc.lengths == vc.lengths:
                kv_parts = (kc, vc)
                how = how[:-1] + "; K, V read from the concat's two parts)"
        else:
            config = AttentionConfig(dtype, shape[3], causal=causal, scale=float(scale_value))
            layouts, heads = _layouts(q, k, v, op.results[0], shape[0])
            skipped = sum(bool(x.skipped) for x in layouts)
            if skipped:
                how = f"matched ({skipped} of Q, K, V, O read/written token-major: no transposes)"
        site = {
            "function": _function_name(op),
            "location": str(op.location),
            "op": "attention_masked" if mask else "attention_causal" if causal else "attention",
            # sizes as far as they are static, matched or not (the report's FLOPs and shapes)
            "m": _static_size(dims[0], 1),
            "n": _static_size(dims[0], 2),
            "k": _static_size(dims[1], 1),
            "batch": _static_size(dims[0], 0),
            "dtype": dtype,
            "out_dtype": dtype,
            "kernel": None if config is None else config.name,
            "reason": reason or how,
        }
        matches.append(
            AttentionMatch(site, config, op, shape, mask_ops, kv_parts, layouts, heads, mask)
        )
    return matches


def _static_size(dims: list[int] | None, axis: int) -> int | None:
    return dims[axis] if dims is not None and len(dims) == 3 else None


# A wrapper's name while its text is compared with the wrappers already made.
_NAME = "__plex_attention_wrapper"


def wrapper_text(name: str, kernel: CompiledKernel, match: AttentionMatch) -> str:
    """The kernel's wrapper: (Q, K, V) -> O in the layouts the kernel reads and writes; lengths
    and strides as i32 push constants, one workgroup per 128 query rows and batch-head."""
    assert match.config is not None and match.layouts is not None
    bh, sq, sk, _ = match.shape
    lq, lk, lv, lo = match.layouts
    t, kt, vt = (str(x.value.type) for x in (lq, lk, lv))  # type: ignore[union-attr]
    ot = str((lo.skipped[-1] if lo.skipped else match.op).results[0].type)
    offsets = [x.offset for x in match.layouts[:3]]
    strides = [match.heads, *offsets, *(v for x in match.layouts for v in x.strides(match.heads))]
    consts = "\n".join(f"  %s{i} = arith.constant {v} : i32" for i, v in enumerate(strides))
    names = ", ".join(f"%s{i}" for i in range(len(strides)))
    data = f'dense<"{_hex(kernel.cubin)}"> : vector<{len(kernel.cubin)}xi8>'
    binding = "#hal.pipeline.binding<storage_buffer"
    return f"""
util.func private @{name}(%q: {t}, %k: {kt}, %v: {vt}) -> {ot} {{
  %bh = arith.constant {bh} : index
  %sq = arith.constant {sq} : index
  %sq_i32 = arith.constant {sq} : i32
  %sk_i32 = arith.constant {sk} : i32
{consts}
  %r = hal.dispatch.extern "{kernel.name}"[%bh, %sq](%sq_i32, %sk_i32, {names}, %q, %k, %v)
      : (i32, i32, {", ".join(["i32"] * len(strides))}, {t}, {kt}, {vt}) -> {ot}
    count(%device: !hal.device, %wbh: index, %wsq: index) -> (index, index, index) {{
      %x = affine.apply affine_map<()[s0] -> (s0 ceildiv {match.config.block_m})>()[%wsq]
      %one = arith.constant 1 : index
      hal.return %x, %wbh, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = {2 + len(strides)}, bindings = [
      {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}>]>)
    objects({{
      #hal.executable.target<"cuda", "cuda-nvptx-fb"> ordinal(0) = [
        #hal.executable.object<{{path = "{kernel.name}.cubin", data = {data}}}>
      ]
    }})
    <{{workgroup_size = [{kernel.threads} : index, 1 : index, 1 : index],
       workgroup_local_memory = {kernel.shared_bytes} : index}}>
  util.return %r : {ot}
}}
"""


def _decode_call(
    m: AttentionMatch, kernels: dict[str, CompiledKernel]
) -> tuple[str, list[ir.Value]]:
    """The split-KV wrapper's text (named `_NAME`) and the call's operands (Q, K1, V1, K2,
    V2)."""
    assert isinstance(m.config, DecodeAttentionConfig)
    q, k, v = m.op.operands[:3]
    bh, sq, sk, _ = m.shape
    if m.kv_parts is None:
        k1, v1, k2, v2 = k, v, k, v
        n1, n2 = sk, 0
    else:
        kc, vc = m.kv_parts
        (k1, k2), (v1, v2) = kc.views(), vc.views()
        n1, n2 = kc.lengths
    types = (str(q.type), str(k1.type), str(k2.type), str(m.op.results[0].type))
    mask_type = None if m.mask is None else str(m.mask.type)
    text = _decode_attention.wrapper_text(
        _NAME, m.config, kernels, types, (bh, sq, n1, n2), mask_type
    )
    return text, [q, k1, v1, k2, v2] + ([] if m.mask is None else [m.mask])


def rewrite(
    module: ir.Operation, matches: list[AttentionMatch], kernels: dict[str, CompiledKernel]
) -> None:
    """Replace every matched attention op by a call of its kernel's wrapper (one wrapper per
    kernel config and operand types)."""
    body = module.regions[0].blocks[0]
    wrappers: dict[str, str] = {}  # wrapper text (named _NAME) -> its name in the module
    for m in (x for x in matches if x.config is not None):
        assert m.config is not None
        if isinstance(m.config, DecodeAttentionConfig):
            text, operands = _decode_call(m, kernels)
        else:
            assert m.layouts is not None
            text = wrapper_text(_NAME, kernels[m.config.name], m)
            operands = [x.value for x in m.layouts[:3]]
        name = wrappers.get(text)
        if name is None:
            name = wrappers[text] = f"__plex_attention_{len(wrappers)}_{m.config.name}"
            add_functions(body, text.replace(f"@{_NAME}(", f"@{name}(", 1))
        # O's transpose, when the kernel writes token-major, is what the call replaces; the
        # ops between it and the attention op go once unused (consumer first).
        after = m.layouts[3].skipped if m.layouts else ()
        replaced = after[-1] if after else m.op
        call_in_place_of(replaced, name, operands, location=m.op.location)
        for op in (*after[::-1], m.op):
            op.erase()
        for layout in m.layouts[:3] if m.layouts else ():  # Q, K, V reshapes, if now unused
            for op in layout.skipped:
                if not list(op.results[0].uses):
                    op.erase()
        for op in m.mask_ops:  # the mask's producers, last user first
            if not any(list(r.uses) for r in op.results):
                op.erase()
        for part in m.kv_parts or ():  # the concats, now unused: the cache is never copied
            for op in part.dead_ops():
                if not any(list(r.uses) for r in op.results):
                    op.erase()
