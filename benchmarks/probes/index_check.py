"""Cost of the runtime's index-range check on an embedding lookup of a 32x128 token batch.

    python benchmarks/probes/index_check.py [--rounds 9] [--calls 200]
        [--mln PLACEMENT.mln --variant cpu]

`--mln` runs an already built examples/placement artifact instead of building one (a machine
with only the runtime installed: numpy, iree-base-runtime and src/ on PYTHONPATH).

examples/placement's `embed` (a [256, 64] f32 table) is built for the CPU and called with 4096
ids (32 sequences of 128 tokens, flattened: the entrypoint takes a 1-D batch). Within a round,
calls with the check (as shipped) and without it (the same resolved call with its check list
emptied) take turns call by call, so drift in this shared machine's speed hits both alike; the
check alone (`check_index_ranges` on the same array) is timed too. The table reports the median
over rounds of each round's per-call median, and the spread of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import myelin
from myelin.runtime.session import ResolvedCall
from myelin.runtime.tensors import check_index_ranges

REPO = Path(__file__).resolve().parents[2]
TOKENS = (32, 128)


def build_embed(folder: Path) -> Path:
    from plex.builder import build

    package = folder / "placement"
    package.mkdir()
    for name in ("plex.toml", "embed.mlir", "blocks.mlir", "head.mlir", "params.safetensors"):
        shutil.copy(REPO / "examples" / "placement" / name, package / name)
    app = folder / "app.toml"
    app.write_text('[app]\nname = "embed"\npackages = ["placement"]\n\n[devices.cpu]\n'
                   'target = "llvm-cpu"\n')  # fmt: skip
    build(app, folder / "embed.mln")
    return folder / "embed.mln"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--mln", type=Path, help="a built examples/placement artifact")
    parser.add_argument("--variant", help="its variant to load (default: the first that runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.mln if args.mln is not None else build_embed(Path(tmp))
        model = myelin.Instance().load(path, variant=args.variant)
        ids = np.random.default_rng(0).integers(0, 256, size=np.prod(TOKENS), dtype=np.int64)
        with model.session() as session:
            checked = session.resolve("embed")
            unchecked = ResolvedCall(session, "embed")  # its own object: resolve() caches
            unchecked._index_checks = ()
            checks = checked._index_checks
            assert checks, "the build recorded no range for embed(ids)"
            rows: dict[str, list[float]] = {"with": [], "without": [], "check": []}
            ratios, added = [], []
            for _ in range(args.rounds):
                times: dict[str, list[float]] = {k: [] for k in rows}
                for _ in range(args.calls):
                    for key, fn in (("with", checked), ("without", unchecked)):
                        t0 = time.perf_counter()
                        fn(ids)
                        times[key].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    check_index_ranges("embed", checks, (ids,))
                    times["check"].append(time.perf_counter() - t0)
                medians = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                for k, v in medians.items():
                    rows[k].append(v)
                ratios.append(medians["check"] / medians["without"])
                added.append(medians["with"] / medians["without"] - 1)
    print(f"embed, {TOKENS[0]}x{TOKENS[1]} ids, {platform.machine()} ({os.cpu_count()} CPUs), "
          f"{args.rounds} rounds x {args.calls} calls")  # fmt: skip
    print("| path | median µs/call |")
    print("|---|---:|")
    for key, label in (("without", "call, no check"), ("with", "call, with the check"),
                       ("check", "the check alone")):  # fmt: skip
        print(f"| {label} | {statistics.median(rows[key]):.1f} |")
    print(
        f"check alone / call: {statistics.median(ratios) * 100:.2f}% "
        f"(rounds {min(ratios) * 100:.2f}-{max(ratios) * 100:.2f}%); call with / without the "
        f"check: +{statistics.median(added) * 100:.2f}% "
        f"(rounds {min(added) * 100:.2f}-{max(added) * 100:.2f}%)"
    )


if __name__ == "__main__":
    main()
