"""CLI start-up: wall time of `plex --help`, a no-op rebuild of examples/mlp and `plex run` of it.

    .venv/bin/python benchmarks/probes/cli_startup.py [--rounds 10] [--importtime]

Each round runs every command once, in turn (interleaved, so machine noise spreads over all of them
alike); the table gives the median and the min-max spread of the rounds next to the goal (issue 10
item 7), and the CPU time (user + system) of the same runs: on a shared, loaded machine wall time
mostly measures the queue for a core, CPU time what the command itself costs. The example is copied
to a temporary folder first (a build writes `plex.lock` beside its app) and built once into a
private cache, so every timed build is a no-op: all steps are cache hits. `--importtime` adds, per
command, the imports that cost most (`python -X importtime`, one extra run each): where the time
goes when a goal is missed. `--baseline SRC` also runs every command with SRC (a copy of `src/`,
e.g. with another revision's `plex/cli`) first on PYTHONPATH, in the same rounds: before/after
in one run."""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the three commands load, one module per fresh interpreter (CPU s over `python -c pass`):
# the fixed costs a command pays before it does anything.
MODULES = (
    "typer",
    "typer._adapters",  # typer 0.29 coerces parameters through pydantic when a verb runs
    "pydantic",
    "numpy",
    "iree.runtime",
    "iree.compiler",
    "plex.manifest",
    "myelin.mln",
    "synapse",
    "plex.cli",
    "plex.builder",
)
GOALS_S = {"plex --help": 0.25, "no-op rebuild (examples/mlp)": 0.5, "plex run (examples/mlp)": 0.4}


def plex_command() -> list[str]:
    """The `plex` console script of this interpreter's environment, as a user runs it."""
    script = Path(sys.executable).parent / "plex"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "plex"]


def commands(work: Path) -> dict[str, list[str]]:
    plex = plex_command()
    app = work / "mlp" / "app.toml"
    out = work / "mlp.mln"
    return {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "plex --help": [*plex, "--help"],
        "no-op rebuild (examples/mlp)": [*plex, "build", str(app), "-o", str(out)],
        "plex run (examples/mlp)": [*plex, "run", str(out), "--input", "2x16xf32=0.5"],
    }


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run; children run one at a time, so the rusage delta is its own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def top_imports(command: list[str], env: dict[str, str], count: int = 8) -> list[tuple[str, int]]:
    """The `count` top-level imports with the largest cumulative time, in microseconds."""
    if Path(command[0]).name.startswith("plex"):  # the console script: run its module instead
        command = [sys.executable, "-m", "plex", *command[1:]]
    done = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]], capture_output=True, text=True, env=env
    )
    rows = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(2)) <= 1:  # a top-level import (indent one space)
            rows.append((m.group(3), int(m.group(1))))
    return sorted(rows, key=lambda r: -r[1])[:count]


def print_module_costs(rounds: int, env: dict[str, str]) -> None:
    floor_cmd = [sys.executable, "-c", "pass"]
    costs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODULES}
    floors: list[tuple[float, float]] = []
    for _ in range(rounds):
        floors.append(timed(floor_cmd, env))
        for module in MODULES:
            costs[module].append(timed([sys.executable, "-c", f"import {module}"], env))
    floor_wall = statistics.median(w for w, _ in floors)
    floor_cpu = statistics.median(c for _, c in floors)
    print(
        "\n| import (fresh interpreter) | wall median s over the floor | CPU median s over floor |"
    )
    print("|---|---|---|")
    for module, values in costs.items():
        wall = statistics.median(w for w, _ in values) - floor_wall
        cpu = statistics.median(c for _, c in values) - floor_cpu
        print(f"| `{module}` | {wall:.3f} | {cpu:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--importtime", action="store_true", help="also show the costly imports")
    parser.add_argument(
        "--modules", action="store_true", help="also measure what importing each module costs"
    )
    parser.add_argument(
        "--baseline", type=Path, help="a src/ folder to time the same commands with, as a baseline"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="plex-cli-startup-") as tmp:
        work = Path(tmp)
        shutil.copytree(
            REPO / "examples" / "mlp", work / "mlp", ignore=shutil.ignore_patterns("*.mln")
        )
        env = {**os.environ, "PLEX_CACHE_DIR": str(work / "cache"), "COLUMNS": "120"}
        cmds = commands(work)
        envs = {name: env for name in cmds}
        if args.baseline is not None:
            base_env = {**env, "PYTHONPATH": str(args.baseline.resolve())}
            for name in list(cmds):
                if name in GOALS_S:
                    cmds[f"{name}, baseline"] = cmds[name]
                    envs[f"{name}, baseline"] = base_env
        timed(cmds["no-op rebuild (examples/mlp)"], env)  # the cold build: fills the cache
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
        for _ in range(args.rounds):
            for name, command in cmds.items():
                times[name].append(timed(command, envs[name]))
        load = os.getloadavg()[0]

        print(
            f"CLI start-up, {args.rounds} interleaved rounds; {platform.node()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}; load average {load:.1f} at the end\n"
        )
        print(
            "| command | wall median s | wall spread (min-max) s | CPU median s | "
            "CPU spread s | goal s (wall) | met |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, values in times.items():
            goal = GOALS_S.get(name.removesuffix(", baseline"))
            wall = [w for w, _ in values]
            cpu = [c for _, c in values]
            median = statistics.median(wall)
            met = "" if goal is None else ("yes" if median <= goal else "no")
            print(
                f"| {name} | {median:.3f} | {min(wall):.3f}-{max(wall):.3f} | "
                f"{statistics.median(cpu):.3f} | {min(cpu):.3f}-{max(cpu):.3f} | "
                f"{'' if goal is None else f'{goal:.2f}'} | {met} |"
            )
        if args.modules:
            print_module_costs(args.rounds, env)
        if args.importtime:
            for name, command in cmds.items():
                if name in GOALS_S:
                    rows = top_imports(command, env)
                    parts = ", ".join(f"{mod} {us / 1000:.0f} ms" for mod, us in rows)
                    print(f"\n{name}: costliest top-level imports (one run): {parts}")


if __name__ == "__main__":
    main()
