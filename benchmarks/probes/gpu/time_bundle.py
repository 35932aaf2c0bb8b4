"""The timing half of GPU tuning: runs where only iree-base-runtime (and torch, for the
comparison) is installed. Times every candidate of a bundle from `tune_bundle.py` interleaved
with IREE's default config (inputs resident on the GPU, warm-up, rounds, median and spread),
checks each candidate's outputs against the default's, and times torch on the same shapes.

    python3 benchmarks/probes/gpu/time_bundle.py benchmarks/gpu/tune_bundle -o $OUT [--rounds 5]

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
    ap.add_argument("--driver", default="cuda", help="IREE driver (local-task: check the script)")
    a = ap.parse_args()
    bundle = json.loads((a.bundle / "bundle.json").read_text())
    config = rt.Config(a.driver)
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
        # the weight-layout knob: a candidate storing the weight the other way reads it
        # transposed, as the build stores it (the encode step transposes at build time)
        layouts = [c.get("layout") for c in case["candidates"]]
        relaid = (
            [args[0], rt.asdevicearray(config.device, np.ascontiguousarray(host[1].T))]
            if any(lay != case.get("layout") for lay in layouts)
            else args
        )
        call_args = [args if lay == case.get("layout") else relaid for lay in layouts]
        ref_index = names.index("reference")
        want = fns[ref_index](*call_args[ref_index]).to_host()
        scale = float(np.max(np.abs(want)))
        ok = []
        for fn, fa in zip(fns, call_args, strict=True):
            got = fn(*fa).to_host()
            ok.append(bool(np.allclose(got, want, rtol=1e-3, atol=1e-3 * scale)))
        reps = []
        for fn, fa in zip(fns, call_args, strict=True):
            for _ in range(3):
                fn(*fa)
            t = time.perf_counter()
            fn(*fa)
            reps.append(max(1, int(a.round_s / max(time.perf_counter() - t, 1e-6))))
        samples: list[list[float]] = [[] for _ in fns]
        for _ in range(a.rounds):
            for i, fn in enumerate(fns):
                fa = call_args[i]
                t = time.perf_counter()
                for _ in range(reps[i]):
                    fn(*fa)
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
                    "layout": layouts[i],
                }
            )
        torch_ms = None
        if torch is not None:
            where = "cuda" if a.driver == "cuda" else "cpu"
            tx = [torch.from_numpy(x).to(where) for x in host]
            if name.startswith("matmul"):
                op = functools.partial(torch.mm, tx[0], tx[1])
            elif name.endswith("nk"):  # weight stored N x K, as torch stores Linear weights
                op = functools.partial(torch.nn.functional.linear, tx[0], tx[1])
            else:
                op = functools.partial(torch.matmul, tx[0], tx[1])
            for _ in range(5):
                op()
            sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
            sync()
            ts = []
            for _ in range(a.rounds):
                t = time.perf_counter()
                for _ in range(20):
                    op()
                sync()
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
        write(results, a.output)  # after every case: a late failure keeps the earlier ones
    print((a.output / "results.md").read_text())


def write(results: dict, output: Path) -> None:
    """results.json and results.md: per case the untuned build, the best candidate in the
    weight's own layout, and the best with the layout knob (either stored layout)."""
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"# {results['device']}, {results['date']}",
        "",
        "| case | untuned ms | best tuned, same layout | best tuned, layout knob (stored) | "
        "tuned vs untuned | torch ms | tuned vs torch |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in results["cases"].items():
        rows = c["rows"]
        ref = next(r for r in rows if r["name"] == "reference")
        ok = [r for r in rows if r["outputs_equal"]]
        best = min(ok, key=lambda r: r["ms"])
        same = min((r for r in ok if r["layout"] == ref["layout"]), key=lambda r: r["ms"])
        t = c["torch_ms"]
        lines.append(
            f"| {name} | {ref['ms']:.3f} ({ref['spread']:.0%}) | {same['ms']:.3f} "
            f"({same['spread']:.0%}) {same['name']} | {best['ms']:.3f} ({best['spread']:.0%}) "
            f"{best['name']} ({best['layout'] or '-'}) | {ref['ms'] / best['ms']:.2f}x | "
            + (f"{t[0]:.3f} | {t[0] / best['ms']:.2f}x |" if t else "- | - |")
        )
    (output / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
