"""Where the time of one CUDA call goes: MyeLiN's `session.call` taken apart against raw
`iree.runtime` invokes of the same function, on the H200.

    python3 benchmarks/probes/gpu/overhead_h200.py --mln kernels.mln --out DIR

Entrypoints: `identity` (8 elements: dispatches nothing) and `decode_bt` (8 x 4096 x 4096 x W^T on
the skinny Triton kernel, 11 us of GPU time). For each, in one process, interleaved:
- MyeLiN `ResolvedCall` with device arrays, and with a torch tensor imported per call;
- raw: the same function through `VmContext.invoke` with pre-imported buffer views and fences,
  split into pack / invoke (submit) / wait, with four ways to wait for the signal fence
  (a blocking wait, MyeLiN's 20 ms slices, a zero-timeout poll loop, a semaphore query loop);
- pipelined: 50 invokes back to back, then one wait (the host's submission cost alone);
- torch eager doing the same matmul.
Then a torch.profiler (CUPTI) trace of a few calls, with the CUDA driver API calls of every thread
(IREE's own threads included), summarized per call; and the CUDA context's scheduling flags.
Writes DIR/overhead.json and DIR/trace_*.json (chrome traces).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import iree.runtime as rt
import torch

import myelin
from myelin.runtime._iree_private import InvokeContext
from myelin.runtime.tensors import import_cuda_tensor


def stats(samples_ns: list[int]) -> dict:
    s = sorted(samples_ns)
    n = len(s)
    return {
        "p10_us": s[n // 10] / 1e3,
        "p50_us": s[n // 2] / 1e3,
        "p90_us": s[9 * n // 10] / 1e3,
        "mean_us": statistics.fmean(s) / 1e3,
    }


def timed(fn, n: int, warm: int = 10) -> dict:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
    return stats(out)


class Raw:
    """One entrypoint called as a user of iree.runtime would, with the async-external ABI's
    fences on a private timeline; each piece of a call timed separately."""

    def __init__(self, resolved, views: list) -> None:
        self.ctx = resolved._session._context
        self.fn = resolved._function
        self.dev = resolved._device
        self.packer = resolved._packer
        self.views = views
        self.n_results = len(resolved._out_dtypes)
        self.sem = self.dev.create_semaphore(0)
        self.value = 0
        self.pieces: dict[str, list[int]] = {}

    def submit(self):
        t0 = time.perf_counter_ns()
        args = self.packer.pack(InvokeContext(self.dev), self.views, {})
        wait = rt.HalFence.create_at(self.sem, self.value)
        signal = rt.HalFence.create_at(self.sem, self.value + 1)
        self.value += 1
        args.push_ref(wait)
        args.push_ref(signal)
        results = rt.VmVariantList(self.n_results)
        t1 = time.perf_counter_ns()
        self.ctx.invoke(self.fn, args, results)
        t2 = time.perf_counter_ns()
        self._add("pack", t1 - t0)
        self._add("invoke", t2 - t1)
        return signal, results

    def _add(self, k: str, v: int) -> None:
        self.pieces.setdefault(k, []).append(v)

    def call(self, how: str):
        signal, results = self.submit()
        t = time.perf_counter_ns()
        if how == "block":
            signal.wait()
        elif how == "slices":  # what MyeLiN does: 20 ms slices
            while not signal.wait(timeout=20_000_000):
                pass
        elif how == "poll":
            while not signal.wait(timeout=0):
                pass
        elif how == "query":
            while self.sem.query() < self.value:
                pass
        self._add(f"wait_{how}", time.perf_counter_ns() - t)
        return results

    def pipelined(self, k: int = 50) -> float:
        """k submissions back to back, one wait: microseconds per call."""
        t = time.perf_counter_ns()
        keep = [self.submit() for _ in range(k)]
        keep[-1][0].wait()
        return (time.perf_counter_ns() - t) / k / 1e3


def driver_api_summary(prof, calls: int) -> dict:
    """Per call: each CUDA runtime/driver API name's count and time, and the GPU kernel time,
    from CUPTI events of every thread."""
    api: dict[str, list[float]] = {}
    gpu = 0.0
    threads = set()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu += e.time_range.elapsed_us()
            continue
        name = e.name
        if name.startswith(("cu", "cuda")):
            api.setdefault(name, []).append(e.time_range.elapsed_us())
            threads.add(e.thread)
    return {
        "gpu_us_per_call": gpu / calls,
        "api_per_call": {
            k: {"count": len(v) / calls, "us": sum(v) / calls}
            for k, v in sorted(api.items(), key=lambda kv: -sum(kv[1]))
        },
        "threads_with_api_calls": len(threads),
    }


def traced(fn, calls: int, path: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            with torch.profiler.record_function("call"):
                fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return driver_api_summary(prof, calls)


def context_flags() -> dict:
    lib = ctypes.CDLL("libcuda.so.1")
    flags = ctypes.c_uint(0)
    status = lib.cuCtxGetFlags(ctypes.byref(flags))
    sched = {0: "AUTO", 1: "SPIN", 2: "YIELD", 4: "BLOCKING_SYNC"}.get(flags.value & 7)
    return {"status": status, "flags": flags.value, "sched": sched}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mln", required=True)
    p.add_argument("--out", default=".")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--flags", default="", help="IREE runtime flags, parsed before the driver")
    p.add_argument("--block", help="also the Llama-7B-shaped block's decode (block.mln)")
    args = p.parse_args()
    if args.flags:
        rt.flags.parse_flags(*args.flags.split())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = myelin.Instance().load(args.mln)
    s = model.session()
    res: dict = {"variant": model.variant_name, "flags": args.flags}
    cases = {
        "identity": (s.resolve("identity"), [torch.ones(8, device=dev, dtype=torch.float16)]),
        "decode_bt": (
            s.resolve("decode_bt"),
            [
                (torch.randn(8, 4096, device=dev) * 0.05).half(),
                (torch.randn(4096, 4096, device=dev) * 0.05).half(),
            ],
        ),
    }
    if args.block:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "block"))
        import model as block

        bs = myelin.Instance().load(args.block).session()
        cases["block_decode"] = (bs.resolve("decode"), list(block.example_inputs("cuda")["decode"]))
    for name, (fn, tensors) in cases.items():
        hal = fn._device
        arrays = [
            import_cuda_tensor(t, hal, spec, name)
            for t, spec in zip(tensors, fn.signature.inputs, strict=True)
        ]
        raw = Raw(fn, [a._buffer_view for a in arrays])
        row: dict = {}
        variants = {
            "myelin_device_arrays": lambda fn=fn, a=arrays: fn(*a, output="device"),
            "myelin_torch_in": lambda fn=fn, t=tensors: fn(*t, output="device"),
            "raw_block": lambda raw=raw: raw.call("block"),
            "raw_slices": lambda raw=raw: raw.call("slices"),
            "raw_poll": lambda raw=raw: raw.call("poll"),
            "raw_query": lambda raw=raw: raw.call("query"),
            "import_only": lambda t=tensors, fn=fn, hal=hal, name=name: [
                import_cuda_tensor(x, hal, sp, name)
                for x, sp in zip(t, fn.signature.inputs, strict=True)
            ],
            "torch_sync_only": torch.cuda.synchronize,
        }
        if name == "decode_bt":
            x, w = tensors

            def torch_mm(x=x, w=w):
                torch.nn.functional.linear(x, w)
                torch.cuda.synchronize()

            variants["torch_linear_sync"] = torch_mm
        samples: dict[str, list[int]] = {k: [] for k in variants}
        for f in variants.values():  # warm-up
            for _ in range(10):
                f()
        raw.pieces.clear()
        for _ in range(args.n):  # interleaved, one call of each per round
            for k, f in variants.items():
                t = time.perf_counter_ns()
                f()
                samples[k].append(time.perf_counter_ns() - t)
        row["wall"] = {k: stats(v) for k, v in samples.items()}
        row["raw_pieces"] = {k: stats(v) for k, v in raw.pieces.items()}
        row["pipelined_us_per_call"] = [raw.pipelined() for _ in range(5)]
        row["trace_myelin"] = traced(
            variants["myelin_device_arrays"], 10, out / f"trace_{name}.json"
        )
        row["trace_raw_block"] = traced(variants["raw_block"], 10, out / f"trace_{name}_raw.json")
        res[name] = row
        print(name, json.dumps(row["wall"], indent=None))
        print(name, "pieces", json.dumps(row["raw_pieces"]))
        print(name, "pipelined", row["pipelined_us_per_call"])
        print(name, "trace", json.dumps(row["trace_myelin"])[:3000])
    res["context"] = context_flags()
    print("context", res["context"])
    (out / "overhead.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
