"""Where one CUDA call's overhead sits on the timeline, in a fresh process per condition.

    python3 benchmarks/probes/gpu/overhead_timeline.py --mln block_attention.mln --block \
        --fns decode,prefill --path raw|myelin [--allocator caching] \
        [--flags=--cuda_use_streams=false]
    python3 benchmarks/probes/gpu/overhead_timeline.py --mln kernels.mln --fns decode_bt,matmul ...

Per entrypoint: wall time of `--n` calls, each waited for (p10/p50/p90, no profiler), then a
torch.profiler (CUPTI) trace of `--trace` calls, each inside a `call` range, from which every
call is split into:
- `to_first_launch`: the call's start to the first `cuLaunchKernel` (any thread: IREE launches
  from its queue worker thread);
- `to_first_kernel`: the call's start to the first kernel's start on the GPU;
- `gpu_busy`: the union of kernel (and memcpy/memset) intervals;
- `gpu_idle_inside`: first kernel start to last kernel end, minus `gpu_busy` (the GPU waiting
  for launches);
- `tail`: the last kernel's end to the call's return;
- `launch_pace`: the median time between consecutive `cuLaunchKernel` starts.
overhead = wall p50 - gpu_busy (mean over the traced calls). CUPTI slows every driver call, so
the traced call is longer than the untraced one: the split says where, the wall says how much.

Inputs are torch CUDA tensors imported once (resident, as a serving loop keeps weights), so a
call imports nothing. `--path raw` is what a user of iree.runtime writes (pack, invoke with the
async-external ABI's fences, wait); `--path myelin` is `ResolvedCall(..., output="device")`.
`--wait poll` makes the raw path poll its signal fence instead of blocking on it, `--spin-us N`
the MyeLiN path wait as `model.session(spin_us=N)` does (block, then poll around the expected
end: myelin.runtime.waiting); `--vmfb`
makes it run another compile of the same module (e.g. one made by `iree-compile` with a flag
PLeX's in-process compiler does not register).
Prints one JSON line per entrypoint.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import iree.runtime as rt
import torch

import myelin
from myelin.runtime._iree_private import InvokeContext
from myelin.runtime.tensors import import_cuda_tensor


def inputs_for(fn, name: str, block: bool) -> list[torch.Tensor]:
    if block:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "block"))
        import model

        return list(model.example_inputs("cuda")[name])
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [tuple(8192 if d is None else d for d in s.shape) for s in fn.signature.inputs]
    return [(torch.randn(*s, device="cuda", generator=g) * 0.05).half() for s in shapes]


def caller(fn, arrays, path: str, wait: str, vmfb: str | None):
    if path == "myelin":
        return lambda: fn(*arrays, output="device")
    views = [a._buffer_view for a in arrays]
    dev, ctx, packer = fn._device, fn._session._context, fn._packer
    function = fn._function
    if vmfb:  # the same entrypoint compiled otherwise (with IREE's own tool), in its own context
        model = fn._session.model
        _, modules = model._context_modules()
        name = fn._entry.module
        module = rt.VmModule.copy_buffer(model._vm_instance, Path(vmfb).read_bytes())
        modules = [module if getattr(m, "name", None) == name else m for m in modules]
        ctx = rt.VmContext(model._vm_instance, modules=modules)
        function = module.lookup_function(fn._entry.function)
    sem = dev.create_semaphore(0)
    state = {"value": 0}
    n_results = len(fn._out_dtypes)

    def raw():
        args = packer.pack(InvokeContext(dev), views, {})
        v = state["value"]
        wait_fence, signal = rt.HalFence.create_at(sem, v), rt.HalFence.create_at(sem, v + 1)
        state["value"] = v + 1
        args.push_ref(wait_fence)
        args.push_ref(signal)
        results = rt.VmVariantList(n_results)
        ctx.invoke(function, args, results)
        if wait == "poll":
            while not signal.wait(timeout=0):
                pass
        else:
            signal.wait()
        return results

    return raw


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def split_calls(prof) -> list[dict]:
    cuda = torch.autograd.DeviceType.CUDA
    calls, gpu, launches = [], [], []
    for e in prof.events():
        r = (e.time_range.start, e.time_range.end)
        if e.device_type == cuda:
            if e.name != "call":  # the range's own GPU-side annotation
                gpu.append(r)
        elif e.name == "call":
            calls.append(r)
        elif e.name == "cuLaunchKernel":
            launches.append(r[0])
    out = []
    calls.sort()
    for i, (s, e) in enumerate(calls):
        nxt = calls[i + 1][0] if i + 1 < len(calls) else float("inf")
        ks = [k for k in gpu if s <= k[0] < nxt]
        ls = sorted(t for t in launches if s <= t < e)
        if not ks:
            out.append({"wall_traced": e - s, "kernels": 0})
            continue
        first, last = min(k[0] for k in ks), max(k[1] for k in ks)
        busy = union_us(ks)
        pace = [b - a for a, b in itertools.pairwise(ls)]
        out.append(
            {
                "wall_traced": e - s,
                "kernels": len(ks),
                "launches": len(ls),
                "to_first_launch": (ls[0] - s) if ls else None,
                "to_first_kernel": first - s,
                "gpu_busy": busy,
                "gpu_idle_inside": (last - first) - busy,
                "tail": e - last,
                "launch_pace": statistics.median(pace) if pace else None,
            }
        )
    return out


def mean_of(rows: list[dict]) -> dict:
    keys = [k for k in rows[0] if all(r.get(k) is not None for r in rows)]
    return {k: round(statistics.fmean(r[k] for r in rows), 1) for k in keys}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mln", required=True)
    p.add_argument("--fns", required=True, help="comma-separated entrypoints")
    p.add_argument("--block", action="store_true", help="inputs from block/model.py")
    p.add_argument("--path", choices=("raw", "myelin"), required=True)
    p.add_argument("--wait", choices=("block", "poll"), default="block")
    p.add_argument("--spin-us", type=float, default=0.0, help="myelin path: session(spin_us=)")
    p.add_argument("--allocator", default="caching")
    p.add_argument("--flags", default="", help="IREE runtime flags, parsed before the driver")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--trace", type=int, default=10)
    p.add_argument("--label", default="")
    p.add_argument("--vmfb", help="raw path: run this VM module in place of the .mln's")
    args = p.parse_args()
    if args.flags:
        rt.flags.parse_flags(*args.flags.split())
    torch.zeros(1, device="cuda")
    model = myelin.Instance(cuda_allocator=args.allocator).load(args.mln)
    s = model.session(spin_us=args.spin_us) if args.spin_us else model.session()
    from torch.profiler import ProfilerActivity, profile

    for name in args.fns.split(","):
        fn = s.resolve(name)
        tensors = inputs_for(fn, name, args.block)
        arrays = [
            import_cuda_tensor(t, fn._device, spec, name)
            for t, spec in zip(tensors, fn.signature.inputs, strict=True)
        ]
        torch.cuda.synchronize()
        call = caller(fn, arrays, args.path, args.wait, args.vmfb)
        for _ in range(10):
            call()
        ts = []
        for _ in range(args.n):
            t = time.perf_counter_ns()
            call()
            ts.append((time.perf_counter_ns() - t) / 1e3)
        ts.sort()
        n = len(ts)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.trace):
                with torch.profiler.record_function("call"):
                    call()
        parts = split_calls(prof)[1:]  # the first traced call pays CUPTI's start-up
        split = mean_of(parts) if parts else {}
        wall = {"p10": ts[n // 10], "p50": ts[n // 2], "p90": ts[9 * n // 10]}
        row = {
            "label": args.label,
            "mln": Path(args.mln).name,
            "fn": name,
            "path": args.path,
            "wait": args.wait,
            "spin_us": args.spin_us,
            "allocator": args.allocator,
            "flags": args.flags,
            "vmfb": args.vmfb,
            "myelin": str(Path(myelin.__file__).parent),
            "wall_us": {k: round(v, 1) for k, v in wall.items()},
            "split_us": split,
            "overhead_us": round(wall["p50"] - split.get("gpu_busy", 0.0), 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
