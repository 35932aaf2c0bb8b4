"""A decode step taken apart on the GPU: every kernel of one call, its time and count, GPU busy
against wall, per artifact and decode entrypoint (CUPTI through torch.profiler).

    python3 benchmarks/probes/gpu/q4_breakdown.py --mln fp16=d7_fp16.mln --mln q4=d7_q4.mln \\
        [--entry decode --entry decode1] [--calls 50] [--trace 10] [--json OUT.json] [--md OUT.md]

The inputs are those of codecs_h200.py (`decode`: the caches of a prefill on seeded tokens;
`decode1`: zero caches stepped once), device arrays, each call waited for. Per (artifact, entry):
wall p50 of `--calls` untraced calls, then a trace of `--trace` more calls (the first dropped: it
pays CUPTI's start-up); every wall timing runs before the first trace, since a CUPTI session
slows what runs after it in the same process. Per kernel name: mean time per call and launches
per call; per call: GPU busy (the union of kernel intervals), the GPU idle between the first and
the last kernel, and the traced wall. Values do not matter to the kernels' time, so the .mln files
may be `payload.py rebuild --placeholder` ones (zero parameters).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GPU = HERE.parents[1] / "gpu"  # the models, payload.py and artifacts these scripts read
sys.path[:0] = [str(HERE), str(GPU)]
from overhead_timeline import union_us  # noqa: E402


def step_for(session, entry: str):
    """The timed call of `entry` on codecs_h200.py's inputs (device arrays in, device out)."""
    first = session.resolve("prefill")
    vocab = first.signature.outputs[0].shape[-1]
    decode = session.resolve(entry)
    cache_shape = decode.signature.inputs[2].shape
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, first.signature.inputs[0].shape).astype(np.int64)
    token = rng.integers(0, vocab, (cache_shape[1], 1)).astype(np.int64)
    pos = np.array([first.signature.inputs[0].shape[1]], np.int64)
    if entry == "decode":
        _, k, v = first(tokens, output="device")
    else:
        zeros = np.zeros(cache_shape, np.float16)
        _, k, v = decode(token, pos, zeros, zeros, output="device")
    return lambda: decode(token, pos, k, v, output="device")


def kernels_per_call(prof) -> list[list[tuple[str, float, float]]]:
    """(name, start, end) of the GPU work of each traced `call` range, in µs."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    calls, gpu = [], []
    for e in prof.events():
        r = (e.time_range.start, e.time_range.end)
        if e.device_type == cuda and e.name != "call":
            gpu.append((e.name, *r))
        elif e.device_type != cuda and e.name == "call":
            calls.append(r)
    calls.sort()
    out = []
    for i, (s, _) in enumerate(calls):
        nxt = calls[i + 1][0] if i + 1 < len(calls) else float("inf")
        out.append([g for g in gpu if s <= g[1] < nxt])
    return [*zip(calls, out, strict=True)]


def traced(step, trace: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(trace + 1):
            with torch.profiler.record_function("call"):
                step()
    per_call = kernels_per_call(prof)[1:]
    by_name: dict[str, list[float]] = defaultdict(list)
    busy, idle, wall = [], [], []
    for (s, e), ks in per_call:
        intervals = [(a, b) for _, a, b in ks]
        busy.append(union_us(intervals))
        first, last = min(a for a, _ in intervals), max(b for _, b in intervals)
        idle.append(last - first - busy[-1])
        wall.append(e - s)
        for name, a, b in ks:
            by_name[name].append(b - a)
    n = len(per_call)
    kernels = sorted(
        ({"name": k, "us": sum(v) / n, "count": len(v) / n} for k, v in by_name.items()),
        key=lambda r: -r["us"],
    )
    return {
        "gpu_busy_us": statistics.fmean(busy),
        "gpu_idle_inside_us": statistics.fmean(idle),
        "traced_wall_us": statistics.fmean(wall),
        "launches": sum(r["count"] for r in kernels),
        "kernels": kernels,
    }


def category(name: str) -> str:
    """A kernel's role by its name (IREE names codegen dispatches after their root op)."""
    if name.startswith("plex_q4"):
        return "q4 kernel"
    if name.startswith("plex_"):
        return "f16 kernel library"
    for word in ("matmul", "attention", "reduction", "generic", "elementwise", "transpose"):
        if word in name:
            return f"IREE {word}"
    return "other"


def markdown(results: dict) -> str:
    lines = []
    for key, r in results.items():
        lines += [
            f"### {key}: wall p50 {r['wall_us']['p50']:.0f} µs (untraced), GPU busy "
            f"{r['gpu_busy_us']:.0f} µs, GPU idle between kernels {r['gpu_idle_inside_us']:.0f} "
            f"µs, traced wall {r['traced_wall_us']:.0f} µs, {r['launches']:.0f} kernels per call",
            "",
            "| category | µs per call | kernels per call |",
            "|---|---|---|",
        ]
        cats: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for k in r["kernels"]:
            c = cats[category(k["name"])]
            c[0] += k["us"]
            c[1] += k["count"]
        for c, (us, count) in sorted(cats.items(), key=lambda x: -x[1][0]):
            lines.append(f"| {c} | {us:.1f} | {count:.0f} |")
        lines += ["", "| kernel | µs per call | per call |", "|---|---|---|"]
        for k in r["kernels"][:25]:
            lines.append(f"| `{k['name'][:110]}` | {k['us']:.1f} | {k['count']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mln", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--entry", action="append", help="decode entrypoints (decode)")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--trace", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    import torch

    import myelin

    torch.zeros(1, device="cuda")
    artifacts = dict(item.split("=", 1) for item in args.mln)
    entries = args.entry or ["decode"]
    with contextlib.ExitStack() as stack:
        steps, walls = {}, {}
        for name, path in artifacts.items():
            session = stack.enter_context(myelin.Instance().load(Path(path)).session())
            for entry in entries:
                steps[f"{name} {entry}"] = step_for(session, entry)
        for key, step in steps.items():  # every wall timing before the first CUPTI session
            for _ in range(5):
                step()
            ws = []
            for _ in range(args.calls):
                t = time.perf_counter_ns()
                step()
                ws.append((time.perf_counter_ns() - t) / 1e3)
            walls[key] = {"p10": float(np.percentile(ws, 10)), "p50": statistics.median(ws)}
            print(key, "wall p50", f"{walls[key]['p50']:.0f} µs", flush=True)
        results = {k: {"wall_us": walls[k], **traced(s, args.trace)} for k, s in steps.items()}
        steps.clear()
    text = markdown(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.md:
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
