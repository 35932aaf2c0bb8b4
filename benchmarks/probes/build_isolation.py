"""Cost of running import/encode/compile steps in worker processes (SYNaPSe `isolate`), against
running them in the build process's threads (`PLEX_BUILD_ISOLATE=0`).

    python benchmarks/probes/build_isolation.py [--rounds 3] [APP ...]     # default: examples/mlp

Each build is a real `plex build` process with a fresh cache (every step runs), the two modes
taking turns round by round. The table gives medians over rounds: wall time of the process, and
each isolated step's own time as the build reports it (a worker's start-up, the interpreter and
the imports its step needs, lands in the first step it runs).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"built\s+((?:import|encode|compile):\S+) \(([\d.]+)s\)")


def one_build(app: Path, isolate: bool, folder: Path) -> tuple[float, dict[str, float]]:
    env = {**os.environ, "PLEX_CACHE_DIR": str(folder / "cache"),
           "PLEX_BUILD_ISOLATE": "1" if isolate else "0"}  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(folder / "out.mln"),
         "--progress", "plain"],
        capture_output=True, text=True, env=env, cwd=REPO, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    return wall, {m[1]: float(m[2]) for m in STEP.finditer(done.stdout + done.stderr)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("apps", nargs="*", type=Path, default=[REPO / "examples/mlp/app.toml"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| app | mode | wall s | " + " | ".join(["steps (s each)"]) + " |")
    print("|---|---|---:|---|")
    for app in args.apps:
        runs: dict[bool, list[tuple[float, dict[str, float]]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for isolate in (True, False):
                with tempfile.TemporaryDirectory() as tmp:
                    runs[isolate].append(one_build(app, isolate, Path(tmp)))
        for isolate in (False, True):
            walls = [w for w, _ in runs[isolate]]
            steps = sorted({s for _, found in runs[isolate] for s in found})
            cells = ", ".join(
                f"{s} {statistics.median(f.get(s, 0.0) for _, f in runs[isolate]):.2f}"
                for s in steps
            )
            mode = "workers" if isolate else "threads"
            print(f"| {app.parent.name} | {mode} | {statistics.median(walls):.2f} | {cells} |")


if __name__ == "__main__":
    main()
