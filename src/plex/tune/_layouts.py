"""The weight-layout knob of `plex tune` (myelin.tuning.layout): for each hot GEMV-shaped
contraction that reads a parameter, the other stored layout (N x K vs K x N) is one candidate,
built with IREE's default tiles, checked against the reference's outputs and timed interleaved
with it. A layout is kept when it is faster; the tile search then runs on the kept layouts (a
spec's matcher names the indexing maps, which the layout changes).

GEMV-shaped: the contraction's M (the activation's rows) is at most GEMV_MAX_ROWS at the sizes
tuned (`--dim`), or IREE dropped it as a unit loop. There the weight is read once per call and
its order decides whether the reads stream; for larger M the tiles reuse the weight and the
order matters less (it is not searched).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from myelin.tuning.cpu import ConfiguredContraction

GEMV_MAX_ROWS = 8
# a layout is kept when its time over the default layout's, timed in the same batch, is below
KEEP_BELOW = 1.0


@dataclass
class LayoutTrial:
    """One layout candidate: the parameters it re-lays-out and what it measured."""

    dispatch: str
    keys: tuple[str, ...]  # "scope::key" of the parameters of that contraction's shape
    layout: str  # the stored layout tried ("nk" | "kn")
    status: str = "pending"  # ok | failed | mismatch | pending
    relative: float | None = None  # its time / the reference's, same batch
    spread: float | None = None
    kept: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def rules(self) -> tuple[tuple[str, str], ...]:
        return tuple((key, self.layout) for key in self.keys)

    def to_json(self) -> dict:
        return {
            "dispatch": self.dispatch,
            "keys": list(self.keys),
            "layout": self.layout,
            "status": self.status,
            "relative": self.relative,
            "spread": self.spread,
            "kept": self.kept,
        }


def gemv_shaped(c: ConfiguredContraction, dim_sizes: Sequence[int]) -> bool:
    """M at most GEMV_MAX_ROWS (a dynamic M: at every `--dim` size given, 1 when none)."""
    rows = 1
    for m in c.match.m:
        rows *= m if m is not None else max(dim_sizes, default=1)
    return rows <= GEMV_MAX_ROWS


def layout_trials(
    ranked: Sequence[ConfiguredContraction],
    parameters: Sequence[tuple[str, tuple[int, ...]]],
    dim_sizes: Sequence[int],
) -> list[LayoutTrial]:
    """One trial per hot GEMV-shaped contraction with static N and K that parameters of its
    weight's shape feed: the layout they are not stored in (both, for a square weight)."""
    trials = []
    seen: set[tuple[str, ...]] = set()
    for c in ranked:
        if not gemv_shaped(c, dim_sizes) or None in c.match.n or None in c.match.k:
            continue
        n, k = math.prod(c.match.n), math.prod(c.match.k)
        stored_nk = tuple(key for key, shape in parameters if shape == (n, k))
        stored_kn = tuple(key for key, shape in parameters if shape == (k, n))
        for keys, layout in ((stored_kn, "nk"), (stored_nk, "kn")):
            if keys and keys not in seen:
                seen.add(keys)
                trials.append(LayoutTrial(c.dispatch, keys, layout))
    return trials
