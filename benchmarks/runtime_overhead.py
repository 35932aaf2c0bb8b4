"""MyeLiN call overhead: `session.call` / a resolved call vs raw `iree.runtime` invocation of the
same compiled module with the same parameters, interleaved in one run.

    python benchmarks/runtime_overhead.py [--rounds 15] [--calls 300]

The raw path is what a user of iree.runtime writes by hand: a VmContext with the HAL and
io_parameters modules, a FunctionInvoker, and `.to_host()` on the result. Both paths read the
module and the parameters from the same .mln mapping (built with `cancellable = false`, the
synchronous ABI FunctionInvoker calls), so only the Python-side work differs. The last row is
the default, cancellable build (async-external ABI: each call also creates and waits on fences).
Within a round the paths take turns call by call (A B C A B C ...), so drift in this shared
machine's speed hits all paths alike; the table reports the median over rounds of each round's
per-call median, and the spread (min-max) of the per-round ratios.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import iree.runtime as rt
import numpy as np

import myelin
from myelin.mln import MlnReader

REPO = Path(__file__).resolve().parents[1]


def build_example(folder: Path, cancellable: bool) -> Path:
    """examples/mlp; `cancellable = false` gives the synchronous ABI that a plain
    FunctionInvoker can call, so raw and MyeLiN run the very same module."""
    from plex.builder import build

    app = folder / f"app-{cancellable}.toml"
    app.write_text(
        f'[app]\nname = "mlp"\npackages = ["{REPO / "examples" / "mlp"}"]\n\n'
        f"[runtime]\ncancellable = {str(cancellable).lower()}\n"
    )
    out = folder / f"mlp-{cancellable}.mln"
    build(app, out)
    return out


def raw_invoker(path: Path, function: str):
    """iree.runtime by hand, reading the module and parameters from the same .mln."""
    reader = MlnReader(path)
    variant = reader.manifest["variants"][0]
    instance = rt.VmInstance()
    device = rt.get_device("local-task")
    section = variant["modules"][0]["section"]
    module = rt.VmModule.copy_buffer(instance, bytes(reader.section_view(section)))
    handle = rt.FileHandle.wrap_memory(reader.mmap, readable=True, writable=False)
    index = rt.ParameterIndex()
    for p in reader.manifest["parameters"]:
        index.add_from_file_handle(
            p["key"], handle, p["length"], offset=reader.sections[p["section"]].offset + p["offset"]
        )
    params = rt.create_io_parameters_module(instance, index.create_provider(scope="mlp"))
    context = rt.VmContext(instance, [rt.create_hal_module(instance, device), params, module])
    invoker = rt.FunctionInvoker(context, device, module.lookup_function(function))
    keep = (reader, handle, index, params, context, module)

    def call(x: np.ndarray) -> np.ndarray:
        return invoker(x).to_host()

    call.keep = keep  # type: ignore[attr-defined]
    return call


def time_interleaved(fns: dict, x: np.ndarray, n: int) -> dict[str, float]:
    """Median seconds per call of each path, the paths taking turns call by call."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    items = list(fns.items())
    for i in range(n):
        for name, fn in items if i % 2 == 0 else reversed(items):
            t0 = time.perf_counter()
            fn(x)
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = build_example(Path(tmp), cancellable=False)
        model = myelin.Instance().load(path)
        session = model.session()
        resolved = session.resolve("forward")
        cancellable = myelin.Instance().load(build_example(Path(tmp), cancellable=True))
        cancellable_session = cancellable.session()
        fenced = cancellable_session.resolve("forward")
        raw = raw_invoker(path, "forward")
        paths = {
            "raw iree.runtime": raw,
            "myelin resolved call": lambda x: resolved(x),
            "myelin session.call": lambda x: session.call("forward", x),
            "myelin resolved call, cancellable build (fences)": lambda x: fenced(x),
        }
        print(
            f"# runtime overhead, {platform.node()} {platform.machine()}, "
            f"{time.strftime('%Y-%m-%d')}, rounds={args.rounds} calls/round={args.calls}"
        )
        print("| batch | path | median µs/call | ratio vs raw (median) | ratio spread (min-max) |")
        print("|---|---|---|---|---|")
        for batch in (1, 64, 1024):
            x = np.random.default_rng(0).standard_normal((batch, 16)).astype(np.float32)
            want = raw(x)
            for fn in paths.values():
                np.testing.assert_allclose(fn(x), want, rtol=1e-6)
            time_interleaved(paths, x, 50)  # warm-up
            per_round: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, median in time_interleaved(paths, x, args.calls).items():
                    per_round[name].append(median)
            base = per_round["raw iree.runtime"]
            for name, times in per_round.items():
                ratios = [t / b for t, b in zip(times, base, strict=True)]
                print(
                    f"| {batch} | {name} | {statistics.median(times) * 1e6:.1f} | "
                    f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}-{max(ratios):.3f} |"
                )
        session.close()
        cancellable_session.close()


if __name__ == "__main__":
    main()
