"""llvm-cpu: IREE's default vs `--iree-llvmcpu-vector-pproc-strategy=peel`, f32 matmuls with a
static and a dynamic M, timed interleaved (warm-up, rounds, median and spread).

    .venv/bin/python benchmarks/probes/cpu_peel.py [--m 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SHAPES = ((384, 384), (384, 1536), (1536, 384))
PEEL = "--iree-llvmcpu-vector-pproc-strategy=peel"


def mlir(m: int | None, k: int, n: int) -> str:
    dim = "?" if m is None else str(m)
    dyn = f"%d = tensor.dim %x, %c0 : tensor<?x{k}xf32>\n    " if m is None else ""
    empty = "tensor.empty(%d)" if m is None else "tensor.empty()"
    c0 = "%c0 = arith.constant 0 : index\n    " if m is None else ""
    return f"""
func.func @mm(%x: tensor<{dim}x{k}xf32>, %w: tensor<{k}x{n}xf32>) -> tensor<{dim}x{n}xf32> {{
    {c0}{dyn}%z = arith.constant 0.0 : f32
    %e = {empty} : tensor<{dim}x{n}xf32>
    %f = linalg.fill ins(%z : f32) outs(%e : tensor<{dim}x{n}xf32>) -> tensor<{dim}x{n}xf32>
    %r = linalg.matmul ins(%x, %w : tensor<{dim}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%f : tensor<{dim}x{n}xf32>) -> tensor<{dim}x{n}xf32>
    return %r : tensor<{dim}x{n}xf32>
}}
"""  # noqa: E501


def main() -> None:
    import iree.compiler as ic
    import iree.runtime as rt

    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    base = [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ]
    config = rt.Config("local-task")
    rng = np.random.default_rng(0)
    print(f"M={a.m}, local-task (all cores), {a.rounds} interleaved rounds; ms median (spread)")
    print("| K -> N | M | default | peel flag | speedup |")
    print("|---|---|---|---|---|")
    for k, n in SHAPES:
        for static in (True, False):
            text = mlir(a.m if static else None, k, n)
            fns = []
            for extra in ([], [PEEL]):
                vmfb = ic.compile_str(text, extra_args=base + extra)
                ctx = rt.SystemContext(config=config)
                ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
                fns.append(ctx.modules.module["mm"])
            x = rng.standard_normal((a.m, k)).astype(np.float32)
            w = rng.standard_normal((k, n)).astype(np.float32)
            ref = fns[0](x, w).to_host()
            assert np.allclose(fns[1](x, w).to_host(), ref, rtol=1e-4, atol=1e-3)
            samples: list[list[float]] = [[], []]
            for f in fns:
                for _ in range(3):
                    f(x, w).to_host()
            for _ in range(a.rounds):
                for i, f in enumerate(fns):
                    t = time.perf_counter()
                    for _ in range(5):
                        f(x, w).to_host()
                    samples[i].append((time.perf_counter() - t) / 5 * 1e3)
            med = [statistics.median(s) for s in samples]
            spr = [(max(s) - min(s)) / statistics.median(s) for s in samples]
            print(
                f"| {k} -> {n} | {'static' if static else 'dynamic'} | {med[0]:.2f} ({spr[0]:.0%}) "
                f"| {med[1]:.2f} ({spr[1]:.0%}) | {med[0] / med[1]:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
