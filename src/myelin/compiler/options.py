"""Compiler options PLeX sets beyond the target flags, one definition each (light: no IREE
import, so planning a build does not load the compiler)."""

from __future__ import annotations

from collections.abc import Sequence

from myelin.compiler.targets import TargetDevice, target_flags

# Constants at least this large become parameters; smaller ones (shape constants, tiny tables)
# stay in the module where the compiler can fold them.
DEFAULT_MIN_PARAMETER_BYTES = 256

# `[runtime] cancellable`: entrypoints take wait/signal fences (IREE's async-external ABI), so
# the runtime can stop waiting on a running call; costs ~1.5 us per call on the CPU.
CANCELLABLE_FLAGS = ("--iree-execution-model=async-external",)


def variant_flags(devices: Sequence[TargetDevice], *, cancellable: bool = False) -> list[str]:
    """The compiler flags of one variant: its target devices, then the execution model."""
    return [*target_flags(devices), *(CANCELLABLE_FLAGS if cancellable else ())]
