"""Build times of two PLeX revisions, side by side in one run: cold, no-op and one-shard rebuilds
of examples/sharded, and the cold build of examples/llama.

    python benchmarks/probes/build_revisions.py --before REV [--after REV] [--rounds 3]
        [--llama-rounds 2]

Each revision's `src/` is exported with `git archive` into a temporary folder and run as
`python -m plex build` with that folder first on PYTHONPATH (the working tree when --after is
omitted). Rounds interleave the revisions (before, after, before, ...), each with a fresh copy
of the example and a fresh cache, so a load spike on this shared 2-core machine hits both. Wall
time includes the CLI's start-up; CPU is the child's user+system time, which other load
disturbs less. The table gives the median and the spread (min-max) over rounds.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def export_src(rev: str | None, into: Path) -> Path:
    """The `src` folder of revision `rev` (None: the working tree)."""
    if rev is None:
        return REPO / "src"
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def plex_build(src: Path, app: Path, out: Path, cache: Path | None) -> tuple[float, float]:
    """(wall s, CPU s) of one `plex build` in a new process running the code under `src`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    extra = ["--no-cache"] if cache is None else []
    if cache is not None:
        env["PLEX_CACHE_DIR"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"plex build failed ({src}):\n{result.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def sharded_round(src: Path, work: Path) -> dict[str, tuple[float, float]]:
    app_dir = work / "sharded"
    shutil.copytree(EXAMPLES / "sharded", app_dir, ignore=shutil.ignore_patterns("*.mln", "*.lock"))
    app, cache = app_dir / "app.toml", work / "cache"
    times = {"sharded: cold": plex_build(src, app, work / "a.mln", cache)}
    times["sharded: no-op"] = plex_build(src, app, work / "b.mln", cache)
    decoder = app_dir / "decoder.mlir"
    decoder.write_text(decoder.read_text() + "// an edit\n")
    times["sharded: one shard edited"] = plex_build(src, app, work / "c.mln", cache)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--after", default=None, help="git revision (default: working tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="plex-revisions-") as tmp:
        root = Path(tmp)
        trees = {
            f"before ({args.before})": export_src(args.before, root / "before"),
            f"after ({args.after or 'working tree'})": export_src(args.after, root / "after"),
        }
        for i in range(max(args.rounds, args.llama_rounds)):
            for name, src in trees.items():
                work = root / f"{name.split()[0]}-{i}"
                work.mkdir()
                if i < args.rounds:
                    for kind, t in sharded_round(src, work).items():
                        results.setdefault((kind, name), []).append(t)
                if i < args.llama_rounds:
                    app = EXAMPLES / "llama" / "app.toml"
                    t = plex_build(src, app, work / "llama.mln", None)
                    results.setdefault(("llama: cold (no cache)", name), []).append(t)
                    print(f"round {i + 1}: {name}: llama cold {t[0]:.1f} s", file=sys.stderr)
    print(f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print("| build | revision | wall s (median) | wall spread | CPU s (median) | CPU vs before |")
    print("|---|---|---|---|---|---|")
    kinds = dict.fromkeys(kind for kind, _ in results)
    for kind in kinds:
        cpu_of = {}
        for name in trees:
            runs = results[(kind, name)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            cpu_of[name] = statistics.median(cpus)
            ratio = cpu_of[name] / next(iter(cpu_of.values()))
            print(
                f"| {kind} | {name} | {statistics.median(walls):.2f} | "
                f"{min(walls):.2f}-{max(walls):.2f} | {cpu_of[name]:.2f} | {ratio:.2f}x |"
            )


if __name__ == "__main__":
    main()
