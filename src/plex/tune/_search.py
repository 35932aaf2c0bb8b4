"""The search loop of `plex tune`, one for the local and the split flow: per hot dispatch,
rounds of nevergrad proposals over its config space. A round (`next_batch`) seeds an optimizer
for the round, tells it every trial so far and asks up to a batch of valid configs (a config
that breaks a constraint is told a penalty and recorded without compiling); the flow measures
them (locally: built, timed beside the reference, checked against its outputs; split: built
here, timed on the device's machine, told at `--collect`) and records each (`trial_of`,
`record`). The state between rounds is the trials themselves, so a round can run in another
process, or after `--resume`, and continue the same search."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from plex.errors import PlexError

if TYPE_CHECKING:
    from myelin.tuning.cpu import ConfiguredContraction, CpuTarget

PENALTY = 1e3  # told for configs that are rejected, fail to build or compute something else


class TuneError(PlexError):
    """`plex tune` cannot tune what was asked."""


@dataclass
class DispatchResult:
    dispatch: str
    describe: str
    key: str
    share: float  # of the profiled call time
    default_config: str
    trials: list[dict] = field(default_factory=list)
    best: dict | None = None
    reused: bool = False


@dataclass
class Proposal:
    """One asked config: what the search chose, the config it is, why it breaks a constraint
    (empty: valid) and the `compilation_info` a spec applies."""

    choice: dict
    config: dict
    why: list[str]
    info: str


def cpu_proposal(c: ConfiguredContraction, choice: dict, target: CpuTarget) -> Proposal:
    """An asked llvm-cpu choice as tiles for this contraction, checked against the target."""
    from myelin.tuning.cpu import tiles_from_choice

    tiles = tiles_from_choice(choice, c.match, target)
    why = tiles.violations(c.match, target)
    return Proposal(choice, tiles.to_json(), why, "" if why else tiles.compilation_info(c.match))


def make_optimizer(knobs: dict, trials: int, batch: int, seed: int, told: Sequence[dict]):
    """nevergrad's discrete (1+1) over the knobs, seeded, told every trial measured before: the
    state a later round (`--resume`, or a split run's `--collect`) continues from."""
    import nevergrad as ng

    parametrization = ng.p.Dict(**{k: ng.p.Choice(list(v)) for k, v in knobs.items()})
    parametrization.random_state = np.random.RandomState(seed)
    optimizer = ng.optimizers.DiscreteOnePlusOne(
        parametrization=parametrization, budget=trials * 200, num_workers=batch
    )
    for old in told:
        if old.get("choice") is not None:
            optimizer.tell(parametrization.spawn_child(new_value=old["choice"]), old["value"])
    return optimizer


def ask(
    optimizer, propose: Callable[[dict], Proposal], wanted: int, budget: int, result
) -> tuple[list, int]:
    """Up to `wanted` valid proposals (and how many were asked); an invalid one is told the
    penalty and recorded as rejected without compiling."""
    pending: list = []
    asked = 0
    while len(pending) < wanted and asked < budget:
        cand = optimizer.ask()
        asked += 1
        proposal = propose(dict(cand.value))
        if proposal.why:
            optimizer.tell(cand, PENALTY)
            result.trials.append(
                {
                    "choice": proposal.choice,
                    "config": proposal.config,
                    "status": "rejected",
                    "why": proposal.why[0],
                    "value": PENALTY,
                }
            )
            continue
        pending.append((cand, proposal))
    return pending, asked


def record(result: DispatchResult, trial: dict) -> None:
    """Append a measured trial; keep it as the best if it is the fastest that computed right."""
    result.trials.append(trial)
    if trial["status"] == "ok" and (
        result.best is None or trial["relative"] < result.best["relative"]
    ):
        result.best = {
            k: trial[k] for k in ("config", "relative", "median_s", "default_s") if k in trial
        }
        if "info" in trial:
            result.best["info"] = trial["info"]


def entry_of(result: DispatchResult, c: ConfiguredContraction, target: str, iree: str) -> dict:
    """The tuning.json entry of one dispatch (the same for the local and the split flow)."""
    return {
        "dispatch": c.dispatch,
        "op": c.match.to_json(),
        "describe": c.match.describe(),
        "target": target,
        "iree": iree,
        "trials": result.trials,
        "best": result.best,
        "default_config": c.default_config,
    }


# A seed per dispatch and round: each round asks a new stream of proposals, told the old trials.
_ROUND_STRIDE = 7919


def round_seed(seed: int, round_: int) -> int:
    return seed + _ROUND_STRIDE * round_


def completed(result: DispatchResult) -> int:
    """Trials that count against the budget: every one but those rejected without compiling."""
    return sum(1 for t in result.trials if t["status"] != "rejected")


def next_batch(
    result: DispatchResult,
    knobs: dict,
    propose: Callable[[dict], Proposal],
    trials: int,
    batch: int,
    seed: int,
) -> list[Proposal]:
    """One round for one dispatch: up to `batch` valid proposals (fewer near the budget of
    `trials`), from an optimizer seeded with `seed` and told every trial so far; empty when the
    dispatch has its trials or the space gave nothing valid."""
    done = completed(result)
    if done >= trials:
        return []
    optimizer = make_optimizer(knobs, trials, batch, seed, result.trials)
    pending, _ = ask(optimizer, propose, min(batch, trials - done), trials * 200, result)
    return [proposal for _, proposal in pending]


def trial_of(
    proposal: Proposal,
    status: str,
    *,
    relative: float | None = None,
    median_s: float | None = None,
    spread: float | None = None,
    default_s: float | None = None,
    info: bool = False,
) -> dict:
    """The record of one measured proposal: "ok" with its time relative to the reference's
    (the value the optimizer minimizes), or why not ("failed" to build, "mismatch" in its
    outputs, ...) with the penalty. `info` keeps the spec text (the split flow's bundle)."""
    trial: dict = {"choice": proposal.choice, "config": proposal.config}
    if info:
        trial["info"] = proposal.info
    if status != "ok":
        return {**trial, "status": status, "value": PENALTY}
    return {
        **trial,
        "status": "ok",
        "value": relative,
        "relative": relative,
        "median_s": median_s,
        "spread": spread,
        "default_s": default_s,
    }
