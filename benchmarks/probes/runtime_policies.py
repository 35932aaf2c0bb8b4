"""Runtime policies side by side: scheduling.favor, weight residency, memory admission and
cancellation, each compared within one run, interleaved call by call and repeated.

    python benchmarks/probes/runtime_policies.py [--rounds 7] [--calls 40]

Tables (markdown, for docs/runtime.md and benchmarks/history.md):
1. favor on the wide model (4 independent 256^3 matmul chains): Stream's concurrent regions and
   transient bytes (from the IR), the peak of queue-ordered memory iree-profile measures, and
   call latency as a ratio to min-memory.
2. residency on a 64 MiB embedding table read 4 rows at a time: RSS of the table's mapping after
   a call, and call latency as a ratio to resident.
3. admission: the example MLP with and without a memory budget (the cost of evaluating the
   need formula and reserving it).
4. cancellation: how long a cancelled async call takes to raise, against the call's length.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import myelin  # noqa: E402
from myelin.errors import Cancelled  # noqa: E402
from myelin.runtime.profiling import capture  # noqa: E402
from tests.conftest import EXAMPLES, build_app  # noqa: E402
from tests.myelin.runtime_policies_models import (  # noqa: E402
    WIDE_N,
    build_chain,
    with_async_entrypoints,
    write_gather_app,
    write_wide_app,
)


def interleaved(
    paths: dict[str, Callable[[], object]], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per round, each path's median seconds per call; the paths take turns call by call."""
    for fn in paths.values():
        fn()  # warm-up
    per_round: dict[str, list[float]] = {name: [] for name in paths}
    items = list(paths.items())
    for _ in range(rounds):
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for i in range(calls):
            for name, fn in items if i % 2 == 0 else reversed(items):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
        for name, values in samples.items():
            per_round[name].append(statistics.median(values))
    return per_round


def ratio_cells(times: list[float], base: list[float]) -> str:
    ratios = [t / b for t, b in zip(times, base, strict=True)]
    return f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}-{max(ratios):.3f}"


def mapping_rss_kib(path: Path) -> int:
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def favor_table(root: Path, rounds: int, calls: int) -> None:
    favors = ("min-memory", "max-concurrency", "debug")
    x = np.random.default_rng(0).standard_normal((WIDE_N, WIDE_N)).astype(np.float32) / 16
    w = np.random.default_rng(1).standard_normal((WIDE_N, WIDE_N)).astype(np.float32) / 16
    paths, rows = {}, {}
    for f in favors:
        mln = build_app(write_wide_app(root / f, f), root / f"{f}.mln")
        model = myelin.Instance().load(mln)
        plan = model.entrypoint("forward").memory
        entry = next(e for e in model.variant["entrypoints"] if e["name"] == "forward")
        peak = capture(mln, "forward", [x, w], root / f"prof-{f}").memory_high_water
        rows[f] = (entry["memory"]["schedule"]["concurrent"], plan.transient, peak)
        call = model.session().resolve("forward")
        paths[f] = lambda call=call: call(x, w)
    per_round = interleaved(paths, rounds, calls)
    print(
        "\n| favor | concurrent regions (widths) | transient B (IR) | measured peak B "
        "(iree-profile) | median ms/call | ratio vs min-memory | spread |"
    )
    print("|---|---|---|---|---|---|---|")
    for f in favors:
        widths, transient, peak = rows[f]
        print(
            f"| {f} | {len(widths)} {widths} | {transient:,} | {peak:,} | "
            f"{statistics.median(per_round[f]) * 1e3:.2f} | "
            f"{ratio_cells(per_round[f], per_round['min-memory'])} |"
        )


def residency_table(root: Path, rounds: int, calls: int) -> None:
    import gc

    mln = build_app(write_gather_app(root / "gather"), root / "gather.mln")
    ids = np.array([5, 700, 9000, 16383])
    modes = ("resident", "streamed", "prefetch")
    rss = {}
    for mode in modes:  # one model at a time: each maps the file itself
        model = myelin.Instance().load(mln, residency=mode)
        with model.session() as s:
            s.call("lookup", ids)
            rss[mode] = mapping_rss_kib(mln)
        model.close()
        del model, s
        gc.collect()
    models = {mode: myelin.Instance().load(mln, residency=mode) for mode in modes}
    calls_of = {mode: m.session().resolve("lookup") for mode, m in models.items()}
    paths = {mode: (lambda call=call: call(ids)) for mode, call in calls_of.items()}
    per_round = interleaved(paths, rounds, calls)
    print(
        "\n| residency | RSS of the 64 MiB table's mapping after a call | median µs/call | "
        "ratio vs resident | spread |"
    )
    print("|---|---|---|---|---|")
    for mode, times in per_round.items():
        print(
            f"| {mode} | {rss[mode]:,} KiB | {statistics.median(times) * 1e6:.0f} | "
            f"{ratio_cells(times, per_round['resident'])} |"
        )


def admission_table(root: Path, rounds: int, calls: int) -> None:
    mln = build_app(EXAMPLES / "mlp" / "app.toml", root / "mlp.mln")
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    free = myelin.Instance().load(mln).session().resolve("forward")
    budgeted = myelin.Instance().load(mln, memory_budget="1MiB").session().resolve("forward")
    per_round = interleaved(
        {"no budget": lambda: free(x), "budget": lambda: budgeted(x)}, rounds, calls * 10
    )
    print("\n| admission (MLP, batch 64) | median µs/call | ratio vs no budget | spread |")
    print("|---|---|---|---|")
    for name, times in per_round.items():
        print(
            f"| {name} | {statistics.median(times) * 1e6:.1f} | "
            f"{ratio_cells(times, per_round['no budget'])} |"
        )


def cancel_table(root: Path, rounds: int) -> None:
    mln = with_async_entrypoints(build_chain(root / "chain"), root / "chain-async.mln")
    model = myelin.Instance().load(mln)
    session = model.session()
    x = np.random.default_rng(0).standard_normal((2048, 256)).astype(np.float32)
    session.call("forward", x)
    full, raised = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        session.call("forward", x)
        full.append(time.perf_counter() - t0)
        threading.Timer(0.05, session.cancel).start()
        t0 = time.perf_counter()
        try:
            session.call("forward", x)
        except Cancelled:
            raised.append(time.perf_counter() - t0 - 0.05)
    print(
        "\n| cancellation (async entrypoint, 2048x256 through 24 layers) | median ms | min-max ms |"
    )
    print("|---|---|---|")
    print(
        f"| whole call | {statistics.median(full) * 1e3:.0f} | {min(full) * 1e3:.0f}-"
        f"{max(full) * 1e3:.0f} |"
    )
    print(
        f"| cancel() to Cancelled raised | {statistics.median(raised) * 1e3:.1f} | "
        f"{min(raised) * 1e3:.1f}-{max(raised) * 1e3:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    print(
        f"# runtime policies, {platform.node()} {platform.machine()}, "
        f"{time.strftime('%Y-%m-%d')}, rounds={args.rounds} calls/round={args.calls}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        favor_table(root, args.rounds, args.calls)
        residency_table(root, args.rounds, args.calls)
        admission_table(root, args.rounds, args.calls)
        cancel_table(root, args.rounds)


if __name__ == "__main__":
    main()
