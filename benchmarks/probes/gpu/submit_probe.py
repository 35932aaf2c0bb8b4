"""Why a CUDA submission waits for nothing (myelin.runtime.pending): the tuned GEMV invoked by
hand through IREE's async ABI, `k` calls back to back and one wait at the end, with each call's
wait fence chained on the previous call's signal ("chained") or empty ("none"). Prints, per
mode and `k`, the time per call, the median and longest invocation, and the final wait (us).

Run on the H200 (benchmarks/gpu/README.md, after the wheel install line): `python3
benchmarks/probes/gpu/submit_probe.py benchmarks/gpu/artifacts/tunekern_tuned.mln`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import iree.runtime as rt
import numpy as np
import torch

import myelin
from myelin.runtime._iree_private import InvokeContext, buffer_view_of
from myelin.runtime.tensors import import_cuda_tensor


def main() -> None:
    dev = torch.device("cuda")
    model = myelin.Instance().load(sys.argv[1])
    session = model.session()
    fn = session.resolve("gemv_nk")
    hal = fn._device
    x = (torch.randn(1, 8192, device=dev) * 0.1).half()
    w = (torch.randn(28672, 8192, device=dev) * 0.1).half()
    views = [
        buffer_view_of(import_cuda_tensor(t, hal, spec, "gemv_nk"))
        for t, spec in zip((x, w), fn.signature.inputs, strict=True)
    ]
    want = torch.nn.functional.linear(x, w).cpu().numpy()
    semaphore = hal.create_semaphore(0)
    value = 0

    def burst(mode: str, k: int, poll: bool) -> dict:
        nonlocal value
        invokes, results = [], []
        start = time.perf_counter()
        for _ in range(k):
            args = fn._packer.pack(InvokeContext(hal), views, {})
            wait = rt.HalFence.create_at(semaphore, value) if mode == "chained" else rt.HalFence(1)
            value += 1
            signal = rt.HalFence.create_at(semaphore, value)
            args.push_ref(wait)
            args.push_ref(signal)
            res = rt.VmVariantList(1)
            t = time.perf_counter()
            session._context.invoke(fn._function, args, res)
            invokes.append((time.perf_counter() - t) * 1e6)
            results.append((args, res))
        t = time.perf_counter()
        while poll and not signal.wait(timeout=0):
            pass
        signal.wait()
        final = (time.perf_counter() - t) * 1e6
        per_call = (time.perf_counter() - start) / k * 1e6
        view = results[-1][1].get_as_object(0, rt.HalBufferView)
        got = np.asarray(rt.DeviceArray(hal, view, implicit_host_transfer=True).to_host())
        return {
            "per_call_us": per_call,
            "invoke_median_us": statistics.median(invokes),
            "invoke_max_us": max(invokes),
            "final_wait_us": final,
            "max_abs_diff_vs_torch": float(np.abs(got.astype(np.float32) - want).max()),
        }

    for mode in ("chained", "none"):
        for k in (1, 2, 4, 8, 50):
            for poll in (False, True):
                row = burst(mode, k, poll)
                label = f"{mode} k={k} {'poll' if poll else 'block'}"
                print(label, json.dumps({a: round(b, 1) for a, b in row.items()}), flush=True)


if __name__ == "__main__":
    main()
