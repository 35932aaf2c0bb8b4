"""Attention on llvm-cpu: matmul, softmax, matmul instead of IREE's fused op.

IREE 3.13 lowers `iree_linalg_ext.attention` on llvm-cpu to one online-softmax loop nest that
runs far below the CPU's matmul speed: 12 heads x 197 tokens x 64 took 82 ms where torch takes
1.6 ms. The same attention as two batch matmuls around a softmax runs through IREE's matmul
code generation (and its mmt4d microkernels under data tiling) instead. Each covered attention
(myelin.compiler.backend_attention.why_not) of a variant whose devices are all llvm-cpu is
replaced, at the input phase, by a call of a private function computing that decomposition
(backend_attention.decompose_attention). The score matrix [batch*heads, L, S] is materialized
(the fused op keeps it in tiles): transient, 1.8 MiB for ViT-B/16's 12 x 197 x 197.

Attentions of dynamic shapes (a causal LM's prefill and decode) are decomposed too. Under data
tiling their batch matmuls would fail to compile in IREE 3.13 ("'affine.delinearize_index' op no
basis element may be statically non-positive"), so there they get a `compilation_info`
(UNTILED_MATMUL): IREE's data tiling leaves an op with a preset strategy alone, and they run
IREE's plain matmul code. A 2-layer TinyLlama prefill of 128 tokens (data-tiled) spent 718 ms
in the fused attentions and about 85 ms in their decomposition (docs/llm.md).

A causal LM's keys and values reach its attentions from the cache rows ([slot, batch * heads,
head_dim], myelin.frontends.causal_lm) through a transpose into [batch * heads, slot, head_dim]
that IREE materialized: a copy of every held key and value, two a layer and call, growing with
the tokens held. On llvm-cpu the decomposition reads such operands in the rows' layout instead
(backend_attention.cache_rows_source): its products are generic contractions indexing the rows.
A TinyLlama-1.1B decode step lost 44 of its 492 dispatches (docs/llm.md). IREE's bf16 demotion
takes named matmuls only, so under `compute = "bf16"` these products stay f32.

vulkan-spirv variants get the decomposition too, dynamic shapes included (no data tiling
there): IREE 3.13's SPIR-V pipeline cannot lower the fused op at all, so without it a model
using `scaled_dot_product_attention` (examples/minilm) does not compile for Vulkan.
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir

from myelin.compiler.backend_attention import (
    ATTENTION,
    PRODUCT_MARK,
    decompose_attention,
    why_not,
)
from myelin.compiler.targets import TargetDevice

FUNCTION_PREFIX = "plex_cpu_attention"


def applies(devices: Sequence[TargetDevice]) -> bool:
    """Whether a variant's attentions are decomposed: only where every device is llvm-cpu, or
    every device is vulkan-spirv (CUDA lowers the fused op well, and one module's op cannot be
    split by device here)."""
    targets = {d.target for d in devices}
    return targets == {"llvm-cpu"} or targets == {"vulkan-spirv"}


def _dynamic_ok(devices: Sequence[TargetDevice]) -> bool:
    return all(d.target in ("llvm-cpu", "vulkan-spirv") for d in devices)


def _data_tiled(devices: Sequence[TargetDevice]) -> bool:
    return any(d.target == "llvm-cpu" and d.data_tiling for d in devices)


# The batch matmuls of a dynamic attention's decomposition under data tiling: IREE's own matmul
# code (its SetEncoding skips an op with a preset compilation_info), 16 f32 lanes of AVX-512 wide.
UNTILED_MATMUL = (
    "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
    "distribution = [1, 64, 64, 0], vector_common_parallel = [1, 8, 16, 0], "
    "vector_reduction = [0, 0, 0, 1]>, translation_info = #iree_codegen.translation_info<"
    "pipeline = #iree_cpu.pipeline<DoubleTilingExpert>, {enable_loop_peeling}>>"
)


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
    untiled = set()
    on_cpu = {d.target for d in devices} == {"llvm-cpu"}
    for index, op in enumerate(found):
        dynamic = not _static(op)
        if dynamic:
            untiled.add(f"{FUNCTION_PREFIX}_{index}")
        # a causal LM's held keys and values are read where its cache rows hold them
        # (backend_attention.cache_rows_source); on llvm-cpu only, where it was measured
        decompose_attention(module, op, f"{FUNCTION_PREFIX}_{index}", cache_rows=dynamic and on_cpu)
    if untiled and _data_tiled(devices):
        _keep_out_of_data_tiling(module, untiled)
    return len(found)


def _keep_out_of_data_tiling(module: ir.Operation, functions: set[str]) -> None:
    """Give the products of these decompositions (batch matmuls, or generics over cache rows)
    UNTILED_MATMUL."""
    matmuls: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.batch_matmul" or PRODUCT_MARK in op.attributes:
            parent = op.parent
            while parent is not None and parent.name != "util.func":
                parent = parent.parent
            if (
                parent is not None
                and ir.StringAttr(parent.attributes["sym_name"]).value in functions
            ):
                matmuls.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for op in matmuls:
        op.attributes["compilation_info"] = ir.Attribute.parse(UNTILED_MATMUL)
