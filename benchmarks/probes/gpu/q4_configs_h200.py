"""The q4 kernel's configs on the H200, for the skinny-M decode matmuls (M = 1 and 8) of the
Llama-7B-shaped decoder. Variants: "group", the library's kernel (myelin.kernels._q4: one dot
per 32-element group on the exact codes); "block", a block of BK contracted rows decoded to f16
(code * scale + offset), one dot per block; "swap", out^T = W^T x^T (the weight's outputs on
the dot's wide side, even and odd columns as two dots, no interleave, one dot per group on the
exact codes). Over BN, BK, split-K, warps and stages. Triton JIT on the GPU machine (sizes as
runtime arguments, so one compile serves every shape), inputs made by torch; each kernel's time
by `triton.testing.do_bench` (median, L2 flushed between calls, as a decode step reads its
weights once), plus the time of the sum of the split-K shares (torch) where split > 1; every
result against an f32 reference on the decoded weights.

    python3 benchmarks/probes/gpu/q4_configs_h200.py --json OUT.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch

SHAPES = [
    (4096, 4096),
    (11008, 4096),
    (4096, 11008),
    (32000, 4096),
]  # (N, K): qkvo, gate/up, down, head
G = 32
WARPS_STAGES = ((4, 3), (4, 4), (8, 3))


def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def q4_block(
        x_ptr, q_ptr, s_ptr, o_ptr, rs_ptr, ro_ptr, part_ptr, M, N, K, KS,
        G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        offs_m = tl.arange(0, BM)
        rows = offs_m < M
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_h = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        offs_k = tl.arange(0, BK)
        offs_g = tl.arange(0, BK // G)
        rs = tl.load(rs_ptr + offs_n)
        ro = tl.load(ro_ptr + offs_n)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(0, KS, BK):
            k0 = pid_s * KS + kk
            x = tl.load(
                x_ptr + offs_m[:, None] * K + (k0 + offs_k)[None, :], mask=rows[:, None], other=0.0
            )
            b = tl.load(q_ptr + (k0 + offs_k)[:, None] * (N // 2) + offs_h[None, :])
            g0 = k0 // G
            s = tl.load(s_ptr + (g0 + offs_g)[:, None] * N + offs_n[None, :]).to(tl.float32)
            o = tl.load(o_ptr + (g0 + offs_g)[:, None] * N + offs_n[None, :]).to(tl.float32)
            s = (s * rs[None, :]).to(x.dtype)
            o = (o * ro[None, :]).to(x.dtype)
            lo = (b & 15).to(x.dtype)
            hi = (b >> 4).to(x.dtype)
            q = tl.reshape(tl.join(lo, hi), (BK // G, G, BN))
            w = q * s[:, None, :] + o[:, None, :]
            acc += tl.dot(x, tl.reshape(w, (BK, BN)))
        part = part_ptr + (pid_s * M + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(part, acc, mask=rows[:, None])

    @triton.jit
    def q4_group(
        x_ptr, q_ptr, s_ptr, o_ptr, rs_ptr, ro_ptr, part_ptr, M, N, K, KS,
        G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        # the library kernel's body (myelin.kernels._q4_triton) with runtime sizes
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
            w = tl.reshape(tl.join(lo, hi), (G, BN))
            p = tl.dot(x, w)
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

    @triton.jit
    def q4_swap(
        x_ptr, q_ptr, s_ptr, o_ptr, rs_ptr, ro_ptr, part_ptr, M, N, K, KS,
        G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        # out^T = W^T x^T: the weight's outputs on the dot's M side (64+ rows: Hopper's wgmma),
        # the few activation rows on its N side; the even and the odd output columns (the low
        # and the high nibbles) as two dots, no interleave; BK // G groups per iteration, each
        # its own dot on the exact codes, its factors applied to the f32 partial products.
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        H: tl.constexpr = BN // 2
        offs_j = pid_n * H + tl.arange(0, H)
        offs_m = tl.arange(0, BM)
        rows = offs_m < M
        offs_e = tl.arange(0, G)
        acc_e = tl.zeros((H, BM), dtype=tl.float32)
        acc_h = tl.zeros((H, BM), dtype=tl.float32)
        off_e = tl.zeros((H, BM), dtype=tl.float32)
        off_h = tl.zeros((H, BM), dtype=tl.float32)
        for kk in range(0, KS, BK):
            for t in tl.static_range(BK // G):
                k0 = pid_s * KS + kk + t * G
                xt = tl.load(
                    x_ptr + offs_m[None, :] * K + (k0 + offs_e)[:, None],
                    mask=rows[None, :], other=0.0,
                )  # fmt: skip
                b = tl.load(q_ptr + (k0 + offs_e)[None, :] * (N // 2) + offs_j[:, None])
                lo = (b & 15).to(xt.dtype)
                hi = (b >> 4).to(xt.dtype)
                g = (k0 // G) * N + 2 * offs_j
                s_e = tl.load(s_ptr + g).to(tl.float32)
                s_h = tl.load(s_ptr + g + 1).to(tl.float32)
                o_e = tl.load(o_ptr + g).to(tl.float32)
                o_h = tl.load(o_ptr + g + 1).to(tl.float32)
                xs = tl.sum(xt.to(tl.float32), 0)
                acc_e += tl.dot(lo, xt) * s_e[:, None]
                acc_h += tl.dot(hi, xt) * s_h[:, None]
                off_e += o_e[:, None] * xs[None, :]
                off_h += o_h[:, None] * xs[None, :]
        c = 2 * offs_j
        out_e = acc_e * tl.load(rs_ptr + c)[:, None] + off_e * tl.load(ro_ptr + c)[:, None]
        out_h = acc_h * tl.load(rs_ptr + c + 1)[:, None] + off_h * tl.load(ro_ptr + c + 1)[:, None]
        part = part_ptr + (pid_s * M + offs_m[None, :]) * N + c[:, None]
        tl.store(part, out_e, mask=rows[None, :])
        tl.store(part + 1, out_h, mask=rows[None, :])

    return {"block": q4_block, "group": q4_group, "swap": q4_swap}


def inputs(n: int, k: int, dev: str = "cuda"):
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randint(0, 256, (k, n // 2), dtype=torch.uint8, device=dev, generator=g)
    s = torch.randint(1, 256, (k // G, n), dtype=torch.uint8, device=dev, generator=g)
    o = torch.randint(-127, 128, (k // G, n), dtype=torch.int8, device=dev, generator=g)
    rs = torch.rand(n, device=dev, generator=g) * 1e-3
    ro = torch.rand(n, device=dev, generator=g) * 1e-3
    codes = torch.stack([q & 15, q >> 4], dim=-1).reshape(k, n).float()
    w = codes * (s.float() * rs).repeat_interleave(G, 0) + (o.float() * ro).repeat_interleave(G, 0)
    return q, s, o, rs, ro, w


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    import triton
    from triton.testing import do_bench

    fns = kernels()
    configs = [("group", bn, G, 4, 4, None) for bn in (64, 128)]
    configs += [("block", 256, 64, 4, 3, None)]
    configs += [
        ("swap", bn, bk, w, st, None)
        for bn, bk, (w, st) in itertools.product((128, 256), (32, 64, 128), WARPS_STAGES)
    ]
    sums: dict = {}
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "cases": []}
    for n, k in SHAPES:
        q, s, o, rs, ro, w = inputs(n, k)
        for m in (8, 1):
            x = (torch.randn(m, k, device="cuda") * 0.5).half()
            want = x.float() @ w
            best = None
            for kind, bn, bk, warps, stages, _ in configs:
                blocks = n // bn
                for split in (1, 2, 4, 8, 16, 32):
                    ks = k // split
                    if ks % bk or ks < bk or k % split or blocks * split > 4096:
                        continue
                    if blocks * split < 132 or (split > 1 and blocks * split // 2 >= 1056):
                        continue
                    part = torch.empty(split, m, n, device="cuda")

                    run = functools.partial(
                        fns[kind][(blocks, split)], x, q, s, o, rs, ro, part, m, n, k, ks,
                        G=G, BM=16, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
                    )  # fmt: skip
                    try:
                        run()
                        torch.cuda.synchronize()
                        got = part.sum(0)
                        err = float((got - want).abs().max() / want.abs().max())
                        ms = do_bench(run, warmup=5, rep=20, return_mode="median")
                        if (split, m, n) not in sums:
                            sums[split, m, n] = (
                                do_bench(lambda part=part: part.sum(0), warmup=5, rep=20,
                                         return_mode="median")
                                if split > 1 else 0.0
                            )  # fmt: skip
                        sum_ms = sums[split, m, n]
                    except Exception as e:  # a config that does not fit is a result too
                        print(n, k, m, kind, bn, bk, warps, stages, split, "error", str(e)[:120])
                        continue
                    row = {
                        "m": m, "n": n, "k": k, "kind": kind, "bn": bn, "bk": bk,
                        "warps": warps, "stages": stages, "split": split,
                        "kernel_us": ms * 1e3, "sum_us": sum_ms * 1e3, "err": err,
                        "GBps": (q.numel() + s.numel() + o.numel()) / ms / 1e6,
                    }  # fmt: skip
                    out["cases"].append(row)
                    if best is None or row["kernel_us"] < best["kernel_us"]:
                        best = row
            print("best", json.dumps(best), flush=True)
            group = [
                r for r in out["cases"] if r["m"] == m and r["n"] == n and r["kind"] == "group"
            ]
            for r in sorted(group, key=lambda r: r["kernel_us"])[:3]:
                print("group", json.dumps(r), flush=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
