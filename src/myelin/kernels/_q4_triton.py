"""The q4 skinny-M matmul kernel's Triton source (`_q4` says what it does and how it is used).

A module of its own, imported only when a build compiles it: Triton is a build-time extra.
"""

import triton
import triton.language as tl


@triton.jit
def plex_q4_matmul(
    x_ptr, q_ptr, s_ptr, o_ptr, rs_ptr, ro_ptr, part_ptr, M,
    N: tl.constexpr, K: tl.constexpr, KS: tl.constexpr, G: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    # x [M, K] (f16/bf16); the codec's blocks of BN outputs (myelin.codecs._cpu_kernels.
    # Q4_BLOCKS; this program reads block pid_n): q [N / BN, K, BN / 2] bytes (the 4-bit codes,
    # even column in the low nibble), s [N / BN, K / G, BN] u8 and o [N / BN, K / G, BN] i8 (the
    # group factors); rs, ro [N] f32 (the outputs'); part [K / KS, M, N] f32: this program's
    # share of the contraction, summed by the caller.
    # Computed transposed, out^T = W^T x^T: the BN / 2 outputs of each nibble on the dot's wide
    # side, the few activation rows on its narrow side; the low nibbles (even outputs) and the
    # high ones (odd outputs) as two dots, so the codes are never interleaved.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    H: tl.constexpr = BN // 2
    offs_b = tl.arange(0, H)  # byte columns of the block: its outputs 2j and 2j + 1
    offs_j = pid_n * H + offs_b
    q_block = q_ptr + pid_n * (K * H)
    f_block = pid_n * ((K // G) * BN)
    offs_m = tl.arange(0, BM)
    rows = offs_m < M
    offs_e = tl.arange(0, G)
    acc_lo = tl.zeros((H, BM), dtype=tl.float32)
    acc_hi = tl.zeros((H, BM), dtype=tl.float32)
    off_lo = tl.zeros((H, BM), dtype=tl.float32)
    off_hi = tl.zeros((H, BM), dtype=tl.float32)
    for kk in range(0, KS, G):
        k0 = pid_s * KS + kk
        xt = tl.load(
            x_ptr + offs_m[None, :] * K + (k0 + offs_e)[:, None], mask=rows[None, :], other=0.0
        )  # [G, BM]
        b = tl.load(q_block + (k0 + offs_e)[None, :] * H + offs_b[:, None])  # [H, G]
        g = f_block + (k0 // G) * BN + 2 * offs_b
        s_lo = tl.load(s_ptr + g).to(tl.float32)
        s_hi = tl.load(s_ptr + g + 1).to(tl.float32)
        o_lo = tl.load(o_ptr + g).to(tl.float32)
        o_hi = tl.load(o_ptr + g + 1).to(tl.float32)
        xs = tl.sum(xt.to(tl.float32), 0)  # the group's activation sums
        # the group's partial dot products on the exact codes (0..15), f32 accumulation
        acc_lo += tl.dot((b & 15).to(xt.dtype), xt) * s_lo[:, None]
        acc_hi += tl.dot((b >> 4).to(xt.dtype), xt) * s_hi[:, None]
        off_lo += o_lo[:, None] * xs[None, :]
        off_hi += o_hi[:, None] * xs[None, :]
    c = 2 * offs_j
    out_lo = acc_lo * tl.load(rs_ptr + c)[:, None] + off_lo * tl.load(ro_ptr + c)[:, None]
    out_hi = acc_hi * tl.load(rs_ptr + c + 1)[:, None] + off_hi * tl.load(ro_ptr + c + 1)[:, None]
    part = part_ptr + (pid_s * M + offs_m[None, :]) * N + c[:, None]
    tl.store(part, out_lo, mask=rows[None, :])
    tl.store(part + 1, out_hi, mask=rows[None, :])
