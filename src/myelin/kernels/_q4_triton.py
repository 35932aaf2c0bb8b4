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
    # x [M, K] (f16/bf16); q [K, N / 2] bytes (the 4-bit codes, even column in the low nibble);
    # s [K / G, N] u8 and o [K / G, N] i8 (the group factors); rs, ro [N] f32 (the outputs');
    # part [K / KS, M, N] f32: this program's share of the contraction, summed by the caller.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    rows = offs_m < M
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    offs_e = tl.arange(0, G)
    acc_s = tl.zeros((BM, BN), dtype=tl.float32)
    acc_o = tl.zeros((BM, BN), dtype=tl.float32)
    for kk in range(0, KS, G):
        k0 = pid_s * KS + kk
        x = tl.load(
            x_ptr + offs_m[:, None] * K + (k0 + offs_e)[None, :], mask=rows[:, None], other=0.0
        )
        b = tl.load(q_ptr + (k0 + offs_e)[:, None] * (N // 2) + offs_h[None, :])
        lo = (b & 15).to(x.dtype)
        hi = (b >> 4).to(x.dtype)
        w = tl.reshape(tl.join(lo, hi), (G, BN))  # column 2j + t: nibble t of byte j
        p = tl.dot(x, w)  # the group's partial dot products, exact codes, f32 accumulation
        g = k0 // G
        s = tl.load(s_ptr + g * N + offs_n).to(tl.float32)
        o = tl.load(o_ptr + g * N + offs_n).to(tl.float32)
        xs = tl.sum(x.to(tl.float32), 1)
        acc_s += p * s[None, :]
        acc_o += xs[:, None] * o[None, :]
    rs = tl.load(rs_ptr + offs_n)
    ro = tl.load(ro_ptr + offs_n)
    out = acc_s * rs[None, :] + acc_o * ro[None, :]
    part = part_ptr + (pid_s * M + offs_m[:, None]) * N + offs_n[None, :]
    tl.store(part, out, mask=rows[:, None])
