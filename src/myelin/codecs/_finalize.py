"""The codec's last choices for one variant, made the same way wherever a graph is finalized:
the compile step, the no-materialization check that mirrors it, and the kernels step.

The encode step writes one graph for every variant, so it leaves choices open in the IR: CPU
tiles on matvecs (`_matvec`), marked matvec regions a CPU kernel can take (`_cpu_kernels`),
q4 kernel forms for Hopper (`_q4_gpu`) and load-time forms for data tiling (`_loadtime`), the
last two carried as two forms of one contraction (`_forms`). `finalize` settles them all for the
variant's devices in one order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iree.compiler import ir

from myelin.codecs._cpu_kernels import apply_kernels as apply_cpu_kernels
from myelin.codecs._cpu_kernels import select as select_cpu_kernels
from myelin.codecs._loadtime import choose_forms
from myelin.codecs._matvec import apply_cpu_tiles
from myelin.codecs._q4_gpu import choose_kernel_forms


@dataclass(frozen=True)
class FinalForms:
    """What `finalize` chose, for records and reports."""

    cpu_tiled: int  # matvecs that took the codec's CPU tiles
    cpu_matvecs: tuple[str, ...]  # "<kernel> KxN" of each matvec a CPU kernel runs
    kernel_forms: tuple[str, ...]  # "scope::key" of each q4 kernel form kept (kernels step)
    decoded_at_load: tuple[str, ...]  # "scope::key" of each use decoded at load (data tiling)


def decodes_at_load(devices: Sequence[Any]) -> bool:
    """Whether a variant on these devices (myelin.compiler.targets.TargetDevice) decodes its
    encoded matmul weights once at load into data tiling's packed layout instead of inside
    each call (myelin.codecs._loadtime): every device a data-tiled llvm-cpu one."""
    return bool(devices) and all(d.target == "llvm-cpu" and d.data_tiling for d in devices)


def finalize(
    module: ir.Operation, devices: Sequence[Any], *, kernel_forms: bool = False
) -> FinalForms:
    """Settle every choice the encode step left open, for a variant on `devices`
    (myelin.compiler.targets.TargetDevice): the CPU tiles where every device is llvm-cpu
    (dropped elsewhere), marked matvecs in the CPU kernels the one device's CPU has (else
    IREE's code), the q4 kernel form if `kernel_forms` (the kernels step, which then puts
    the Hopper kernel in its place) else the fused one, and the load-time form where every
    device is data-tiled llvm-cpu (else the fused decode). Runs inside the module's context."""
    cpu = bool(devices) and all(d.target == "llvm-cpu" for d in devices)
    return FinalForms(
        cpu_tiled=apply_cpu_tiles(module, cpu),
        cpu_matvecs=tuple(apply_cpu_kernels(module, select_cpu_kernels(devices))),
        kernel_forms=tuple(choose_kernel_forms(module, kernel_forms)),
        decoded_at_load=tuple(choose_forms(module, decodes_at_load(devices))),
    )
