"""`plex tune --executor ray`: candidate compiles are SYNaPSe nodes (CPU tasks on the cluster,
through the build's executor), and each batch's timing is one task that claims a GPU, so that
one trial runs per GPU at a time and a compile never shares the device being measured.

The timing task receives the artifacts' bytes, not their paths: a worker need not see the
driver's cache. Results come back to the driver, which writes the one tuning database. The CPU
path claims the same resources, so that a cluster with GPU workers times CPU candidates there
too (and the rule is testable where no GPU exists: the test's worker offers a stand-in GPU).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np

from myelin.tuning.timing import Timing, time_interleaved

# What one timing task claims on a cluster (synapse's Job.resources vocabulary).
TIMING_RESOURCES = MappingProxyType({"GPU": 1, "CPU": 1})

Timer = Callable[[Sequence[Path], str, Sequence[np.ndarray], int], list[Timing]]


def local_timer(
    artifacts: Sequence[Path], function: str, inputs: Sequence[np.ndarray], rounds: int
) -> list[Timing]:
    return time_interleaved(artifacts, function, inputs, rounds=rounds)


def make_timer(executor: str, log: Callable[[str], None]) -> Timer:
    """Where a batch is timed: here for the local executor, else a GPU-claiming Ray task."""
    from plex.manifest import parse_executor

    if parse_executor(executor).kind == "local":
        return local_timer

    def timer(
        artifacts: Sequence[Path], function: str, inputs: Sequence[np.ndarray], rounds: int
    ) -> list[Timing]:
        from synapse import call_with_resources

        blobs = [Path(a).read_bytes() for a in artifacts]
        timings, placement = call_with_resources(
            time_on_worker, blobs, function, list(inputs), rounds,
            resources=TIMING_RESOURCES, name="tune-timing",
        )  # fmt: skip
        log(f"  timed {len(artifacts)} artifacts on worker {placement}")
        return timings

    return timer


def time_on_worker(
    blobs: list[bytes], function: str, inputs: list[np.ndarray], rounds: int
) -> list[Timing]:
    """The task: the artifacts written to a private folder, then timed interleaved."""
    with tempfile.TemporaryDirectory(prefix="plex-tune-timing-") as work:
        paths = []
        for i, blob in enumerate(blobs):
            path = Path(work, f"{i}.mln")
            path.write_bytes(blob)
            paths.append(path)
        return time_interleaved(paths, function, inputs, rounds=rounds)
