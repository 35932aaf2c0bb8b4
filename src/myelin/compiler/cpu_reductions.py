"""Row reductions on llvm-cpu kept as vector partial results (`reductions = "vector"`).

IREE 3.13 vectorizes a row reduction (`linalg.generic` with the reduction innermost: a layer
norm's mean and variance, a softmax's row max and row sum) on tiles of 8 rows x 16 elements and
reduces each tile across its lanes at once: 8 horizontal reductions per row of 128, each a chain
of shuffles. Its f32 sums are also kept in order (`llvm.vector.reduce.fadd` without
reassociation: one scalar add after another). On an AVX-512 core these dispatches cost more
than their bytes: BERT-base's softmax row max and exponentials (`[1536, 128]`) took 130-180 us
a layer.

With "vector" the build (1) passes IREE's `--iree-llvmcpu-reassociate-fp-reductions`
(myelin.compiler.targets.REASSOCIATE_FLAG: f32 sums reassociated, lane-wise partial sums summed
across lanes once; a result differs from the in-order sum in its last bits, as torch's own
order does) and (2) edits the vector tiles IREE
chose at the executable-configurations phase: 2 rows x 64 elements (8 zmm registers) wherever
the reduced length is a multiple of 64, so a row of 128 is reduced across lanes twice instead of
8 times. IREE's kernels, distribution and every other op's tiles stay as IREE chose them.

Measured on the 2-vCPU AMD EPYC (Zen 5), 1 thread, on BERT-base, MiniLM, GPT-2 small and
ViT-B/16, with the other tiles tried (docs/platforms.md, "CPU defaults"): 2 x 64 was the fastest
for the softmax's `[1536, 128]`; reassociation alone made the layer norms' variances slower,
the tile brought them back. A dispatch that packs its result for a matmul (a layer norm feeding
data tiling's `linalg.pack`) keeps IREE's tiles: with 2 x 64 its stack exceeded IREE's 32 KiB.
"""

from __future__ import annotations

import re

from iree.compiler import ir

ROWS = 2  # rows of one vector tile
WIDTH = 64  # reduced elements of one vector tile: 2 x 64 f32 = 8 zmm registers

_GENERIC = "linalg.generic"
_PACK = "linalg.pack"
_INNER = re.compile(r"vector_common_parallel = \[\d+, 0\], vector_reduction = \[0, \d+\]")
_TENSOR = re.compile(r"tensor<\d+x(\d+)xf32>")


def _ops(root: ir.Operation, name: str | None = None) -> list[ir.Operation]:
    """The ops nested in `root` (itself included), those named `name` where one is given."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if name is None or op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def retile_cpu_reductions(module: ir.Operation) -> int:
    """Give every static f32 row reduction of `module` (IR at the executable-configurations
    phase) whose reduced length is a multiple of WIDTH, in a dispatch without a pack, vector
    tiles of ROWS x WIDTH; the number of ops changed."""
    changed = 0
    for function in _ops(module, "func.func"):
        ops = _ops(function)
        if any(op.name == _PACK for op in ops):
            continue  # a pack consumer: IREE's tiles (its stack limit, above)
        for op in ops:
            if op.name != _GENERIC or "lowering_config" not in op.attributes:
                continue
            config = str(op.attributes["lowering_config"])
            found = _INNER.search(config)
            shape = _TENSOR.fullmatch(str(op.operands[0].type)) if op.operands else None
            if not config.startswith("#iree_cpu.lowering_config") or not found or not shape:
                continue
            if int(shape.group(1)) % WIDTH:
                continue
            tiles = f"vector_common_parallel = [{ROWS}, 0], vector_reduction = [0, {WIDTH}]"
            op.attributes["lowering_config"] = ir.Attribute.parse(config.replace(found[0], tiles))
            changed += 1
    return changed
