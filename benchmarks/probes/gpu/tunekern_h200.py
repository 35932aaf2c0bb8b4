"""Kernel configs as tuning candidates on the H200: every candidate of kernel-config bundles
(`plex tune APP --device hopper --bundle B`, docs/tuning.md) against the library's own config and
torch eager (cuBLAS), per shape, with wall time AND kernel time, so that a kernel's gain shows
apart from the per-call overhead.

    python3 benchmarks/probes/gpu/tunekern_h200.py BUNDLE [BUNDLE...] -o results.json [--rounds 7]
        [--codegen tunekern-codegen.mln]

Per case (one matmul shape, one generated function): inputs ~N(0, 0.1) f16 made on the GPU by
torch and imported into IREE in place; outputs of every candidate against an fp32 reference;
wall time per call (each call waited for; rounds interleaved over the library's config, every
candidate and torch); kernel time per call from CUPTI (one torch.profiler session per case: the
kernels are named by their config, so each candidate's time is its kernel's); with --codegen,
the same functions on IREE's own untuned code (`tunekern/codegen/app.toml`, for the tunekern app's
bundle), issue 17's "untuned" baseline. Profiles run after
all wall timings (a CUPTI session slows what runs after it in the same process).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import myelin
from myelin.kernels._space import config_from_json
from myelin.runtime.tensors import import_cuda_tensor


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def wall_rounds(calls: dict, rounds: int, per_round_s: float = 0.02) -> dict:
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


def run_case(
    bundle_dir: Path, case: dict, rounds: int, codegen: tuple[Path, str] | None = None
) -> dict:
    """One shape: `codegen` is (the IREE-codegen build, its function for this shape)."""
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
    lib_y, failed = None, {}
    for name, file, choice in entries:
        try:
            model = instance.load(bundle_dir / file)
            models.append(model)
            fn = model.session().resolve(case["function"])
            a_dev = import_cuda_tensor(a, fn._device, fn.signature.inputs[0], case["function"])
            b_dev = import_cuda_tensor(b, fn._device, fn.signature.inputs[1], case["function"])
            y = torch.from_numpy(np.asarray(fn(a_dev, b_dev))).to("cuda")
        except Exception as e:  # a candidate that cannot run is a result
            if choice is None:
                raise
            failed[name] = repr(e)[:500]
            continue
        label = "library" if choice is None else name
        lib_y = y if choice is None else lib_y
        rows[label] = {
            "config": choice,
            "kernel": name,
            "error": rel_error(y, ref),
            "vs_library": rel_error(y, lib_y),
        }
        del y
        calls[label] = lambda fn=fn, a_dev=a_dev, b_dev=b_dev: fn(a_dev, b_dev, output="device")
    baseline = {}
    if codegen is not None:  # IREE's own code for the same function, untuned (sm_80 PTX)
        model = instance.load(codegen[0])
        models.append(model)
        fn = model.session().resolve(codegen[1])
        a_dev = import_cuda_tensor(a, fn._device, fn.signature.inputs[0], codegen[1])
        b_dev = import_cuda_tensor(b, fn._device, fn.signature.inputs[1], codegen[1])
        y = torch.from_numpy(np.asarray(fn(a_dev, b_dev))).to("cuda")
        rows["iree_codegen"] = {"config": None, "kernel": None, "error": rel_error(y, ref)}
        del y
        baseline["iree_codegen"] = lambda fn=fn, a_dev=a_dev, b_dev=b_dev: fn(
            a_dev, b_dev, output="device"
        )
    torch_op = (lambda: torch.nn.functional.linear(a, b)) if transposed else (lambda: a @ b)
    rows["torch"] = {"error": rel_error(torch_op(), ref)}
    calls["torch"] = torch_op
    for label, timing in wall_rounds({**calls, **baseline}, rounds).items():
        rows[label].update(timing)
    per_kernel = kernel_times(calls)
    if baseline:  # a session of its own: its dispatches are not named by a config
        rows["iree_codegen"]["kernel_ms"] = sum(kernel_times(baseline).values())
    torch_kernels = {
        k: v for k, v in per_kernel.items() if not k.startswith("plex_matmul")
    }  # cuBLAS's (and anything else torch launched)
    for label, row in rows.items():
        if label == "torch":
            row["kernel_ms"] = sum(torch_kernels.values())
            row["kernels"] = sorted(torch_kernels)
        elif label != "iree_codegen":
            row["kernel_ms"] = per_kernel.get(row["kernel"])
    for model in models:
        with contextlib.suppress(Exception):  # sessions still open: the process ends soon
            model.close()
    return {"dispatch": case["dispatch"], "shape": shape, "rows": rows, "failed": failed}


def time_bundle_results(bundle: dict, cases: list[dict]) -> dict:
    """The measured cases in `myelin.tuning.time_bundle`'s results format (wall time relative
    to the library's config; ok when the output is the library's up to the case's rtol), so
    that `plex tune --collect` can take them."""
    references, rows = {}, {}
    by_dispatch = {c["dispatch"]: c for c in cases if "rows" in c}
    for case in bundle["cases"]:
        measured = by_dispatch.get(case["dispatch"])
        if measured is None:
            continue
        lib = measured["rows"]["library"]
        references[case["dispatch"]] = {
            "median_s": lib["wall_ms"] / 1e3,
            "spread": lib["wall_spread"],
            "kernel_s": None if lib["kernel_ms"] is None else lib["kernel_ms"] / 1e3,
        }
        for cand in case["candidates"]:
            row = measured["rows"].get(cand["config"])
            if cand["config"] in measured.get("failed", {}):
                rows[cand["name"]] = {"status": "failed: " + measured["failed"][cand["config"]]}
            elif row is None:
                rows[cand["name"]] = {"status": "not timed"}
            elif row["vs_library"] > 2 * case["rtol"]:
                rows[cand["name"]] = {"status": "mismatch"}
            else:
                rows[cand["name"]] = {
                    "status": "ok",
                    "median_s": row["wall_ms"] / 1e3,
                    "spread": row["wall_spread"],
                    "relative": row["wall_ms"] / lib["wall_ms"],
                    "kernel_s": None if row["kernel_ms"] is None else row["kernel_ms"] / 1e3,
                    "kernel_relative": None
                    if not (row["kernel_ms"] and lib["kernel_ms"])
                    else row["kernel_ms"] / lib["kernel_ms"],
                }
    return {"references": references, "candidates": rows, "bundle": bundle, "by": __file__}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--results", type=Path, help="also write <bundle>-results.json here")
    p.add_argument(
        "--codegen", type=Path, help="the same app built without kernels (IREE's codegen)"
    )
    p.add_argument(
        "--codegen-functions",
        default="matmul,gemv_nk,gemv_kn",
        help="the codegen build's function per case of the tunekern bundle, in order",
    )
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for bundle_dir in args.bundles:
        bundle = json.loads((bundle_dir / "bundle.json").read_text())
        cases: list[dict] = []
        for index, case in enumerate(bundle["cases"]):
            try:
                # the generated app's functions are s0, s1, ... in the app's order of shapes;
                # the codegen build has the app's own names
                names = args.codegen_functions.split(",")
                codegen = (
                    (args.codegen, names[index])
                    if args.codegen is not None and bundle["app"] == "tunekern-bench"
                    else None
                )
                result = run_case(bundle_dir, case, args.rounds, codegen)
            except Exception as e:  # one case's failure must not lose the others
                out["cases"].append({"dispatch": case["dispatch"], "error": repr(e)[:2000]})
                print(f"{case['dispatch']}: FAILED {e!r}", flush=True)
                continue
            result["app"] = bundle["app"]
            out["cases"].append(result)
            cases.append(result)
            rows = result["rows"]
            ok = [r for k, r in rows.items() if k != "torch" and r["error"] < 5e-3]
            best = min(ok, key=lambda r: r["kernel_ms"] or 1e9, default=None)
            lib, t = rows["library"], rows["torch"]
            print(
                f"{result['dispatch']}: library {lib['kernel_ms']} ms kernel, {lib['wall_ms']} "
                f"wall; best {best and best['kernel']} {best and best['kernel_ms']}, "
                f"{best and best['wall_ms']}; torch {t['kernel_ms']}, {t['wall_ms']}",
                flush=True,
            )
            # after every case: a late failure or timeout keeps the earlier ones
            args.output.write_text(json.dumps(out, indent=1))
            if args.results is not None:
                results = time_bundle_results(bundle, cases)
                path = args.results / f"{bundle_dir.name}-results.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(results, indent=1))
    args.output.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
