"""`plex tune`: search tile configs for the hot contractions of one device, keep what measures
faster and computes the same, and write a tuning package the app selects with `[myelin] tuning`.

The flow (docs/tuning.md):
1. build the app for that device alone, untuned (the reference) and to its configured IR;
2. rank its contraction dispatches by measured time (IREE's HAL profile of real calls);
3. per hot dispatch: nevergrad asks a batch of configs from the space of `myelin.tuning.cpu`;
   configs that break a constraint are told a penalty without compiling; the rest become
   candidate specs, built concurrently through SYNaPSe (`plex.tune._candidates`), checked
   against the reference's outputs on random inputs and timed interleaved with it;
4. write the package: plex.toml, the spec, tuning.json (reused by later runs), tuning.png and
   summary.md.
Timing is of whole calls: IREE's per-dispatch benchmarks are not emitted for dynamic shapes and
read buffers nobody wrote (1.3-1.6x off on CPU).

Where: `_search` (the search loop: one round of proposals per dispatch, and how a measured one
is recorded; the local and the split flow both run it), `_local` (this flow), `_split` (a
device on another machine: `--bundle`, then `--collect`), `_kernels` (the kernel library's
Triton configs), `_candidates` / `_cuda` (the SYNaPSe jobs that build candidates), `_layouts`,
`_backend`, `_database` (tuning.json), `_report` (plot and summary).
"""

from __future__ import annotations

from plex.tune._local import (
    TrialSetup,
    TuneResult,
    _Candidates,  # noqa: F401  (what builds candidates; tests use it)
    package_name,
    tune,
)
from plex.tune._search import PENALTY, DispatchResult, Proposal, TuneError

# The split flow (--bundle / --collect) and kernel-config tuning, by their public names; their
# modules load when the CLI asks for them. public name -> (module, name there)
_SPLIT_NAMES: dict[str, tuple[str, str]] = {
    "make_bundle": ("plex.tune._split", "make_bundle"),
    "collect_bundle_results": ("plex.tune._split", "collect"),
    "next_commands": ("plex.tune._split", "next_commands"),
    "KERNEL_BUNDLE_KIND": ("plex.tune._kernels", "BUNDLE_KIND"),
    "make_kernel_bundle": ("plex.tune._kernels", "make_kernel_bundle"),
    "collect_kernel_results": ("plex.tune._kernels", "collect_kernel_results"),
    "read_results": ("plex.tune._kernels", "read_results"),
}


def __getattr__(name: str) -> object:
    if name in _SPLIT_NAMES:
        import importlib

        module, attribute = _SPLIT_NAMES[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'plex.tune' has no attribute {name!r}")


__all__ = [
    "PENALTY",
    "DispatchResult",
    "Proposal",
    "TrialSetup",
    "TuneError",
    "TuneResult",
    "package_name",
    "tune",
    *_SPLIT_NAMES,
]
