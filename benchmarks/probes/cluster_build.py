"""examples/llama in 4 variants, built by the local executor and on a 3-node Ray cluster on
loopback: wall time, tasks per worker, and what the cluster adds per task.

The 4 variants are two apps over the one package (a weight codec is an app-wide choice, so the
codec variant is its own app): `llama-targets` with CPU generic, CPU host and CUDA sm_80 (CUDA
compiles anywhere; nothing runs), then `llama-int8` (CPU host, every weight int8). Each executor
starts from an empty cache, so the second app reuses the first's import, as it would for a user.

The cluster is `ray.cluster_utils.Cluster` on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0): a
head with no CPUs for tasks and two workers of one CPU each. The local executor gets as many
threads as the workers have CPUs together, so both have the same CPUs and any difference is the
cluster's cost or gain. Per task, "overhead" is the node's time as the driver saw it (submit to
committed in the local cache and the shared cache) minus the step's own time on the worker and
minus the time it waited for a free CPU (queueing, which a local build has too).

    .venv/bin/python benchmarks/probes/cluster_build.py [--object-store-mb 600]

The object store of each node must hold the largest node output (the Llama import is ~225 MB of
float32 parameters); outputs beyond it spill to disk.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "llama"

TARGETS_APP = """\
[app]
name = "llama-targets"
packages = ["{package}"]

[devices.generic]
target = "llvm-cpu"
cpu = "generic"

[devices.host]
target = "llvm-cpu"
cpu = "host"

[devices.gpu]
target = "cuda"
arch = "sm_80"

[[variant]]
name = "cpu-generic"
devices = ["generic"]

[[variant]]
name = "cpu-host"
devices = ["host"]

[[variant]]
name = "cuda-sm80"
devices = ["gpu"]
"""

CODEC_APP = """\
[app]
name = "llama-int8"
packages = ["{package}"]

[devices.host]
target = "llvm-cpu"
cpu = "host"

[weights.codec]
"*" = "int8"
"""


def build_apps(apps: list[Path], out: Path, executor_spec: str) -> dict:
    """Build every app into `out` with one fresh cache; what ran where and how long."""
    from plex.builder import make_executor, plan_for
    from plex.builder.versions import fingerprint_salt
    from synapse import Cache

    cache = Cache(out / "cache")
    stats: dict = {
        "wall": 0.0,
        "steps": {},
        "workers": Counter(),
        "overhead": [],
        "queued": [],
        "mln": {},
    }
    for app in apps:
        output = out / f"{app.parent.name}.mln"
        _, plan = plan_for(app, output)
        executor = make_executor(
            executor_spec, cache, jobs=2, salt=fingerprint_salt(), on_event=None,
            memory_budget=2**30,
        )  # fmt: skip
        start = time.perf_counter()
        results = executor.run(plan)
        stats["wall"] += time.perf_counter() - start
        stats["mln"][app.parent.name] = output.read_bytes()
        for node_id, result in results.items():
            if result.status == "built":
                stats["steps"][f"{app.parent.name}/{node_id}"] = result.seconds
        for node_id, placement in getattr(executor, "placements", {}).items():
            stats["workers"][placement.node_id] += 1
            waited = executor.queued_seconds[node_id]
            stats["queued"].append(waited)
            stats["overhead"].append(
                results[node_id].seconds - executor.step_seconds[node_id] - waited
            )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--object-store-mb", type=int, default=600)
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    work = Path(tempfile.mkdtemp(prefix="cluster-build-"))
    try:
        apps = []
        for name, text in (("targets", TARGETS_APP), ("int8", CODEC_APP)):
            (work / name).mkdir()
            (work / name / "app.toml").write_text(text.format(package=LLAMA.as_posix()))
            apps.append(work / name / "app.toml")

        local = build_apps(apps, work / "local", "local")
        print(f"local: {local['wall']:.1f} s", flush=True)

        import ray
        from ray.cluster_utils import Cluster

        store = args.object_store_mb * 1_000_000
        t0 = time.perf_counter()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": store,
            },
        )
        try:
            workers = [
                cluster.add_node(
                    num_cpus=1, resources={f"builder_{n}": 1}, object_store_memory=store
                )
                for n in "ab"
            ]
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, namespace="synapse", log_to_driver=False)
            start_s = time.perf_counter() - t0
            print(f"cluster up in {start_s:.1f} s at {cluster.address}", flush=True)
            os.environ["PLEX_CLUSTER_CACHE"] = str(work / "shared")
            remote = build_apps(apps, work / "ray", "ray")
            names = {w.node_id: f"worker {n}" for w, n in zip(workers, "ab", strict=True)}
        finally:
            ray.shutdown()
            cluster.shutdown()

        same = all(remote["mln"][k] == v for k, v in local["mln"].items())
        overhead = remote["overhead"]
        print()
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}")
        print(f"cluster start: {start_s:.1f} s (not in the build times); object store "
              f"{args.object_store_mb} MB per node")  # fmt: skip
        print(f"artifacts byte-identical to the local build: {same}")
        print()
        print("| executor | wall s (both apps) | steps run | tasks per worker |")
        print("|---|---|---|---|")
        print(f"| local (2 threads) | {local['wall']:.1f} | {len(local['steps'])} | - |")
        per_worker = ", ".join(
            f"{names.get(n, n[:8])}: {c}" for n, c in sorted(remote["workers"].items(), key=str)
        )
        print(f"| ray, 2 workers x 1 CPU | {remote['wall']:.1f} | {len(remote['steps'])} | "
              f"{per_worker} |")  # fmt: skip
        print(f"| ratio ray / local | {remote['wall'] / local['wall']:.2f}x | | |")
        print()
        queued = remote["queued"]
        print("overhead per task (driver-observed minus the step on its worker minus the wait "
              f"for a free CPU), {len(overhead)} tasks: "
              f"median {statistics.median(overhead):.2f} s, min {min(overhead):.2f} s, "
              f"max {max(overhead):.2f} s, total {sum(overhead):.1f} s; "
              f"waiting for a CPU: total {sum(queued):.1f} s")  # fmt: skip
        print()
        print("| step | local s | ray s |")
        print("|---|---|---|")
        for step in sorted(local["steps"], key=lambda s: -local["steps"][s]):
            print(f"| {step} | {local['steps'][step]:.1f} | {remote['steps'].get(step, 0):.1f} |")
        if not same:
            sys.exit("the cluster's artifacts differ from the local build's")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
