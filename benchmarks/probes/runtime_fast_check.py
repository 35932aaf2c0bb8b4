"""The fast input check's memory of device arrays, on and off, in one process.

    python benchmarks/probes/runtime_fast_check.py [--rounds 3] [--calls 4000]

Builds a CPU model here whose entrypoint takes 14 inputs and returns 3 results (the shape of the
Llama-7B-shaped block's decode call, on tiny tensors), then times, interleaved call by call,
`ResolvedCall(..., output="device")` with the same 14 device arrays each call, with the
remembered check (the default) and with the check redone every call, and the fast check alone
both ways. Prints p10/p50/p90 microseconds per round.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import iree.runtime as rt
import numpy as np

import myelin
from myelin.runtime.tensors import DeviceTensor

INPUTS = 14


def source() -> str:
    args = ", ".join(f"%a{i}: tensor<64xf32>" for i in range(INPUTS))
    body = ["  %s0 = arith.addf %a0, %a1 : tensor<64xf32>"]
    body += [
        f"  %s{i - 1} = arith.addf %s{i - 2}, %a{i} : tensor<64xf32>" for i in range(2, INPUTS)
    ]
    last = f"%s{INPUTS - 2}"
    body += [f"  %o1 = arith.mulf {last}, %a0 : tensor<64xf32>"]
    body += [f"  %o2 = arith.subf {last}, %a1 : tensor<64xf32>"]
    results = "tensor<64xf32>, tensor<64xf32>, tensor<64xf32>"
    return (
        f"func.func @many({args}) -> ({results}) {{\n"
        + "\n".join(body)
        + f"\n  return {last}, %o1, %o2 : {results}\n}}\n"
    )


def build(folder: Path) -> Path:
    (folder / "many.mlir").write_text(source())
    (folder / "plex.toml").write_text(
        '[package]\nname = "many"\nversion = "0.1.0"\n\n[graph.many]\nsource = "many.mlir"\n'
    )
    (folder / "app.toml").write_text(
        '[app]\nname = "many"\npackages = ["."]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
        'cpu = "host"\n\n[[variant]]\nname = "cpu"\ndevices = ["cpu"]\n'
    )
    out = folder / "many.mln"
    subprocess.run(
        [sys.executable, "-m", "plex", "build", str(folder / "app.toml"), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out


class Forgetful(dict):
    """A memory that keeps nothing: every call checks every input again."""

    def __setitem__(self, key, value) -> None:
        pass


def interleaved_round(paths: dict[str, Callable[[], object]], calls: int) -> dict[str, list[int]]:
    """One round: every path warmed (300 calls), then timed call by call in turn, so that the
    machine's drift and noise fall on all of them alike; each path's nanoseconds, sorted."""
    for f in paths.values():
        for _ in range(300):
            f()
    samples: dict[str, list[int]] = {k: [] for k in paths}
    for _ in range(calls):
        for k, f in paths.items():
            t = time.perf_counter_ns()
            f()
            samples[k].append(time.perf_counter_ns() - t)
    return {k: sorted(v) for k, v in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=4000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = myelin.Instance().load(build(Path(tmp)))
        fn = model.session().resolve("many")
        dev = fn._device
        xs = [
            DeviceTensor(
                dev, rt.asdevicearray(dev, np.full(64, i, np.float32))._buffer_view, cuda=False
            )
            for i in range(INPUTS)
        ]
        remembered = fn._passed

        def use(memory):
            fn._passed = memory

        paths = {
            "call, remembered": lambda: (use(remembered), fn(*xs, output="device")),
            "call, checked every time": lambda: (use(Forgetful()), fn(*xs, output="device")),
            "fast check alone, remembered": lambda: (use(remembered), fn._fast_arguments(xs)),
            "fast check alone, every time": lambda: (use(Forgetful()), fn._fast_arguments(xs)),
        }
        for r in range(args.rounds):
            for k, v in interleaved_round(paths, args.calls).items():
                n = len(v)
                print(
                    f"round {r + 1}  {k:30s} p10 {v[n // 10] / 1e3:6.1f}  "
                    f"p50 {v[n // 2] / 1e3:6.1f}  p90 {v[9 * n // 10] / 1e3:6.1f} us"
                )
        use(remembered)


if __name__ == "__main__":
    main()
