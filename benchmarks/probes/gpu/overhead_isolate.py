"""One cell of the CUDA call-overhead matrix, in a fresh process (overhead_device.sh runs them):
which condition makes a call cost more than the same call from IREE's own C benchmark tool.

    python3 benchmarks/probes/gpu/overhead_isolate.py --mln kernels.mln --fn decode_bt \
        --path raw|myelin [--torch none|init|inputs] [--profile-first] [--n 300]

--torch none: torch is never imported; inputs are IREE-allocated device arrays (from numpy).
--torch init: torch is imported and its CUDA context started; inputs as with none.
--torch inputs: inputs are torch CUDA tensors imported once through DLPack.
--profile-first: one torch.profiler (CUPTI) session runs before the timing.
--path raw: pack + VmContext.invoke + fence wait; --path myelin: ResolvedCall with device arrays.
Prints one JSON line: the condition and p10/p50/p90 microseconds per call (each call waited for).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np

import myelin
from myelin.runtime._iree_private import InvokeContext
from myelin.runtime.devices import DEFAULT_CUDA_ALLOCATOR


def inputs_for(fn, torch_mode: str, block_inputs):
    """Device arrays on the entrypoint's device: IREE's own buffers, or torch memory."""
    rng = np.random.default_rng(0)
    if block_inputs is not None:
        host = [t.cpu().numpy() for t in block_inputs] if torch_mode != "none" else None
    else:
        host = None
    arrays = []
    for i, spec in enumerate(fn.signature.inputs):
        shape = tuple(8 if d is None else d for d in spec.shape)  # dynamic dims: 8
        if torch_mode == "inputs":
            import torch

            from myelin.runtime.tensors import import_cuda_tensor

            t = (
                block_inputs[i]
                if block_inputs is not None
                else (torch.randn(*shape, device="cuda") * 0.05).half()
            )
            arrays.append(import_cuda_tensor(t, fn._device, spec, fn.name))
            continue
        if host is not None:
            a = host[i]
        else:
            a = (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(np.float16)
        arrays.append(rt.asdevicearray(fn._device, a))
    return arrays


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mln", required=True)
    p.add_argument("--fn", required=True)
    p.add_argument("--path", choices=("raw", "myelin"), required=True)
    p.add_argument("--torch", choices=("none", "init", "inputs"), default="none")
    p.add_argument("--profile-first", action="store_true")
    p.add_argument("--block", action="store_true", help="--fn is the block's (model.py inputs)")
    p.add_argument("--n", type=int, default=300)
    p.add_argument(
        "--allocator",
        default=DEFAULT_CUDA_ALLOCATOR,
        help="Instance(cuda_allocator=...); default: the runtime's",
    )
    p.add_argument("--cprofile", action="store_true", help="cProfile the timed calls (stderr)")
    args = p.parse_args()
    block_inputs = None
    if args.torch != "none":
        import torch

        torch.zeros(1, device="cuda")
        if args.block:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "block"))
            import model as block

            block_inputs = list(block.example_inputs("cuda")[args.fn])
    s = myelin.Instance(cuda_allocator=args.allocator).load(args.mln).session()
    fn = s.resolve(args.fn)
    arrays = inputs_for(fn, args.torch, block_inputs)
    views = [a._buffer_view for a in arrays]
    dev, ctx, packer = fn._device, s._context, fn._packer
    sem = dev.create_semaphore(0)
    state = {"value": 0}
    n_results = len(fn._out_dtypes)

    def raw():
        args_ = packer.pack(InvokeContext(dev), views, {})
        v = state["value"]
        wait, signal = rt.HalFence.create_at(sem, v), rt.HalFence.create_at(sem, v + 1)
        state["value"] = v + 1
        args_.push_ref(wait)
        args_.push_ref(signal)
        results = rt.VmVariantList(n_results)
        ctx.invoke(fn._function, args_, results)
        signal.wait()
        return results

    def mye():
        return fn(*arrays, output="device")

    call = raw if args.path == "raw" else mye
    if args.profile_first:
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            for _ in range(5):
                call()
            torch.cuda.synchronize()
    for _ in range(20):
        call()
    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.n):
            call()
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    ts = []
    for _ in range(args.n):
        t = time.perf_counter_ns()
        call()
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    n = len(ts)
    print(
        json.dumps(
            {
                "fn": args.fn,
                "path": args.path,
                "torch": args.torch,
                "profile_first": args.profile_first,
                "allocator": args.allocator,
                "p10_us": ts[n // 10] / 1e3,
                "p50_us": ts[n // 2] / 1e3,
                "p90_us": ts[9 * n // 10] / 1e3,
            }
        )
    )


if __name__ == "__main__":
    main()
