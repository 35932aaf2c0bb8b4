"""Where one MiniLM call's wall time goes: MyeLiN's call path by stage, and each thread's time.

    python benchmarks/probes/minilm_call_split.py [--app blas|untiled]
        [--driver local-task|local-sync]
                                           [--batch 1] [--calls 30] [--threads N]
                                           [--spin-us S] [--iree-flag F ...]

Builds examples/minilm (`--app blas`: its matmuls, attentions and GELUs on the BLAS backend, as
benchmarks/probes/minilm_cpu.py does; `--app untiled`: IREE codegen only, no data tiling), then
times:

1. `session.resolve("forward")(ids, mask)` end to end, and over the same calls each thread's
   time from Linux's schedstat: on a CPU, runnable but waiting for a CPU (other processes, or
   the call's own threads, on the cores), and timeslices (about one per wake-up);
2. the same call by hand through `iree.runtime` (the packer, `VmContext.invoke`, the fence
   wait, the result copy), so each stage has its own time. It reads private members of
   `ResolvedCall` on purpose: the stages are its internals, and this is their measurement.

Why schedstat and not a profile capture: `plex profile` runs the call in `iree-run-module`, a
different process at a different time; the thread times here are of the benchmark's own calls.
`--iree-flag` passes IREE runtime flags (e.g. `--task_worker_spin_us=0`) before any device.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minilm_cpu  # this folder's sibling benchmark: its apps and inputs


def thread_times() -> dict[str, tuple[str, int, int, int]]:
    """tid -> (name, ns on a CPU, ns runnable waiting for a CPU, timeslices) of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            run, wait, slices = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (name, int(run), int(wait), int(slices))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", choices=("blas", "untiled"), default="blas")
    parser.add_argument(
        "--driver", choices=("local-task", "local-sync"), default="local-task", help="--app blas"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="0: IREE's default (all cores)")
    parser.add_argument("--spin-us", type=float, default=0.0, help="model.session(spin_us=)")
    parser.add_argument("--iree-flag", action="append", default=[])
    args = parser.parse_args()
    import iree.runtime as rt

    flags = list(args.iree_flag)
    if args.threads:
        flags.append(f"--task_topology_group_count={args.threads}")
    if flags:  # before any device exists: IREE reads them when it creates the driver
        rt.flags.parse_flags(*flags)
    import myelin
    from myelin.runtime._iree_private import InvokeContext
    from myelin.runtime.sinks import converted
    from plex.builder import build

    example = minilm_cpu.load_example()
    with tempfile.TemporaryDirectory(prefix="minilm-split-") as tmp:
        folder = Path(tmp)
        if args.app == "blas":
            app = minilm_cpu.blas_app(folder, args.driver)
        else:
            app = minilm_cpu.untiled_app(folder)
        build(app, folder / "model.mln")
        model = myelin.Instance(allow_native_code=True).load(folder / "model.mln")
        if args.app == "blas" and args.threads:
            from myelin.runtime.backends import set_backend_threads

            set_backend_threads(args.threads)
        session = model.session(spin_us=args.spin_us)
        call = session.resolve("forward")
        ids, mask = minilm_cpu.inputs(example, args.batch, args.seq)
        for _ in range(3):
            call(ids, mask)

        before, start = thread_times(), time.perf_counter()
        walls = []
        for _ in range(args.calls):
            t = time.perf_counter_ns()
            call(ids, mask)
            walls.append(time.perf_counter_ns() - t)
        elapsed, after = time.perf_counter() - start, thread_times()

        device, stages = call._device, []
        clock = time.perf_counter_ns
        cpu = time.thread_time_ns  # the calling thread's own CPU time, per stage
        for _ in range(args.calls):
            marks = [(clock(), cpu())]
            ready = call._fast_arguments((ids, mask))
            marks.append((clock(), cpu()))
            vm_args = call._packer.pack(InvokeContext(device), ready, {})
            results = rt.VmVariantList(1)
            if call._async:
                wait, signal = session._fences(device)
                vm_args.push_ref(wait)
                vm_args.push_ref(signal)
            marks.append((clock(), cpu()))
            session._context.invoke(call._function, vm_args, results)
            marks.append((clock(), cpu()))
            if call._async:
                signal.wait()
            marks.append((clock(), cpu()))
            converted(call, results, to_host=True)
            marks.append((clock(), cpu()))
            marks.append(marks[0])  # the last "stage": the whole, last mark minus the first
            stages.append([(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(marks)])
            stages[-1][-1] = (marks[-2][0] - marks[0][0], marks[-2][1] - marks[0][1])
        session.close()
        model.close()

    n = args.calls
    print(
        f"# {args.app} ({args.driver}) batch {args.batch} seq {args.seq}, "
        f"threads {args.threads or 'default'}, "
        f"flags {flags or 'none'}, spin_us {args.spin_us}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"session call: median {statistics.median(walls) / 1e6:.2f} ms "
        f"(min {min(walls) / 1e6:.2f}, max {max(walls) / 1e6:.2f}); "
        f"{elapsed / n * 1e3:.2f} ms per call over the loop"
    )
    print("| thread | on a CPU ms/call | runnable, waiting for a CPU ms/call | timeslices/call |")
    print("|---|---|---|---|")
    for tid, (name, run, wait, slices) in after.items():
        if tid in before and (run - before[tid][1]) / n > 50_000:  # threads that worked
            _, run0, wait0, slices0 = before[tid]
            print(
                f"| {name} ({tid}) | {(run - run0) / n / 1e6:.2f} | {(wait - wait0) / n / 1e6:.2f}"
                f" | {(slices - slices0) / n:.1f} |"
            )
    print(
        "| stage (by hand through iree.runtime) | wall median ms | min | max "
        "| calling thread's CPU, median ms |"
    )
    print("|---|---|---|---|---|")
    names = ("input check", "pack (+ fences)", "VmContext.invoke", "fence wait", "result copy")
    for i, name in enumerate((*names, "total")):
        xs = [s[i][0] / 1e6 for s in stages]
        cpus = [s[i][1] / 1e6 for s in stages]
        print(
            f"| {name} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} "
            f"| {statistics.median(cpus):.3f} |"
        )


if __name__ == "__main__":
    main()
