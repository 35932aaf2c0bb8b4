"""Attention on llvm-cpu: matmul, softmax, matmul instead of IREE's fused op.

IREE 3.13 lowers `iree_linalg_ext.attention` on llvm-cpu to one online-softmax loop nest that
runs far below the CPU's matmul speed: 12 heads x 197 tokens x 64 took 82 ms where torch takes
1.6 ms. The same attention as two batch matmuls around a softmax runs through IREE's matmul
code generation (and its mmt4d microkernels under data tiling) instead. Each covered attention
(myelin.compiler.backend_attention.why_not) of a variant whose devices are all llvm-cpu is
replaced, at the input phase, by a call of a private function computing that decomposition
(backend_attention.decompose_attention). The score matrix [batch*heads, L, S] is materialized
(the fused op keeps it in tiles): transient, 1.8 MiB for ViT-B/16's 12 x 197 x 197.

Attentions of dynamic shapes are decomposed on llvm-cpu only without data tiling: with a dynamic
batch and sequence (the MiniLM example) IREE 3.13 fails to compile the decomposition under data
tiling ("'affine.delinearize_index' op no basis element may be statically non-positive"), so
there those keep the fused op. Without data tiling (an app with encoded weights, a causal LM's
prefill and decode, whose lengths are dynamic) the decomposition compiles, and a Llama prefill's
attention at 128 tokens ran ...x faster than the fused op.

vulkan-spirv variants get the decomposition too, dynamic shapes included (no data tiling
there): IREE 3.13's SPIR-V pipeline cannot lower the fused op at all, so without it a model
using `scaled_dot_product_attention` (examples/minilm) does not compile for Vulkan.
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir

from myelin.compiler.backend_attention import ATTENTION, decompose_attention, why_not
from myelin.compiler.targets import TargetDevice

FUNCTION_PREFIX = "plex_cpu_attention"


def applies(devices: Sequence[TargetDevice]) -> bool:
    """Whether a variant's attentions are decomposed: only where every device is llvm-cpu, or
    every device is vulkan-spirv (CUDA lowers the fused op well, and one module's op cannot be
    split by device here)."""
    targets = {d.target for d in devices}
    return targets == {"llvm-cpu"} or targets == {"vulkan-spirv"}


def _dynamic_ok(devices: Sequence[TargetDevice]) -> bool:
    """Dynamic shapes: on vulkan-spirv, and on llvm-cpu without data tiling (the failure is
    data tiling's)."""
    return all(d.target == "vulkan-spirv" or not d.data_tiling for d in devices)


def _static(op: ir.Operation) -> bool:
    tensors = [v.type for v in op.operands if isinstance(v.type, ir.RankedTensorType)]
    return all(ir.RankedTensorType(t).has_static_shape for t in tensors)


def decompose_cpu_attentions(module: ir.Operation, devices: Sequence[TargetDevice]) -> int:
    """Decompose every covered attention of `module` (of static shapes on llvm-cpu); the number
    decomposed."""
    found: list[ir.Operation] = []
    dynamic_ok = _dynamic_ok(devices)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == ATTENTION and why_not(op) is None and (dynamic_ok or _static(op)):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for index, op in enumerate(found):
        decompose_attention(module, op, f"{FUNCTION_PREFIX}_{index}")
    return len(found)
