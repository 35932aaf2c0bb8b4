"""Submitted calls against torch's asynchronous launches on the H200: the GEMVs of issue 17
(1 x 8192 by a 28672 x 8192 f16 weight, stored N x K and K x N) and the 8192^3 matmul, weights
resident, from `tunekern_tuned.mln`.

Two ways to call, each measured side by side with torch in interleaved rounds (order rotated
per round):
- "each": every call waited for before the next (torch: `torch.cuda.synchronize()` after each
  launch; PLeX: `ResolvedCall(..., output="device")` under `session(spin_us=)`, which returns
  when its result is written). What one call's latency is.
- "burst": `--burst` calls back to back, then one wait (torch: launches, then one synchronize;
  PLeX: `submit` each, then `result()` of each). What a loop of calls sustains: per-call time =
  burst time / burst. torch.utils.benchmark times torch this way.

Kernel times: CUPTI, PLeX's kernel and cuBLAS's taking turns in one session. Run (after the
wheel install line of benchmarks/gpu/README.md): `python3 benchmarks/probes/gpu/submit_h200.py
--mln benchmarks/gpu/artifacts/tunekern_tuned.mln --json OUT.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from kernels_h200 import gpu_state, kernels_by_name, rel_error, summarize

import myelin
from myelin.runtime.tensors import import_cuda_tensor


def burst_of(launch: Callable[[], object], finish: Callable[[list], None], n: int):
    """A callable that runs `n` launches back to back and then `finish` on what they returned."""

    def run() -> None:
        finish([launch() for _ in range(n)])

    return run


def timed_rounds(rows: dict[str, tuple[Callable[[], None], int]], rounds: int, reps: int):
    """Per row, per round, the median over `reps` runs of (run time / calls per run), ms."""
    walls: dict[str, list[float]] = {name: [] for name in rows}
    states = []
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run, calls = rows[name]
            run()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                run()
                times.append((time.perf_counter() - t) * 1e3 / calls)
            walls[name].append(statistics.median(times))
        states.append(gpu_state())
    return walls, states


def burst_gaps(run: Callable[[], None]) -> dict:
    """GPU idle between consecutive kernels of one traced burst (CUPTI): what back-to-back
    calls leave unused on the device, median and max (us), and the kernels traced."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    return {
        "kernels": len(spans),
        "gap_median_us": statistics.median(gaps) if gaps else None,
        "gap_max_us": max(gaps) if gaps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", required=True, help="tunekern_tuned.mln")
    parser.add_argument("--json", default="submit_h200.json")
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--spin-us", type=float, default=200.0)
    args = parser.parse_args()
    dev = torch.device("cuda")
    model = myelin.Instance().load(args.mln)
    session = model.session(spin_us=args.spin_us)
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.randn(1, 8192, device=dev, generator=g) * 0.1).half()
    w = (torch.randn(28672, 8192, device=dev, generator=g) * 0.1).half()
    w_kn = w.T.contiguous()
    a = (torch.randn(8192, 8192, device=dev, generator=g) * 0.05).half()
    b = (torch.randn(8192, 8192, device=dev, generator=g) * 0.05).half()
    cases = {
        "gemv_nk": ((x, w), lambda: torch.nn.functional.linear(x, w), x.float() @ w.float().T),
        "gemv_kn": ((x, w_kn), lambda: x @ w_kn, x.float() @ w.float().T),
        "matmul": ((a, b), lambda: a @ b, a.float() @ b.float()),
    }
    out: dict = {"device": torch.cuda.get_device_name(), "burst": args.burst, "cases": {}}
    n = args.burst
    for name, (tensors, torch_fn, ref) in cases.items():
        fn = session.resolve(name)
        views = [
            import_cuda_tensor(t, fn._device, spec, name)
            for t, spec in zip(tensors, fn.signature.inputs, strict=True)
        ]

        def plex_call(fn=fn, views=views):
            return fn(*views, output="device")

        def plex_submit(fn=fn, views=views):
            return fn.submit(*views)

        def read_all(pending: list) -> None:
            for p in pending:
                p.result()

        def sync_after(results: list) -> None:
            torch.cuda.synchronize()

        rows = {
            "torch each": (lambda torch_fn=torch_fn: (torch_fn(), torch.cuda.synchronize()), 1),
            "plex each": (plex_call, 1),
            "torch burst": (burst_of(torch_fn, sync_after, n), n),
            "plex burst": (burst_of(plex_submit, read_all, n), n),
        }
        errors = {
            "torch": rel_error(torch_fn(), ref),
            "plex each": rel_error(torch.from_dlpack(fn(*views, output="dlpack")), ref),
        }
        pending = [fn.submit(*views) for _ in range(n)]
        burst_errors = [
            rel_error(torch.from_numpy(np.asarray(p.result().to_host())).to(dev), ref)
            for p in pending[-3:]
        ]
        errors["plex burst (last 3)"] = max(burst_errors)
        reps = 5 if name == "matmul" else 20
        walls, states = timed_rounds(rows, args.rounds, reps)
        each = summarize({k: v for k, v in walls.items() if "each" in k}, "torch each")
        burst = summarize({k: v for k, v in walls.items() if "burst" in k}, "torch burst")
        by_name = kernels_by_name([torch_fn, plex_call])
        gaps = {k: burst_gaps(rows[k][0]) for k in ("torch burst", "plex burst")}
        out["cases"][name] = {
            "rows": each | burst,
            "burst_gaps": gaps,
            "errors": errors,
            "kernels_ms": by_name,
            "gpu_after_each_round": states,
        }
        print(
            name,
            json.dumps(
                {
                    k: [round(v["wall_ms"], 4), round(v["vs_torch"], 3)]
                    for k, v in (each | burst).items()
                }
            ),
            json.dumps({k: round(v, 4) for k, v in by_name.items()}),
            json.dumps({k: f"{v:.2e}" for k, v in errors.items()}),
            json.dumps(gaps),
            flush=True,
        )
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
