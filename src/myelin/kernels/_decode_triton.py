"""The split-KV decode attention kernels' Triton source (`_decode_attention` says what they do).

A module of its own, imported only when a build compiles them: Triton is a build-time extra, and
the kernel calls a `@triton.jit` helper, which Triton (and its interpreter) resolve among the
module's globals.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # the mask is in natural-log units, the scores in log2


@triton.jit
def attend(q, k_ptr, v_ptr, mask_ptr, lo, hi, m_i, l_i, acc, rows, MASK_SR,
           D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, QK_SCALE: tl.constexpr,
           HAS_MASK: tl.constexpr):  # fmt: skip
    """The online softmax over keys [lo, hi) of one part (K, V [n, D] at k_ptr, v_ptr; with
    HAS_MASK, the additive mask of those keys at mask_ptr, MASK_SR elements between rows)."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    offs_m = tl.arange(0, BM)
    for start in range(lo, hi, BN):
        cols = start + offs_n
        valid = cols < hi
        k = tl.load(k_ptr + cols[None, :] * D + offs_d[:, None], mask=valid[None, :], other=0.0)
        s = tl.dot(q, k) * QK_SCALE  # log2 units
        if HAS_MASK:
            bias = tl.load(
                mask_ptr + offs_m[:, None] * MASK_SR + cols[None, :],
                mask=rows[:, None] & valid[None, :],
                other=0.0,
            )
            s += bias.to(tl.float32) * LOG2E
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = m_new
        if HAS_MASK:  # every key masked so far: subtract 0, not -inf (-inf - -inf is NaN)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + cols[:, None] * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def plex_decode_attention(
    q_ptr, k1_ptr, v1_ptr, k2_ptr, v2_ptr, mask_ptr, ws_ptr, M, N1, N2,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
    QK_SCALE: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    # mask_ptr: with HAS_MASK, the additive mask [bh, M, N1 + N2] (f16/bf16; -inf hides a key);
    # without, a constexpr None (no parameter).
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n_splits = tl.num_programs(0).to(tl.int64)
    n_bh = tl.num_programs(1).to(tl.int64)
    offs_m = tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rows = offs_m < M
    q = tl.load(
        q_ptr + bh * M * D + offs_m[:, None] * D + offs_d[None, :],
        mask=rows[:, None],
        other=0.0,
    )
    # This program's keys [lo, hi) of the N1 + N2: the part in K1, then the part in K2.
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, N1 + N2)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    mask1 = mask_ptr
    mask2 = mask_ptr
    if HAS_MASK:  # the part-2 keys' mask columns follow part 1's
        mask1 = mask_ptr + bh * M * (N1 + N2)
        mask2 = mask1 + N1
    m_i, l_i, acc = attend(
        q, k1_ptr + bh * N1 * D, v1_ptr + bh * N1 * D, mask1, lo, tl.minimum(hi, N1),
        m_i, l_i, acc, rows, N1 + N2, D, BM, BN, QK_SCALE, HAS_MASK,
    )  # fmt: skip
    m_i, l_i, acc = attend(
        q, k2_ptr + bh * N2 * D, v2_ptr + bh * N2 * D, mask2, tl.maximum(lo, N1) - N1, hi - N1,
        m_i, l_i, acc, rows, N1 + N2, D, BM, BN, QK_SCALE, HAS_MASK,
    )  # fmt: skip
    row = (bh * n_splits + split) * M + offs_m
    lse_base = n_bh * n_splits * M * D
    tl.store(ws_ptr + lse_base + row, m_i + tl.math.log2(l_i), mask=rows)
    if HAS_MASK:  # a chunk with every key masked: output 0, log-sum-exp -inf (weight 0)
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    part = ws_ptr + row[:, None] * D + offs_d[None, :]
    tl.store(part, acc / l_i[:, None], mask=rows[:, None])


@triton.jit
def plex_decode_combine(ws_ptr, o_ptr, M, S, D: tl.constexpr, BM: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    n_bh = tl.num_programs(0).to(tl.int64)
    offs_m = tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rows = offs_m < M
    lse_base = n_bh * S * M * D
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for s in range(0, S):
        row = (bh * S + s) * M + offs_m
        lse = tl.load(ws_ptr + lse_base + row, mask=rows, other=0.0)
        o = tl.load(ws_ptr + row[:, None] * D + offs_d[None, :], mask=rows[:, None], other=0.0)
        m_new = tl.maximum(m_i, lse)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # chunks masked whole: lse -inf
        alpha = tl.math.exp2(m_i - m_sub)
        w = tl.math.exp2(lse - m_sub)
        l_i = l_i * alpha + w
        acc = acc * alpha[:, None] + o * w[:, None]
        m_i = m_new
    out = o_ptr + bh * M * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(out, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=rows[:, None])
