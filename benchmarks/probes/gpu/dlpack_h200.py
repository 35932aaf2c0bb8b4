"""Device results that export DLPack, on a GPU: a 256 MiB float16 tensor through an
identity-like entrypoint (`negate`: one elementwise pass, the traffic of a copy).

    python3 benchmarks/probes/gpu/dlpack_h200.py --mln benchmarks/gpu/artifacts/dlpack.mln \
        --out DIR \
        [--cuda-allocator pool|caching]

Cases, interleaved round by round (wall time of one call, waited for, torch tensor in):
  plex storage   `session.call(..., output="dlpack")`: the result is written into memory MyeLiN
                 allocated (cuMemAlloc) and imported, then `torch.from_dlpack(y)` views it
  plex old path  the same call without the storage twin (IREE allocates the result, which
                 cannot export): the result to torch through the host (`to_host()`, `.cuda()`)
  plex old, no export  the old call alone (the result stays an IREE device array)
  torch copy     `y.copy_(x)` into a preallocated tensor: a device-to-device copy
  torch neg      `torch.neg(x, out=y)`: the same kernel work in torch
Proof that no copy happened: the data pointer torch sees equals the pointer MyeLiN allocated,
and a CUPTI trace (torch.profiler) of one storage call has one kernel and no memcpy.
Lifetimes: the result dropped before / after its torch view, the model closed while a view
lives, and the device memory given back once the last view is gone.
The storage path's cost taken apart: cuMemAlloc + cuMemFree of the 256 MiB (or, with
`--cuda-allocator caching`, a reuse of a dropped block), and the DLPack import of it.
Writes `dlpack_h200_<allocator>.json` (and prints it) under --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import myelin
from myelin.runtime.result_storage import KDL_CUDA, Storage, dlpack_capsule, live_capsules

N = 128 * 2**20  # float16 elements: 256 MiB


def wall_ms(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(samples: list[float]) -> dict:
    return {
        "median_ms": round(statistics.median(samples), 4),
        "min_ms": round(min(samples), 4),
        "max_ms": round(max(samples), 4),
        "n": len(samples),
    }


def trace_one(fn) -> dict:
    """Kernels and memcpy/memset activities CUPTI saw during one call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        keep = fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    names = [e.name for e in events]
    copies = [n for n in names if "memcpy" in n.lower() or "memset" in n.lower()]
    del keep
    return {"gpu_activities": names, "copies": copies}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mln", required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--cuda-allocator", default="pool", choices=("pool", "caching"))
    args = parser.parse_args()
    results: dict = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda_allocator": args.cuda_allocator,
    }

    model = myelin.Instance(cuda_allocator=args.cuda_allocator).load(args.mln)
    results["variant"] = model.variant_name
    session = model.session()
    call = session.resolve("negate")
    x = torch.randn(N, dtype=torch.float16, device="cuda")
    want = -x

    # Zero copy: the pointer torch sees is the one MyeLiN allocated.
    y = call(x, output="dlpack")
    t = torch.from_dlpack(y)
    results["pointer"] = {
        "storage": y.storage_pointer,
        "torch_data_ptr": t.data_ptr(),
        "equal": t.data_ptr() == y.storage_pointer,
        "values_equal": bool(torch.equal(t, want)),
        "input_ptr_differs": t.data_ptr() != x.data_ptr(),
    }
    del y, t
    results["trace_storage_call"] = trace_one(lambda: torch.from_dlpack(call(x, output="dlpack")))

    # The old path: the plain entrypoint (IREE allocates the result).
    old = session.resolve("negate")
    old = type(old)(session, "negate")
    old._twin = None
    yo = old(x, output="device")
    try:
        torch.from_dlpack(yo)
        results["old_path_export"] = "exported (unexpected)"
    except BufferError as e:
        results["old_path_export"] = f"BufferError: {str(e).splitlines()[0][:160]}"
    del yo
    results["trace_old_call"] = trace_one(lambda: old(x, output="device"))

    reuse = args.cuda_allocator == "caching"
    hal = call._device

    def alloc_free() -> None:
        Storage(N * 2, KDL_CUDA, reuse=reuse)

    kept_storage = Storage(N * 2, KDL_CUDA)

    def import_only() -> None:
        hal.from_dlpack_capsule(dlpack_capsule(kept_storage, (N,), np.dtype(np.float16)))

    if reuse:  # a dropped result's block is the next result's
        first = call(x, output="dlpack")
        pointer = first.storage_pointer
        del first
        again = call(x, output="dlpack")
        results["reuse"] = {
            "same_block": again.storage_pointer == pointer,
            "values_equal": bool(torch.equal(torch.from_dlpack(again), want)),
        }
        del again

    out = torch.empty_like(x)
    cases = {
        "plex storage + torch.from_dlpack": lambda: torch.from_dlpack(call(x, output="dlpack")),
        "plex old path, to torch via host": lambda: torch.from_numpy(
            np.asarray(old(x, output="device").to_host())
        ).cuda(),
        "plex old path, no export": lambda: old(x, output="device"),
        "torch y.copy_(x) (d2d copy)": lambda: out.copy_(x),
        "torch neg(x, out=y)": lambda: torch.neg(x, out=out),
        "part: result storage allocated and freed": alloc_free,
        "part: DLPack import of the storage": import_only,
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(args.rounds):
        for name, fn in cases.items():
            samples[name].extend(wall_ms(fn, args.calls))
    results["wall"] = {k: summary(v) for k, v in samples.items()}

    # The dynamic-shape entrypoint: learned on the first call of an input shape.
    dyn = session.resolve("negate_dyn")
    small = x[: 2**20]
    first = dyn(small, output="dlpack")
    second = dyn(small, output="dlpack")
    ts = torch.from_dlpack(second)
    results["dynamic"] = {
        "first_call_storage": first.storage_pointer,
        "second_call_pointer_equal": ts.data_ptr() == second.storage_pointer,
        "values_equal": bool(torch.equal(ts, -small)),
    }
    try:
        torch.from_dlpack(first)
        results["dynamic"]["first_call_export"] = "exported"
    except BufferError as e:
        results["dynamic"]["first_call_export"] = f"BufferError: {str(e)[:200]}"
    del first, second, ts

    # Lifetimes.
    gc.collect()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    capsules0 = live_capsules()
    kept = torch.from_dlpack(call(x, output="dlpack"))  # the result dropped at once
    y = call(x, output="dlpack")
    tv = torch.from_dlpack(y)
    del tv  # torch view first, then the result
    del y
    session.close()
    model.close()
    gc.collect()
    noise = [torch.randn(N, dtype=torch.float16, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()
    lifetimes = {
        "view_after_result_session_model_closed_equal": bool(torch.equal(kept, want)),
        "capsules_alive_with_one_view": live_capsules() - capsules0,
    }
    del noise
    gc.collect()
    torch.cuda.synchronize()
    free_with_view = torch.cuda.mem_get_info()[0]
    del kept
    gc.collect()
    torch.cuda.synchronize()
    free_after = torch.cuda.mem_get_info()[0]
    lifetimes.update(
        {
            "capsules_alive_after_last_view": live_capsules() - capsules0,
            "device_memory_given_back_MiB": round((free_after - free_with_view) / 2**20, 1),
            "free_before_vs_after_MiB": round((free_after - free0) / 2**20, 1),
        }
    )
    results["lifetimes"] = lifetimes

    text = json.dumps(results, indent=1)
    print(text)
    Path(args.out, f"dlpack_h200_{args.cuda_allocator}.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
