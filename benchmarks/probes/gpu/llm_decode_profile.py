"""Where a causal-LM decode step's time goes on the GPU: kernels, launches, the host.

    bash benchmarks/probes/gpu/llm_decode_profile.sh   (after benchmarks/gpu/llm/build.py)

For each build in benchmarks/gpu/artifacts/llm: rebuild the .mln from the seed, prefill a
512-token prompt, then time decode calls three ways (the Generator's own call, output to
numpy; output left on the device; submitted back to back, waiting for none or for the call
before the last) and trace a few with
torch.profiler (CUPTI): per call the GPU-busy time, the GPU idle between kernels, the time to
the first kernel and after the last, and the kernels by total time. Prints one JSON object.

IREE runtime flags to try are given in PLEX_PROBE_IREE_FLAGS (e.g. "--cuda_use_streams=false",
command buffers as CUDA graphs); they are parsed before the CUDA driver is created.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [
    str(REPO / "benchmarks" / "gpu" / "llm"),
    str(REPO / "benchmarks" / "probes" / "gpu"),
]

import run_llm  # noqa: E402
from overhead_timeline import split_calls  # noqa: E402

import myelin  # noqa: E402
from myelin.runtime.generation import Generator  # noqa: E402


def profile_build(build: dict, mln: Path, steps: int = 24) -> dict:
    loaded = myelin.Instance().load(mln)
    gen = Generator(loaded)
    b, prompt = build["batch"], 512
    ids = np.random.default_rng(0).integers(3, 500, size=(b, prompt), dtype=np.int64)
    mask = np.ones((b, prompt), dtype=np.int64)
    pos = np.broadcast_to(np.arange(prompt, dtype=np.int64), (b, prompt)).copy()
    t0 = time.perf_counter()
    gen._prefill(ids, pos, mask, output="numpy")
    prefill_ms = (time.perf_counter() - t0) * 1e3
    out: dict = {"prefill_ms_first": prefill_ms}
    token = np.full((b, 1), 7, dtype=np.int64)
    kv = prompt

    def step(output: str) -> float:
        nonlocal kv
        kv += 1
        m = np.ones((b, kv), dtype=np.int64)
        p = np.full((b, 1), kv - 1, dtype=np.int64)
        t = time.perf_counter()
        gen._decode(token, p, m, output=output)
        return (time.perf_counter() - t) * 1e3

    for output in ("numpy", "device"):
        times = [step(output) for _ in range(steps)]
        out[f"decode_ms_{output}"] = {
            "p50": round(statistics.median(times), 3),
            "min": round(min(times), 3),
        }
    # Submitted back to back (PendingCall), as a pipelined generator would: the device's step
    # throughput when the host does not wait for each step before recording the next.
    for behind in (None, 1):
        kv = prompt
        pendings = []
        t0 = time.perf_counter()
        for i in range(steps):
            kv += 1
            m = np.ones((b, kv), dtype=np.int64)
            p = np.full((b, 1), kv - 1, dtype=np.int64)
            pendings.append(gen._decode.submit(token, p, m, output="device"))
            if behind is not None and i >= behind:
                pendings[i - behind].result()
        pendings[-1].result()
        label = "decode_ms_submitted" if behind is None else "decode_ms_submitted_read_behind"
        out[label] = round((time.perf_counter() - t0) * 1e3 / steps, 3)
    # prefill again, timed, on a fresh sequence
    kv = prompt
    t0 = time.perf_counter()
    gen._prefill(ids, pos, mask, output="numpy")
    out["prefill_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    from torch.profiler import ProfilerActivity, profile, record_function

    kernels: dict[str, list[float]] = defaultdict(list)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            with record_function("call"):
                step("numpy")
    calls = split_calls(prof)
    out["decode_split_us"] = calls
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "call":
            kernels[e.name[:90]].append(e.time_range.end - e.time_range.start)
    top = sorted(kernels.items(), key=lambda kv_: -sum(kv_[1]))[:25]
    out["decode_kernels_us_per_call"] = [
        {"kernel": k, "count_per_call": len(v) / 4, "us_per_call": round(sum(v) / 4, 1)}
        for k, v in top
    ]
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof, record_function("call"):
        gen._prefill(ids, pos, mask, output="numpy")
    out["prefill_split_us"] = split_calls(prof)
    pk: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "call":
            pk[e.name[:90]].append(e.time_range.end - e.time_range.start)
    out["prefill_kernels_us"] = [
        {"kernel": k, "count": len(v), "us": round(sum(v), 1)}
        for k, v in sorted(pk.items(), key=lambda kv_: -sum(kv_[1]))[:15]
    ]
    gen.close()
    return out


def main() -> None:
    artifacts = REPO / "benchmarks/gpu/artifacts/llm"
    index = json.loads((artifacts / "llm.json").read_text())
    index["builds"] = [x for x in index["builds"] if x["family"] == "llama"]
    result = {"gpu": torch.cuda.get_device_name()}
    flags = os.environ.get("PLEX_PROBE_IREE_FLAGS", "").split()
    if flags:
        import iree.runtime as rt

        rt.flags.parse_flags(*flags)
        result["iree_flags"] = flags
    with tempfile.TemporaryDirectory() as tmp:
        status = run_llm.rebuild_all(index, artifacts, Path(tmp))
        torch.zeros(1, device="cuda")
        for b in index["builds"]:
            try:
                result[b["name"]] = profile_build(b, Path(status[b["name"]]["mln"]))
            except Exception:
                import traceback

                result[b["name"]] = {"error": traceback.format_exc()[-3000:]}
            print(json.dumps({b["name"]: result[b["name"]]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
