"""Where a zoo model's forward spends its GPU time: PLeX's kernels beside torch eager's
(and torch.compile's with --compile).

    python -m benchmarks prepare gpu              (here: builds benchmarks/gpu/suite)
    bash benchmarks/probes/gpu/zoo_kernels.sh [CASE ...]              (on the GPU machine)

For each prepared zoo case (default: the ones below 1.0x torch eager): rebuild the .mln from
the seed as the suite does, load PLeX's `forward` and torch eager on the same GPU-resident
inputs, time `--calls` calls of each (each waited for), then trace three calls of each with
torch.profiler (CUPTI) and print per runner: wall per call, GPU busy per call, kernels per call,
and the kernels by total time, named as the GPU saw them (IREE's dispatch names say which op
of the graph each one is; the kernel library's are `plex_*`). Prints one JSON object per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from benchmarks import anchors, runner, zoo  # noqa: E402
from benchmarks.gpu import payload  # noqa: E402

DEFAULT_CASES = ("zoo-gpt2", "zoo-bert", "zoo-whisper-encoder", "zoo-llama")


def _kernels(prof, calls: int) -> dict:
    per_kernel: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name[:100]].append(e.time_range.end - e.time_range.start)
    busy = sum(sum(v) for v in per_kernel.values()) / calls
    top = sorted(per_kernel.items(), key=lambda kv: -sum(kv[1]))[:20]
    return {
        "gpu_busy_us_per_call": round(busy, 1),
        "kernels_per_call": sum(len(v) for v in per_kernel.values()) / calls,
        "top": [{"kernel": k, "n": len(v) / calls, "us": round(sum(v) / calls, 1)} for k, v in top],
    }


def profile_case(case: runner.Case, mln: Path, calls: int, compiled: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    module, inputs = zoo.source(case.model, case.batch, case.seq, case.dtype, case.params)
    inputs = tuple(torch.from_numpy(a).to("cuda") for a in inputs)
    keep: list = []
    runners = {
        "PLeX": runner.plex_runner(mln, keep, "cuda", 0),
        "torch eager": anchors.torch_eager(module, inputs, "cuda", 0),
    }
    if compiled:
        runners["torch.compile"] = anchors.torch_compile(module, inputs, "cuda", 0)
    out: dict = {"case": case.id}
    for name, fn in runners.items():
        for _ in range(3):
            runner.host(fn(*inputs))
        walls = []
        for _ in range(calls):
            t = time.perf_counter()
            fn(*inputs)  # each runner's call returns once its results are written
            walls.append((time.perf_counter() - t) * 1e3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn(*inputs)
                torch.cuda.synchronize()
        out[name] = {"wall_ms_p50": round(statistics.median(walls), 3), **_kernels(prof, 3)}
    for obj in keep[::-1]:
        obj.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=list(DEFAULT_CASES))
    parser.add_argument("--suite", type=Path, default=REPO / "benchmarks/gpu/suite")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="torch.compile's kernels beside")
    args = parser.parse_args()
    prepared = {c["id"]: c for c in json.loads((args.suite / "cases.json").read_text())}
    with tempfile.TemporaryDirectory() as tmp:
        for case_id in args.cases:
            raw = dict(prepared[case_id], anchors=tuple(prepared[case_id]["anchors"]))
            case = runner.Case(**raw)
            mln = Path(tmp) / f"{case.id}.mln"
            payload.rebuild(
                args.suite / case.id,
                mln,
                lambda c=case: zoo.weights(c.model, c.batch, c.seq, c.dtype, c.params),
            )
            try:
                result = profile_case(case, mln, args.calls, args.compile)
            except Exception as e:  # one case's failure is a result; the others run
                result = {"case": case.id, "error": f"{type(e).__name__}: {e}"[:2000]}
            print(json.dumps(result, indent=1), flush=True)
            mln.unlink()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
