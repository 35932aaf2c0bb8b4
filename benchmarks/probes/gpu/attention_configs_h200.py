"""Kernel-level checks on the H200 with the GPU machine's own Triton JIT (no IREE): the split-KV
decode kernels in bf16 (Triton's interpreter cannot check bf16 here) and a sweep of matmul
configs of the library's kernel at the Llama-7B block's prefill shapes against cuBLAS.

    python3 benchmarks/probes/gpu/attention_configs_h200.py --json configs.json

The kernel sources are PLeX's (`myelin.kernels._triton._matmul_fn`, `_decode_triton`); only the
compiler differs from the build's (the GPU machine's Triton version is recorded), so the sweep
says which configs are worth building, and the block run with the built `.mln` says what they
give. Needs torch with CUDA and Triton (exits 0 with a note when Triton is missing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

# (M, N, K) of the block's prefill projections, x W^T as nn.Linear holds W: q/k/v/o, gate/up,
# down.
SHAPES = [(2048, 4096, 4096), (2048, 11008, 4096), (2048, 4096, 11008)]
# (BM, BN, BK, GROUP_M, warps, stages): the library's default first.
CONFIGS = [
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
    (128, 256, 64, 4, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 4),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 128, 8, 8, 3),
]


def bench(fn, reps: int = 50) -> float:
    """Median ms of `reps` timed calls (CUDA events), after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def decode_bf16(triton) -> dict:
    from myelin.kernels._decode_attention import (
        DecodeAttentionConfig,
        _combine_fn,
        _split_fn,
        combine_constants,
        split_constants,
    )

    split, combine = _split_fn(), _combine_fn()
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        for bh, m, n1, n2, d in ((256, 1, 2048, 1, 128), (64, 8, 1000, 5, 64)):
            g = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(bh, m, d, generator=g, device="cuda").to(dtype)
            k1, v1 = (torch.randn(bh, n1, d, generator=g, device="cuda").to(dtype) for _ in "kv")
            k2, v2 = (torch.randn(bh, n2, d, generator=g, device="cuda").to(dtype) for _ in "kv")
            name = "bf16" if dtype == torch.bfloat16 else "f16"
            c = DecodeAttentionConfig(name, d, d**-0.5)
            s = c.splits(n1 + n2)
            ws = torch.empty(c.workspace_elements(bh, m, n1 + n2), device="cuda")
            o = torch.full((bh, m, d), float("nan"), device="cuda", dtype=dtype)

            def run(q=q, k1=k1, v1=v1, k2=k2, v2=v2, ws=ws, o=o, s=s, c=c, sizes=(bh, m, n1, n2)):
                bh_, m_, n1_, n2_ = sizes
                split[(s, bh_)](q, k1, v1, k2, v2, ws, m_, n1_, n2_, **split_constants(c))
                combine[(bh_,)](ws, o, m_, s, **combine_constants(c))

            run()
            keys, values = torch.cat((k1, k2), 1), torch.cat((v1, v2), 1)
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float()[None], keys.float()[None], values.float()[None]
            )[0]
            eager = torch.nn.functional.scaled_dot_product_attention(
                q[None], keys[None], values[None]
            )[0]
            key = f"{name}_bh{bh}_m{m}_n{n1}+{n2}_d{d}"
            out[key] = {
                "error_vs_fp32": float((o.float() - ref).norm() / ref.norm()),
                "torch_error_vs_fp32": float((eager.float() - ref).norm() / ref.norm()),
                "kernel_ms": bench(run),
                "bytes_read_MB": 2 * bh * (n1 + n2) * d * q.element_size() / 1e6,
            }
            print(key, json.dumps(out[key]), flush=True)
    return out


def matmul_sweep(triton) -> dict:
    from myelin.kernels._triton import _matmul_fn

    fn = _matmul_fn()
    out: dict = {}
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = (torch.randn(m, k, generator=g, device="cuda") * 0.05).half()
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.05).half()
        ref = torch.nn.functional.linear(a, w)
        row = {"cublas_ms": bench(lambda a=a, w=w: torch.nn.functional.linear(a, w))}
        for bm, bn, bk, gm, warps, stages in CONFIGS:
            c = torch.empty(m, n, device="cuda", dtype=torch.float16)
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

            def run(a=a, w=w, c=c, grid=grid, mnk=(m, n, k), cfg=(bm, bn, bk, gm, warps, stages)):
                bm_, bn_, bk_, gm_, nw, ns = cfg
                fn[grid](a, w, c, *mnk, BM=bm_, BN=bn_, BK=bk_, GROUP_M=gm_, B_T=True,
                         num_warps=nw, num_stages=ns)  # fmt: skip

            name = f"{bm}x{bn}x{bk}_g{gm}_w{warps}s{stages}"
            try:
                run()
                err = float((c.float() - ref.float()).norm() / ref.float().norm())
                row[name] = {"ms": bench(run), "diff_vs_cublas": err}
            except Exception as e:  # a config that does not fit (shared memory) is a result too
                row[name] = {"error": str(e).splitlines()[0][:200]}
            print(f"{m}x{n}x{k}", name, row[name], f"cublas {row['cublas_ms']:.4f}", flush=True)
        out[f"{m}x{n}x{k}"] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="attention_configs_h200.json")
    args = p.parse_args()
    try:
        import triton
    except ImportError:
        print("no Triton on this machine: nothing to run")
        return
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "decode_attention": decode_bf16(triton),
        "matmul_configs": matmul_sweep(triton),
    }
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
