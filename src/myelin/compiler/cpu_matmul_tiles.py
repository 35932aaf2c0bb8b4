"""Workgroup tiles of the data-tiled f32 matmuls on llvm-cpu: all the activation rows, two
weight tiles (`matmul_tiles = "rows"`).

Under data tiling IREE 3.13 computes each f32 matmul as `linalg.mmt4d` on 16x16x1 tiles (an
AVX-512 host: 16 zmm accumulators, one weight vector and 16 broadcast activations per step of
K). Its workgroup tile (`distribution` of the op's `lowering_config`) is sized so that the
activation and weight panels of one workgroup fit `--iree-llvmcpu-matmul-tile-bytes` (256 KiB),
nearly square: `[2, 3]` tiles (32 rows x 48 columns) for BERT-base's K = 768 products, `[1, 1]`
for K = 3072. Every weight panel is then read once per 32 rows, four times per call at 128
tokens, from L3 or memory (BERT-base's 340 MiB of packed weights do not stay in any cache).

With "rows" a workgroup instead takes every row of the product (the whole M, kept in L2 while
the workgroup runs) and two 16-column weight tiles, so each weight tile is read once per call.
Applied only where the activation rows of one product fit ROWS_BUDGET; a larger M (a batch of
32 sequences) keeps IREE's tiles, unmeasured. The rewrite edits the `lowering_config` IREE chose
at the executable-configurations phase and leaves its kernel (the `Mmt4dTilingExpert` pipeline,
the 16x16x1 inner tile) alone.

Measured on the 2-vCPU AMD EPYC (Zen 5), 1 thread, BERT-base at batch 1 x 128 tokens, builds
interleaved in one process (load 1.9-5.0): `[8, 2]` 0.86-0.92x the time of IREE's tiles,
`[8, 1]` 0.93x, `[8, 4]` 0.88x, `[4, 4]` 0.98x, `[1, 8]` 1.00x, and IREE's own knob raised
(`--iree-llvmcpu-matmul-tile-bytes=1048576`: `[8, 8]`/`[8, 12]`) or lowered (65536) 0.98x. Per
product (`plex profile`, 1 thread): 204-226 GFLOP/s with IREE's tiles.
"""

from __future__ import annotations

import re

from iree.compiler import ir

MMT4D = "linalg.mmt4d"
ROWS_BUDGET = 2 << 20  # bytes of f32 activation rows one workgroup keeps (M x K x 4)
WEIGHT_TILES = 2  # 16-column weight tiles per workgroup

_DIST = re.compile(r"distribution = \[[^\]]*\]")
_TENSOR = re.compile(r"tensor<((?:\d+x)+)f32>")


def _shape(type_text: str) -> list[int] | None:
    found = _TENSOR.fullmatch(type_text)
    return [int(d) for d in found.group(1).rstrip("x").split("x")] if found else None


def rows_distribution(lhs: list[int], rhs: list[int]) -> list[int] | None:
    """The `[M1, N1, K1, M0, N0, K0]` workgroup tile for an mmt4d of these packed shapes
    (`lhs` = M1 x K1 x M0 x K0, `rhs` = N1 x K1 x N0 x K0), or None where IREE's stays."""
    m1, k1, m0, k0 = lhs
    n1 = rhs[0]
    if m1 * m0 * k1 * k0 * 4 > ROWS_BUDGET:
        return None
    return [m1, WEIGHT_TILES if n1 % WEIGHT_TILES == 0 else 1, 0, 0, 0, 0]


def retile_cpu_matmuls(module: ir.Operation) -> int:
    """Give every static f32 `linalg.mmt4d` of `module` (IR at the executable-configurations
    phase) the "rows" workgroup tile; the number of ops changed."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == MMT4D and "lowering_config" in op.attributes:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    changed = 0
    for op in found:
        shapes = [_shape(str(v.type)) for v in op.operands]
        if len(shapes) != 3 or any(s is None or len(s) != 4 for s in shapes):
            continue  # not f32, or dynamic: IREE's tiles
        dist = rows_distribution(shapes[0], shapes[1])  # type: ignore[arg-type]
        config = str(op.attributes["lowering_config"])
        if dist is None or not _DIST.search(config):
            continue
        text = _DIST.sub(f"distribution = [{', '.join(map(str, dist))}]", config, count=1)
        if text != config:
            op.attributes["lowering_config"] = ir.Attribute.parse(text)
            changed += 1
    return changed
