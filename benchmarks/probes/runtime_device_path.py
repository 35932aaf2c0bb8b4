"""The "device" call path on the CPU driver: raw `iree.runtime` vs MyeLiN, and MyeLiN before a
runtime change, interleaved call by call in one process.

    python benchmarks/probes/runtime_device_path.py [--before OLD/src] [--rounds 3] [--calls 3000]

Two models built here: examples/mlp (one input, one result) and the 14-input, 3-result model of
runtime_fast_check.py (the shape of the Llama-7B-shaped block's decode call, tiny tensors), both
with the default async ABI (what CUDA builds use). Every path passes the same device arrays and
keeps the results on the device:
- "raw": what a user of iree.runtime writes for the async ABI (pack, a wait and a signal fence on
  a timeline semaphore, invoke, block on the signal fence, the results as DeviceArrays);
- "MyeLiN": `ResolvedCall(..., output="device")`;
- "MyeLiN before" (with --before): the same call through the session module of another source
  tree (`OLD/src/myelin/runtime/session.py` and its `waiting.py`, loaded beside this tree's, the
  rest of MyeLiN shared), so the two runtimes meet the same machine state call by call.
Prints p10/p50/p90 microseconds per path and round, and each path's p50 minus raw's. With
`--stages`, also where MyeLiN's call spends its time: each stage's method timed by a wrapper
(p50 per call; a wrapper adds about a microsecond to the stage it wraps and to those around it).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np

import myelin
import myelin.runtime.session
from myelin.runtime._iree_private import InvokeContext

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # its sibling, and the benchmarks package

import runtime_fast_check  # noqa: E402

from benchmarks.scenarios import build_mlp  # noqa: E402


def load_before(src: Path):
    """The session module of another tree, importing this tree's MyeLiN for everything else
    except its own fence-wait module."""

    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    runtime = src / "myelin" / "runtime"
    waiting = load("myelin_before_waiting", runtime / "waiting.py")
    saved = sys.modules["myelin.runtime.waiting"]
    sys.modules["myelin.runtime.waiting"] = waiting
    try:
        return load("myelin_before_session", runtime / "session.py")
    finally:
        sys.modules["myelin.runtime.waiting"] = saved


def raw_caller(fn, arrays):
    """iree.runtime by hand on the entrypoint's function, context and device."""
    dev, ctx, function = fn._device, fn._session._context, fn._function
    packer = fn._packer
    views = [a._buffer_view for a in arrays]
    semaphore = dev.create_semaphore(0)
    state = [0]
    count = len(fn.signature.outputs)

    def call():
        args = packer.pack(InvokeContext(dev), views, {})
        v = state[0]
        state[0] = v + 1
        signal = rt.HalFence.create_at(semaphore, v + 1)
        args.push_ref(rt.HalFence.create_at(semaphore, v))
        args.push_ref(signal)
        results = rt.VmVariantList(count)
        ctx.invoke(function, args, results)
        signal.wait()
        return [
            rt.DeviceArray(dev, results.get_as_object(i, rt.HalBufferView)) for i in range(count)
        ]

    return call


def paths_for(model, name: str, arrays, before) -> dict:
    fn = model.session().resolve(name)
    paths = {"raw": raw_caller(fn, arrays), "MyeLiN": lambda: fn(*arrays, output="device")}
    if before is not None:
        old = before.Session(model).resolve(name)
        paths["MyeLiN before"] = lambda: old(*arrays, output="device")
    return paths


# MyeLiN's call, stage by stage: (class, method) in the order a "device" call meets them.
STAGES = (
    ("ResolvedCall", "__call__"),
    ("ResolvedCall", "_checked_arguments"),
    ("ResolvedCall", "_call_plain"),
    ("Session", "_fences"),
    ("ResolvedCall", "_invoke"),
    ("FenceWait", "wait"),
    ("IreeResults", "deliver"),
)


def stage_times(call, calls: int) -> dict[str, float]:
    """p50 microseconds of each stage of `call` (a MyeLiN "device" call), by wrapping the
    stages' methods for the duration."""
    from myelin.runtime import session as module
    from myelin.runtime import sinks, waiting

    classes = {"ResolvedCall": module.ResolvedCall, "Session": module.Session}
    classes["FenceWait"] = waiting.FenceWait
    classes["IreeResults"] = sinks.IreeResults
    samples: dict[str, list[int]] = {}
    saved = []
    for cls_name, name in STAGES:
        cls = classes[cls_name]
        original = getattr(cls, name)
        saved.append((cls, name, original))
        times = samples.setdefault(f"{cls_name}.{name}", [])

        def timed(*a, _original=original, _times=times, **k):
            t = time.perf_counter_ns()
            try:
                return _original(*a, **k)
            finally:
                _times.append(time.perf_counter_ns() - t)

        setattr(cls, name, timed)
    try:
        for _ in range(300):
            call()
        for v in samples.values():
            v.clear()
        for _ in range(calls):
            call()
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)
    out = {}
    for k, v in samples.items():
        v.sort()
        out[k] = v[len(v) // 2] / 1e3 if v else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="another tree's src/ (the runtime before)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--stages", action="store_true", help="also time MyeLiN's call by stage")
    args = p.parse_args()
    before = load_before(args.before) if args.before else None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        mlp = myelin.Instance().load(build_mlp(folder, cancellable=True))
        many_dir = folder / "many"
        many_dir.mkdir()
        many = myelin.Instance().load(runtime_fast_check.build(many_dir))
        cases = {}
        dev = mlp.session().resolve("forward")._device
        x = rt.asdevicearray(dev, np.ones((1, 16), np.float32))
        cases["mlp forward (1 input, 1 result)"] = paths_for(mlp, "forward", [x], before)
        dev = many.session().resolve("many")._device
        xs = [rt.asdevicearray(dev, np.full(64, i, np.float32)) for i in range(14)]
        cases["14 inputs, 3 results"] = paths_for(many, "many", xs, before)
        for case, paths in cases.items():
            if args.stages:
                stages = stage_times(paths["MyeLiN"], args.calls)
                print(
                    f"{case}  stages (p50 us): "
                    + ", ".join(f"{k} {v:.1f}" for k, v in stages.items() if v is not None),
                    flush=True,
                )
            for r in range(args.rounds):
                p50 = {}
                for k, v in runtime_fast_check.interleaved_round(paths, args.calls).items():
                    n = len(v)
                    p50[k] = v[n // 2] / 1e3
                    print(
                        f"{case}  round {r + 1}  {k:14s} p10 {v[n // 10] / 1e3:6.1f}  "
                        f"p50 {p50[k]:6.1f}  p90 {v[9 * n // 10] / 1e3:6.1f} us"
                        + (f"  (raw + {p50[k] - p50['raw']:.1f})" if k != "raw" else ""),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
