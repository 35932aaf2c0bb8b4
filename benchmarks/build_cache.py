"""SYNaPSe build cache: cold build vs no-op rebuild vs rebuild after editing one shard.

    python benchmarks/build_cache.py [--rounds 5]

Each round copies examples/sharded (two shards in two source files, one shared weights package)
into a fresh folder with a fresh cache and runs, as a user would, `plex build` three times in new
processes: cold (empty cache), no-op (nothing changed), and after appending a comment to
decoder.mlir (a new file content, so a cache miss for that shard only). Wall time includes the
Python start-up of the CLI; "CPU" is the process's user+system time (less sensitive to other
load on this shared machine than wall time); "steps" is the executor's own time from the --json
`done` event. A fourth row is the no-op rebuild through the Python API in this process (no
interpreter start-up or imports). The table reports the median over rounds and the spread
(min-max); the --explain output of the last one-shard rebuild shows which steps ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
KINDS = ("cold build", "no-op rebuild", "one shard edited", "no-op rebuild, in process")


def plex_build(app: Path, out: Path, cache: Path, *extra: str) -> tuple[float, float, float, str]:
    """(wall s, CPU s, executor s, stdout) of one `plex build` in a new process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(out), "--json", *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "PLEX_CACHE_DIR": str(cache)},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
    if result.returncode != 0:
        raise SystemExit(f"plex build failed:\n{result.stderr}")
    done = [json.loads(line) for line in result.stderr.splitlines() if '"kind": "done"' in line]
    return wall, cpu, done[-1]["seconds"], result.stdout


def in_process_build(app: Path, out: Path, cache: Path) -> tuple[float, float, float]:
    from plex.builder import build

    start, cpu = time.perf_counter(), time.process_time()
    result = build(app, out, cache_dir=cache)
    wall = time.perf_counter() - start
    steps = sum(r.seconds for r in result.results.values())
    return wall, time.process_time() - cpu, steps


def one_round(root: Path, index: int) -> tuple[dict[str, tuple[float, float, float]], str]:
    folder = root / f"round{index}"
    shutil.copytree(REPO / "examples" / "sharded", folder, ignore=shutil.ignore_patterns("*.lock"))
    app, out, cache = folder / "app.toml", folder / "out.mln", folder / "cache"
    times: dict[str, tuple[float, float, float]] = {}
    times["cold build"] = plex_build(app, out, cache)[:3]
    times["no-op rebuild"] = plex_build(app, out, cache)[:3]
    times["no-op rebuild, in process"] = in_process_build(app, out, cache)
    with (folder / "decoder.mlir").open("a") as f:
        f.write(f"// edit {index}\n")
    *times["one shard edited"], explained = plex_build(app, out, cache, "--explain")
    return times, explained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="plex-bench-cache-") as tmp:
        explained = ""
        for i in range(args.rounds):
            times, explained = one_round(Path(tmp), i)
            for kind, t in times.items():
                samples[kind].append(t)
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, {args.rounds} rounds, examples/sharded")
    cold = statistics.median(w for w, _, _ in samples["cold build"])
    print(
        "| build | wall s (median) | wall spread | CPU s (median) | steps s (median) "
        "| wall vs cold |"
    )
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        walls, cpus, steps = zip(*samples[kind], strict=True)
        print(
            f"| {kind} | {statistics.median(walls):.2f} | {min(walls):.2f}-{max(walls):.2f} | "
            f"{statistics.median(cpus):.2f} | {statistics.median(steps):.2f} | "
            f"{statistics.median(walls) / cold:.2f}x |"
        )
    print("\n`plex build --explain` after editing decoder.mlir (last round):\n")
    print(explained.rstrip())


if __name__ == "__main__":
    main()
