"""Kernel configs as tuning candidates on the H200: every candidate of kernel-config bundles
(`plex tune APP --device hopper --bundle B`, docs/tuning.md) against the library's own config and
torch eager (cuBLAS), per shape, with wall time AND kernel time, so that a kernel's gain shows
apart from the per-call overhead.

    python3 benchmarks/gpu/tunekern_h200.py BUNDLE [BUNDLE...] -o results.json [--rounds 7]

Per case (one matmul shape, one generated function): inputs ~N(0, 0.1) f16 made on the GPU by
torch and imported into IREE in place; outputs of every candidate against an fp32 reference;
wall time per call (each call waited for; rounds interleaved over the library's config, every
candidate and torch); kernel time per call from CUPTI (one torch.profiler session per case: the
kernels are named by their config, so each candidate's time is its kernel's). Profiles run after
all wall timings (a CUPTI session slows what runs after it in the same process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import myelin
from myelin.kernels._space import config_from_json
from myelin.runtime.tensors import import_cuda_tensor


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def wall_rounds(calls: dict, rounds: int, per_round_s: float = 0.03) -> dict:
    """Median and spread of the per-call wall time of each call, rounds interleaved."""
    reps = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        reps[name] = max(1, min(200, int(per_round_s / max(time.perf_counter() - start, 1e-6))))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(reps[name]):
                call()
                torch.cuda.synchronize()  # each call waited for, as PLeX's calls are
            samples[name].append((time.perf_counter() - start) / reps[name] * 1e3)
    out = {}
    for name, values in samples.items():
        median = statistics.median(values)
        out[name] = {"wall_ms": median, "wall_spread": (max(values) - min(values)) / median}
    return out


def kernel_times(calls: dict, repeat: int = 5) -> dict[str, float]:
    """GPU time per call of every kernel name, from one CUPTI session over all calls."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls.values():
            for _ in range(repeat):
                call()
            torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / repeat
    return per


def run_case(bundle_dir: Path, case: dict, rounds: int) -> dict:
    shape = case["shape"]
    a_shape, b_shape = (spec["shape"] for spec in case["inputs"])
    a = (torch.randn(a_shape, device="cuda") * 0.1).half()
    b = (torch.randn(b_shape, device="cuda") * 0.1).half()
    transposed = shape["op"] == "matmul_transpose_b"
    ref = a.float() @ (b.float().T if transposed else b.float())
    library = config_from_json(
        case["default"], shape["dtype"], shape["out_dtype"], transposed
    ).name  # the reference build's kernel: the library's own config
    entries = [(library, "reference.mln", None)] + [
        (c["config"], c["file"], c["choice"]) for c in case["candidates"]
    ]
    instance = myelin.Instance()
    calls, rows, models = {}, {}, []
    for name, file, choice in entries:
        model = instance.load(bundle_dir / file)
        models.append(model)
        fn = model.session().resolve(case["function"])
        a_dev = import_cuda_tensor(a, fn._device, fn.signature.inputs[0], case["function"])
        b_dev = import_cuda_tensor(b, fn._device, fn.signature.inputs[1], case["function"])
        y = torch.from_dlpack(fn(a_dev, b_dev, output="device"))
        label = "library" if choice is None else name
        rows[label] = {"config": choice, "kernel": name, "error": rel_error(y, ref)}
        del y
        calls[label] = lambda fn=fn, a_dev=a_dev, b_dev=b_dev: fn(a_dev, b_dev, output="device")
    torch_op = (lambda: torch.nn.functional.linear(a, b)) if transposed else (lambda: a @ b)
    rows["torch"] = {"error": rel_error(torch_op(), ref)}
    calls["torch"] = torch_op
    for label, timing in wall_rounds(calls, rounds).items():
        rows[label].update(timing)
    per_kernel = kernel_times(calls)
    torch_kernels = {
        k: v for k, v in per_kernel.items() if not k.startswith("plex_matmul")
    }  # cuBLAS's (and anything else torch launched)
    for label, row in rows.items():
        if label == "torch":
            row["kernel_ms"] = sum(torch_kernels.values())
            row["kernels"] = sorted(torch_kernels)
        else:
            row["kernel_ms"] = per_kernel.get(row["kernel"])
    for model in models:
        model.close()
    return {"dispatch": case["dispatch"], "shape": shape, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for bundle_dir in args.bundles:
        bundle = json.loads((bundle_dir / "bundle.json").read_text())
        for case in bundle["cases"]:
            try:
                result = run_case(bundle_dir, case, args.rounds)
            except Exception as e:  # one case's failure must not lose the others
                out["cases"].append({"dispatch": case["dispatch"], "error": repr(e)[:2000]})
                print(f"{case['dispatch']}: FAILED {e!r}", flush=True)
                continue
            result["app"] = bundle["app"]
            out["cases"].append(result)
            rows = result["rows"]
            ok = [r for k, r in rows.items() if k != "torch" and r["error"] < 5e-3]
            best = min(ok, key=lambda r: r["kernel_ms"] or 1e9, default=None)
            lib, t = rows["library"], rows["torch"]
            print(f"{result['dispatch']}: library {lib}, best {best}, torch {t}", flush=True)
            args.output.write_text(json.dumps(out, indent=1))  # a late failure keeps the rest
    args.output.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
