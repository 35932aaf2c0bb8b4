"""Timing candidate artifacts against each other, runtime only (no compiler needed: the same
code times candidates on a machine that has only iree-base-runtime).

Candidates are timed interleaved (one round calls each artifact in turn, so drift and a noisy
neighbour hit all of them alike), after warm-up calls, and summarized by the median of the
rounds with their spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Timing:
    median_s: float  # per call
    spread: float  # (max - min) / median over the rounds
    rounds: int

    def to_json(self) -> dict:
        return {"median_s": self.median_s, "spread": self.spread, "rounds": self.rounds}


def tuning_instance() -> Any:
    """The Instance the tuner loads its candidates into. A candidate is a build the tuner made
    itself from the app's own sources, backend plugins included (compiled from the app's C
    files), so their native code is allowed (docs/security.md, "Native code: backend plugins")."""
    import myelin

    return myelin.Instance(allow_native_code=True)


def outputs_of(
    artifact: Path, function: str, inputs: Sequence[np.ndarray], instance: Any = None
) -> list[np.ndarray]:
    """The outputs of one call; `instance`: a myelin.Instance to load into (one per process
    saves creating a device per artifact)."""
    instance = instance or tuning_instance()
    with instance.load(artifact) as model, model.session() as session:
        result = session.call(function, *inputs)
    return list(result) if isinstance(result, tuple | list) else [result]


def same_outputs(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> bool:
    """Equal up to float reassociation (a new tiling sums K in another order)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        if np.issubdtype(w.dtype, np.floating):
            scale = float(np.max(np.abs(w))) if w.size else 0.0
            if not np.allclose(g, w, rtol=rtol, atol=atol * max(1.0, scale)):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def time_interleaved(
    artifacts: Sequence[Path],
    function: str,
    inputs: Sequence[np.ndarray],
    *,
    warmup: int = 2,
    rounds: int = 5,
    min_round_s: float = 0.02,
    resident: bool = False,
    instance: Any = None,
) -> list[Timing]:
    """Per-call time of `function` in each artifact, rounds interleaved across artifacts.

    `resident`: the inputs are uploaded to each call's device once and results stay there, so
    a GPU call is timed without its host copies (a 470 MB GEMV weight would otherwise travel on
    every call and hide the kernel)."""
    import iree.runtime as rt

    instance = instance or tuning_instance()
    models = [instance.load(a) for a in artifacts]
    sessions = [m.session() for m in models]
    try:
        calls = [s.resolve(function) for s in sessions]
        output = "device" if resident else "numpy"
        args = [
            [rt.asdevicearray(c._device, x) for x in inputs] if resident else list(inputs)
            for c in calls
        ]
        per_round = []
        for call, a in zip(calls, args, strict=True):  # warm-up; calls that make a round
            for _ in range(warmup):
                call(*a, output=output)
            start = time.perf_counter()
            call(*a, output=output)
            one = max(time.perf_counter() - start, 1e-6)
            per_round.append(max(1, min(1000, int(min_round_s / one))))
        samples: list[list[float]] = [[] for _ in calls]
        for _ in range(rounds):
            for i, call in enumerate(calls):
                start = time.perf_counter()
                for _ in range(per_round[i]):
                    call(*args[i], output=output)
                samples[i].append((time.perf_counter() - start) / per_round[i])
        del args
    finally:
        for s in sessions:
            s.close()
        for m in models:
            m.close()
    result = []
    for values in samples:
        median = statistics.median(values)
        result.append(Timing(median, (max(values) - min(values)) / median, len(values)))
    return result
