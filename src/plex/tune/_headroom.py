"""Whether a tuning package may apply anything: the tuned build must beat the untuned one by
more than the untuned build differs from itself.

A tuner that ships a slower build is worse than none (an outside GPT-2 ran at 0.92x its untuned
speed with a package `plex tune` wrote). So the last measurement of a run times the untuned build
twice, interleaved around the tuned one (untuned, tuned, untuned in every round): the relative
difference of the two untuned medians is this machine's noise at that moment, measured on the
same build, calls and inputs. Only a gain beyond it is applied; otherwise the package applies
nothing and says why."""

from __future__ import annotations

from dataclasses import dataclass

from myelin.tuning.timing import Timing


@dataclass(frozen=True)
class Headroom:
    """The final measurement and the decision drawn from it."""

    untuned: tuple[Timing, Timing]  # the untuned build, timed before and after the tuned one
    tuned: Timing
    outputs_equal: bool
    # the gain the tuned build must exceed; None: the measured noise. A caller may set its own
    # (a stricter bar, or a test that forces either decision with real measurements)
    required: float | None = None

    @property
    def untuned_s(self) -> float:
        a, b = self.untuned
        return (a.median_s + b.median_s) / 2

    @property
    def noise(self) -> float:
        """How far the untuned build's two interleaved medians are apart, relative to their
        mean."""
        a, b = self.untuned
        return abs(a.median_s - b.median_s) / self.untuned_s

    @property
    def threshold(self) -> float:
        return self.noise if self.required is None else self.required

    @property
    def speedup(self) -> float:
        return self.untuned_s / self.tuned.median_s

    @property
    def applies(self) -> bool:
        return self.outputs_equal and self.speedup - 1 > self.threshold

    def reason(self) -> str:
        """One line for the report: what was measured and what follows from it."""
        measured = (
            f"tuned {self.tuned.median_s * 1e3:.3f} ms vs untuned {self.untuned_s * 1e3:.3f} ms "
            f"({self.speedup:.3f}x); the untuned build differed from itself by {self.noise:.1%}"
        )
        bar = (
            "its measured noise"
            if self.required is None
            else f"the required gain ({self.required:.1%})"
        )
        if not self.outputs_equal:
            return f"applies nothing: the tuned build computes other outputs ({measured})"
        if self.applies:
            return f"applies the tuned configuration: faster by more than {bar} ({measured})"
        return (
            f"applies nothing: no headroom, the tuned build is not faster than the untuned one "
            f"by more than {bar} ({measured}); IREE's defaults stay"
        )
