"""Attention on llvm-cpu: matmul, softmax, matmul instead of IREE's fused op.

IREE 3.13 lowers `iree_linalg_ext.attention` on llvm-cpu to one online-softmax loop nest that
runs far below the CPU's matmul speed: 12 heads x 197 tokens x 64 took 82 ms where torch takes
1.6 ms. The same attention as two batch matmuls around a softmax runs through IREE's matmul
code generation (and its mmt4d microkernels under data tiling) instead. Each covered attention
(myelin.compiler.backend_attention.why_not) of a variant whose devices are all llvm-cpu is
replaced, at the input phase, by a call of a private function computing that decomposition
(backend_attention.decompose_attention). The score matrix [batch*heads, L, S] is materialized
(the fused op keeps it in tiles): transient, 1.8 MiB for ViT-B/16's 12 x 197 x 197.

Only attentions of static shapes are decomposed: with a dynamic batch and sequence (the MiniLM
example) IREE 3.13 fails to compile the decomposition under data tiling ("'affine.
delinearize_index' op no basis element may be statically non-positive"), so those keep the
fused op.
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir

from myelin.compiler.backend_attention import ATTENTION, decompose_attention, why_not
from myelin.compiler.targets import TargetDevice

FUNCTION_PREFIX = "plex_cpu_attention"


def applies(devices: Sequence[TargetDevice]) -> bool:
    """Whether a variant's attentions are decomposed: only where every device is llvm-cpu (a GPU
    lowers the fused op well, and one module's op cannot be split by device here)."""
    return bool(devices) and all(d.target == "llvm-cpu" for d in devices)


def _static(op: ir.Operation) -> bool:
    tensors = [v.type for v in op.operands if isinstance(v.type, ir.RankedTensorType)]
    return all(ir.RankedTensorType(t).has_static_shape for t in tensors)


def decompose_cpu_attentions(module: ir.Operation) -> int:
    """Decompose every covered attention of `module`; the number decomposed."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == ATTENTION and why_not(op) is None and _static(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for index, op in enumerate(found):
        decompose_attention(module, op, f"{FUNCTION_PREFIX}_{index}")
    return len(found)
