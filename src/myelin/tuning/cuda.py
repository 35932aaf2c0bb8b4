"""CUDA (sm_80 PTX) search spaces of IREE 3.13, with every constraint checked before compiling.

Matmuls: TileAndFuse with NV_MMA_SYNC_F32_16x8x16_F16 (the intrinsic IREE's default picks).
IREE compiles a `workgroup_size` inconsistent with the subgroup counts, and legal-but-absurd
tiles, so the constraints are ours:
  workgroup [wm, wn, 0]: wm a multiple of 16, wn of 8, each <= 512
  subgroup [sm, sn, 0] in intrinsic units: warps = (wm / (16 sm)) * (wn / (8 sn)) in 1..8
  reduction [0, 0, r]: K tile 16 r <= 512, dividing K
  shared memory 2 (wm + wn) 16 r bytes <= 166912 (sm_80's max_workgroup_memory_bytes)
  accumulators 4 sm sn f32 registers per thread <= 128
  workgroup_size = [32 warps, 1, 1]; promote_operands = [0, 1] (without it: spills);
  convert_acc_gemm (the default has it; the constraint template omits it)

GEMV (IREE drops the unit M loop: two loops, N and K): for a weight stored N x K the
VectorDistribute reduction config (one row per warp, `partial_reduction` a multiple of
32 lanes x `thread`); for K x N, TileAndFuse SIMT (`workgroup` N tile, `reduction` K tile,
`thread` outputs per thread).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

SHARED_MEMORY_BYTES = 166912


@dataclass(frozen=True)
class MmaTiles:
    wm: int
    wn: int
    sm: int
    sn: int
    r: int

    @property
    def warps(self) -> int:
        return (self.wm // (16 * self.sm)) * (self.wn // (8 * self.sn))

    def violations(self, m: int, n: int, k: int) -> list[str]:
        why = []
        if self.wm % 16 or self.wn % 8 or self.wm > 512 or self.wn > 512:
            why.append("workgroup tile: M a multiple of 16, N of 8, each <= 512")
        if m % self.wm or n % self.wn:
            why.append("workgroup tile must divide M and N")
        if self.wm % (16 * self.sm) or self.wn % (8 * self.sn):
            why.append("subgroup tile must divide the workgroup tile")
        elif not 1 <= self.warps <= 8:
            why.append(f"{self.warps} warps (1..8)")
        if 16 * self.r > 512 or k % (16 * self.r):
            why.append("K tile 16 r must be <= 512 and divide K")
        if 2 * (self.wm + self.wn) * 16 * self.r > SHARED_MEMORY_BYTES:
            why.append("shared memory over sm_80's limit")
        if 4 * self.sm * self.sn > 128:
            why.append("accumulators over 128 registers per thread")
        return why

    def compilation_info(self) -> str:
        return (
            "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
            "convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, "
            f"promote_operands = [0, 1], reduction = [0, 0, {self.r}], "
            f"subgroup = [{self.sm}, {self.sn}, 0], workgroup = [{self.wm}, {self.wn}, 0]}}>, "
            "translation_info = #iree_codegen.translation_info<pipeline = "
            f"#iree_gpu.pipeline<TileAndFuse> workgroup_size = [{32 * self.warps}, 1, 1] "
            "subgroup_size = 32>>"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "warps": self.warps}


def mma_space(m: int, n: int, k: int) -> list[MmaTiles]:
    """Every config of the matmul space that passes the constraints."""
    tiles = itertools.product(
        (32, 64, 128, 256), (32, 64, 128, 256), (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4)
    )
    return [t for t in (MmaTiles(*v) for v in tiles) if not t.violations(m, n, k)]


@dataclass(frozen=True)
class GemvTiles:
    """layout "nk": rows per workgroup (one warp each) and the K chunk per iteration; layout
    "kn": outputs per workgroup, K tile and outputs per thread."""

    layout: str
    a: int  # nk: rows per workgroup (warps); kn: N tile per workgroup
    b: int  # nk: partial_reduction (K chunk); kn: K tile
    c: int  # nk: elements per thread per step; kn: outputs per thread

    def violations(self, n: int, k: int) -> list[str]:
        why = []
        if self.layout == "nk":
            if self.b % (32 * self.c) or k % self.b or n % self.a or not 1 <= self.a <= 8:
                why.append("partial_reduction a multiple of 32 x thread dividing K; 1..8 rows")
        else:
            threads = self.a // self.c
            if self.a % self.c or not 32 <= threads <= 1024 or threads % 32 or n % self.a:
                why.append("N tile / outputs per thread: 32..1024 threads, a warp multiple")
            if k % self.b:
                why.append("K tile must divide K")
        return why

    def compilation_info(self) -> str:
        if self.layout == "nk":
            config = (
                f"workgroup = [{self.a}, 0], partial_reduction = [0, {self.b}], "
                f"thread = [0, {self.c}], lane_basis = [[1, 32], [0, 1]], "
                f"subgroup_basis = [[{self.a}, 1], [0, 1]]"
            )
            return (
                "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
                f"{config}}}>, translation_info = #iree_codegen.translation_info<pipeline = "
                f"#iree_gpu.pipeline<VectorDistribute> workgroup_size = [{32 * self.a}, 1, 1] "
                "subgroup_size = 32>>"
            )
        return (
            "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
            f"workgroup = [{self.a}, 0], reduction = [0, {self.b}], thread = [{self.c}, 0]}}>, "
            "translation_info = #iree_codegen.translation_info<pipeline = "
            f"#iree_gpu.pipeline<TileAndFuse> workgroup_size = [{self.a // self.c}, 1, 1] "
            "subgroup_size = 32>>"
        )

    def to_json(self) -> dict:
        return asdict(self)


def gemv_space(layout: str, n: int, k: int) -> list[GemvTiles]:
    if layout == "nk":
        values = itertools.product((1, 2, 4, 8), (256, 512, 1024, 2048), (4, 8))
    else:
        values = itertools.product((64, 128, 256, 512, 1024), (2, 4, 8, 16), (1, 2, 4, 8))
    return [t for t in (GemvTiles(layout, *v) for v in values) if not t.violations(n, k)]


@dataclass(frozen=True)
class SimtTiles:
    """Any shape of matmul (f32 too, a dynamic M too), as IREE's default configures one the
    MMA intrinsics do not take: TileAndFuse SIMT, operands promoted to shared memory.
    `wm` x `wn` outputs per workgroup, `tm` x `tn` per thread, K tile `r`."""

    wm: int
    wn: int
    r: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.wm // self.tm) * (self.wn // self.tn)

    def violations(self, m: int | None, n: int | None, k: int | None, element_bytes: int) -> list:
        why = []
        if self.wm % self.tm or self.wn % self.tn:
            why.append("outputs per thread must divide the workgroup tile")
        elif not 32 <= self.threads <= 1024 or self.threads % 32:
            why.append(f"{self.threads} threads per workgroup (32..1024, a warp multiple)")
        if (m is not None and m % self.wm) or (n is not None and n % self.wn):
            why.append("workgroup tile must divide a static M or N")
        if k is not None and k % self.r:
            why.append("K tile must divide K")
        if (self.wm + self.wn) * self.r * element_bytes > SHARED_MEMORY_BYTES:
            why.append("shared memory over sm_80's limit")
        if self.tm * self.tn > 64:
            why.append("over 64 accumulators per thread")
        return why

    def compilation_info(self) -> str:
        return (
            "#iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
            f"promote_operands = [0, 1], reduction = [0, 0, {self.r}], "
            f"thread = [{self.tm}, {self.tn}, 0], workgroup = [{self.wm}, {self.wn}, 0]}}>, "
            "translation_info = #iree_codegen.translation_info<pipeline = "
            f"#iree_gpu.pipeline<TileAndFuse> workgroup_size = [{self.threads}, 1, 1] "
            "subgroup_size = 32>>"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "threads": self.threads}

    def describe(self) -> str:
        return f"simt wg {self.wm}x{self.wn} k{self.r} thread {self.tm}x{self.tn}"


SIMT_KNOBS: dict[str, tuple[int, ...]] = {
    "wm": (1, 2, 4, 8, 16, 32, 64),
    "wn": (8, 16, 32, 64, 128, 256),
    "r": (4, 8, 16, 32, 64),
    "tm": (1, 2, 4),
    "tn": (1, 2, 4),
}
