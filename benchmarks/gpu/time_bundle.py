"""The timing half of GPU tuning: runs where only iree-base-runtime (and torch, for the
comparison) is installed. Times every candidate of a bundle from `tune_bundle.py` interleaved
with IREE's default config (inputs resident on the GPU, warm-up, rounds, median and spread),
checks each candidate's outputs against the default's, and times torch on the same shapes.

    python3 benchmarks/gpu/time_bundle.py benchmarks/gpu/tune_bundle -o $OUT [--rounds 5]

Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from datetime import date
from pathlib import Path

import numpy as np


def median_spread(values: list[float]) -> tuple[float, float]:
    m = statistics.median(values)
    return m, (max(values) - min(values)) / m


def main() -> None:
    import iree.runtime as rt

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-s", type=float, default=0.05)
    a = ap.parse_args()
    bundle = json.loads((a.bundle / "bundle.json").read_text())
    config = rt.Config("cuda")
    rng = np.random.default_rng(0)
    results: dict = {"date": date.today().isoformat(), "cases": {}}
    try:
        import torch

        results["device"] = torch.cuda.get_device_name(0)
    except Exception as e:  # torch is only the comparison
        torch = None
        results["device"] = f"unknown ({e})"
    for name, case in bundle["cases"].items():
        host = [(rng.standard_normal(s) * 0.1).astype(np.float16) for s in case["inputs"]]
        fns, names, configs = [], [], []
        for cand in case["candidates"]:
            ctx = rt.SystemContext(config=config)
            vmfb = (a.bundle / cand["file"]).read_bytes()
            ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
            fns.append(ctx.modules.module["main"])
            names.append(cand["name"])
            configs.append(cand["config"])
        args = [rt.asdevicearray(config.device, x) for x in host]
        ref_index = names.index("reference")
        want = fns[ref_index](*args).to_host()
        scale = float(np.max(np.abs(want)))
        ok = []
        for fn in fns:
            got = fn(*args).to_host()
            ok.append(bool(np.allclose(got, want, rtol=1e-3, atol=1e-3 * scale)))
        reps = []
        for fn in fns:
            for _ in range(3):
                fn(*args)
            t = time.perf_counter()
            fn(*args)
            reps.append(max(1, int(a.round_s / max(time.perf_counter() - t, 1e-6))))
        samples: list[list[float]] = [[] for _ in fns]
        for _ in range(a.rounds):
            for i, fn in enumerate(fns):
                t = time.perf_counter()
                for _ in range(reps[i]):
                    fn(*args)
                samples[i].append((time.perf_counter() - t) / reps[i] * 1e3)
        rows = []
        for i, n in enumerate(names):
            med, spread = median_spread(samples[i])
            rows.append(
                {
                    "name": n,
                    "ms": med,
                    "spread": spread,
                    "outputs_equal": ok[i],
                    "config": configs[i],
                }
            )
        torch_ms = None
        if torch is not None:
            tx = [torch.from_numpy(x).cuda() for x in host]
            if name.startswith("matmul"):
                op = functools.partial(torch.mm, tx[0], tx[1])
            elif name.endswith("nk"):  # weight stored N x K, as torch stores Linear weights
                op = functools.partial(torch.nn.functional.linear, tx[0], tx[1])
            else:
                op = functools.partial(torch.matmul, tx[0], tx[1])
            for _ in range(5):
                op()
            torch.cuda.synchronize()
            ts = []
            for _ in range(a.rounds):
                t = time.perf_counter()
                for _ in range(20):
                    op()
                torch.cuda.synchronize()
                ts.append((time.perf_counter() - t) / 20 * 1e3)
            torch_ms = median_spread(ts)
        results["cases"][name] = {"rows": rows, "torch_ms": torch_ms}
        ref = rows[ref_index]["ms"]
        best = min((r for r in rows if r["outputs_equal"]), key=lambda r: r["ms"])
        tm = f"{torch_ms[0]:.3f}" if torch_ms else "-"
        print(
            f"{name}: untuned {ref:.3f} ms, best {best['name']} {best['ms']:.3f} ms "
            f"({ref / best['ms']:.2f}x), torch {tm} ms",
            flush=True,
        )
    a.output.mkdir(parents=True, exist_ok=True)
    (a.output / "results.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"# {results['device']}, {results['date']}",
        "",
        "| case | untuned ms | tuned ms (best) | tuned vs untuned | torch ms | tuned vs torch |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in results["cases"].items():
        rows = c["rows"]
        ref = next(r for r in rows if r["name"] == "reference")
        best = min((r for r in rows if r["outputs_equal"]), key=lambda r: r["ms"])
        t = c["torch_ms"]
        lines.append(
            f"| {name} | {ref['ms']:.3f} ({ref['spread']:.0%}) | {best['ms']:.3f} "
            f"({best['spread']:.0%}) {best['name']} | {ref['ms'] / best['ms']:.2f}x | "
            + (f"{t[0]:.3f} | {t[0] / best['ms']:.2f}x |" if t else "- | - |")
        )
    (a.output / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
