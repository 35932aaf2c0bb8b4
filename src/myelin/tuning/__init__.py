"""Tuning specs: which IREE flag applies one on each target, how PLeX proves it applied, and the
search spaces PLeX tunes over (`myelin.tuning.cpu`, `myelin.tuning.cuda`; GPU candidates from
IREE's own constraints: `myelin.tuning.smt`), plus the stored weight layout knob
(`myelin.tuning.layout`).

Compiler-free except where a function says so: the runtime side of a split tuning run (timing
candidates on a machine without the compiler) imports only `myelin.tuning.timing`.
"""

from myelin.tuning.spec import (
    MARKER,
    ContractionMatch,
    count_marked,
    instrument_spec,
    render_spec,
    spec_flag,
)

__all__ = [
    "MARKER",
    "ContractionMatch",
    "count_marked",
    "instrument_spec",
    "render_spec",
    "spec_flag",
]
