"""Two IREE compiles at once: in-process threads vs worker processes vs one after the other.

    python benchmarks/probes/compile_concurrency.py [--rounds 5] [--functions 4]

Both compiles take the same imported (input-phase) IR of two different modules to VM bytecode
with the same flags. Paths:
  serial          one thread compiles A, then B
  threads         two threads, one CompilerSession each (the C API releases the GIL)
  processes       two fresh spawned processes (what a per-build pool pays: start-up and the
                  compiler library load included)
  warm pool       two already started and warmed worker processes (only the work and the IPC)
Each round runs every path once, in a rotated order so that drift of this shared machine's speed
hits all paths alike. The table gives the median wall time over rounds, the spread (min-max),
the ratio to serial, the CPU time spent (this process for the in-process paths; the workers'
own, start-up included for fresh processes), and the peak memory the path added (main-process
VmHWM growth for the in-process paths; the workers' own peak RSS, summed, for the process paths).
On a machine shared with other work, wall time also measures how much of the CPU a path can
claim against the other load: compare CPU seconds for the cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import re
import resource
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


def _kib(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) if match else 0


def reset_peak() -> int:
    """Reset VmHWM to the current RSS (Linux); return the current RSS in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _kib("VmRSS")


def compile_bytes(imported: bytes) -> int:
    from myelin.compiler.session import CompilerSession

    with CompilerSession(FLAGS) as session:
        module = session.parse(imported)
        vmfb, _ = session.compile(module, compile_from="input")
    return len(vmfb)


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def worker_compile(imported: bytes) -> tuple[int, int, float]:
    """In a worker process: (VM bytecode size, its peak RSS in KiB, CPU seconds of the work)."""
    reset_peak()
    cpu = cpu_seconds()
    size = compile_bytes(imported)
    return size, _kib("VmHWM"), cpu_seconds() - cpu


def fresh_process(imported: bytes, queue) -> None:
    size = compile_bytes(imported)
    queue.put((size, _kib("VmHWM")))


Measured = tuple[int, float]  # (peak KiB added, CPU seconds)


def run_serial(sources: list[bytes]) -> Measured:
    before, cpu = reset_peak(), cpu_seconds()
    for s in sources:
        compile_bytes(s)
    return _kib("VmHWM") - before, cpu_seconds() - cpu


def run_threads(sources: list[bytes]) -> Measured:
    before, cpu = reset_peak(), cpu_seconds()
    threads = [threading.Thread(target=compile_bytes, args=(s,)) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _kib("VmHWM") - before, cpu_seconds() - cpu


def run_processes(sources: list[bytes]) -> Measured:
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    procs = [spawn.Process(target=fresh_process, args=(s, queue)) for s in sources]
    for p in procs:
        p.start()
    peaks = [queue.get()[1] for _ in procs]
    for p in procs:
        p.join()
    return sum(peaks), cpu_seconds(resource.RUSAGE_CHILDREN) - cpu


def run_pool(pool: ProcessPoolExecutor, sources: list[bytes]) -> Measured:
    results = list(pool.map(worker_compile, sources))
    return sum(r[1] for r in results), sum(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--functions", type=int, default=4, help="functions per module")
    args = parser.parse_args()

    from myelin.compiler.pipeline import import_graph
    from tests.plex.build_helpers import matmul_chain_mlir

    sources = [
        import_graph(
            matmul_chain_mlir(args.functions, name, first).encode(),
            input_type="auto",
            module_name=name,
            scope=name,
        ).module_bytecode
        for name, first in (("a", 8), ("b", 40))
    ]
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(worker_compile, sources))  # start and warm both workers
    paths = {
        "serial": lambda: run_serial(sources),
        "threads": lambda: run_threads(sources),
        "processes": lambda: run_processes(sources),
        "warm pool": lambda: run_pool(pool, sources),
    }
    walls: dict[str, list[float]] = {name: [] for name in paths}
    memory: dict[str, list[int]] = {name: [] for name in paths}
    cpus: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            peak, cpu = paths[name]()
            walls[name].append(time.perf_counter() - start)
            memory[name].append(peak)
            cpus[name].append(cpu)
    pool.shutdown()

    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, {args.rounds} rounds, "
        f"2 modules x {args.functions} functions"
    )
    print(
        "| path | wall s (median) | spread | vs serial (median) | ratio spread | CPU s (median) "
        "| peak MiB added |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in paths:
        ratios = [w / s for w, s in zip(walls[name], walls["serial"], strict=True)]
        print(
            f"| {name} | {statistics.median(walls[name]):.2f} | "
            f"{min(walls[name]):.2f}-{max(walls[name]):.2f} | {statistics.median(ratios):.2f}x | "
            f"{min(ratios):.2f}-{max(ratios):.2f} | {statistics.median(cpus[name]):.2f} | "
            f"{statistics.median(memory[name]) / 1024:.0f} |"
        )


if __name__ == "__main__":
    main()
