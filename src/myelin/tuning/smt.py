"""GPU contraction candidates from the compiler's own constraints: IREE's
`--iree-codegen-emit-pipeline-constraints` writes, per dispatch and pipeline, an
`iree_codegen.smt.constraints` op (its knobs: wg_0, wg_1, sg_0, sg_1, red_2, sg_m_cnt, ...;
its asserts: divisibility, register and shared-memory limits of the target). PLeX converts it
to SMT-LIB (`iree_codegen.convert_constraints_op_to_smtlib`), adds its own pruning, enumerates
solutions with z3, and turns each into a `compilation_info` (`materialize_compilation_info`).

Why pruning: the compiler's constraints say what is legal, not what is sensible (a 512x512
tile on one warp is legal). `Prune` narrows the space to what a tuner should spend compiles
on, and fixes the knobs that do nothing on CUDA (`prefetch_num_stages`: the prefetch pass is
ROCm-only in 3.13). Two things the solutions lack are added: `convert_acc_gemm` on TileAndFuse
NV_MMA_SYNC configs (IREE's own default has it; the template omits it), and a check that
`workgroup_size` is 32 x the subgroup counts (IREE compiles an inconsistent one).

Needs `z3-solver` (the `tune` extra); without it `solve_constraints` says how to install it.
Compiles here only: no GPU is needed to generate or compile candidates.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from myelin.errors import CompileError

EMIT_FLAGS = ("--iree-codegen-emit-pipeline-constraints", "--compile-to=executable-configurations")
CONSTRAINTS_OP = "iree_codegen.smt.constraints"
SUBGROUP = 32  # sm_80's only subgroup size
# knobs whose solutions differ only in ways the tuner cares about (the rest follow from them)
_FREE = ("wg_0", "wg_1", "sg_0", "sg_1", "red_2", "sg_m_cnt", "sg_n_cnt", "mma_idx")


class MissingSolver(CompileError):
    """z3 is not installed."""


@dataclass(frozen=True)
class Prune:
    """The sensible part of the legal space (every bound inclusive)."""

    tiles: tuple[int, ...] = (32, 64, 128, 256)  # workgroup M and N tiles
    warps: tuple[int, int] = (2, 8)  # subgroups per workgroup
    k_tile: tuple[int, int] = (16, 128)  # K elements per reduction step
    max_accumulators: int = 128  # f32 accumulator registers per thread
    prefetch_stages: int = 2  # a no-op on CUDA: fixed, so solutions do not differ by it


@dataclass(frozen=True)
class SmtCandidate:
    """One solution: its pipeline, the knob values and the `compilation_info` they give."""

    dispatch: str
    pipeline: str  # "TileAndFuse" | "VectorDistribute"
    knobs: dict = field(hash=False)
    compilation_info: str

    @property
    def warps(self) -> int:
        return self.knobs["sg_m_cnt"] * self.knobs["sg_n_cnt"]

    @property
    def k_elements(self) -> int:
        """K elements per reduction step (TileAndFuse counts red_2 in 16-wide intrinsics)."""
        red = self.knobs["red_2"]
        return 16 * red if self.pipeline == "TileAndFuse" else red

    def describe(self) -> str:
        k = self.knobs
        return (
            f"{self.pipeline} workgroup {k['wg_0']}x{k['wg_1']}, {self.warps} warps "
            f"({k['sg_m_cnt']}x{k['sg_n_cnt']}), K step {self.k_elements}"
        )

    def to_json(self) -> dict:
        return {
            "dispatch": self.dispatch,
            "pipeline": self.pipeline,
            "knobs": dict(self.knobs),
            "compilation_info": self.compilation_info,
            "describe": self.describe(),
        }


def iree_compile() -> str:
    """The `iree-compile` of this environment (the pinned compiler wheel's console script),
    for flags the in-process session cannot set."""
    return shutil.which("iree-compile") or str(Path(sys.executable).parent / "iree-compile")


def emit_constraints(source: str, flags: Sequence[str]) -> str:
    """The configured IR of `source` with IREE's constraints ops (one `iree-compile` process:
    the option is a global command-line flag)."""
    compiler = iree_compile()
    with tempfile.TemporaryDirectory(prefix="plex-smt-") as work:
        model, out = Path(work) / "model.mlir", Path(work) / "configured.mlir"
        model.write_text(source)
        done = subprocess.run(
            [compiler, str(model), *flags, *EMIT_FLAGS, "-o", str(out)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise CompileError(f"emitting pipeline constraints failed: {done.stderr[-2000:]}")
        return out.read_text()


def _z3():
    try:
        import z3
    except ImportError:
        raise MissingSolver(
            "GPU candidates from IREE's constraints need z3: install the tune extra "
            "(pip install -e '.[tune]', which pins z3-solver==5.4.0.0)"
        ) from None
    return z3


def solve_constraints(
    configured_ir: str,
    *,
    limit: int = 64,
    prune: Prune = Prune(),
    pipelines: Sequence[str] = ("TileAndFuse", "VectorDistribute"),
) -> list[SmtCandidate]:
    """Up to `limit` pruned solutions per (dispatch, pipeline) of every constraints op, in the
    order `rank` sorts them (most sensible first)."""
    z3 = _z3()
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    found: list[SmtCandidate] = []
    with ir.Context() as context:
        module = ir.Module.parse(configured_ir, context)
        ops: list = []

        def visit(op):
            if op.name == CONSTRAINTS_OP:
                ops.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for op in ops:
            pipeline = str(op.attributes["pipeline"]).rpartition("<")[2].rstrip(">")
            if pipeline not in pipelines:
                continue
            dispatch = _function_of(op)
            solver = z3.Solver()
            solver.from_string(iree_codegen.convert_constraints_op_to_smtlib(op))
            solver.add(*_pruning(z3, pipeline, prune))
            solutions = []
            while len(solutions) < limit and solver.check() == z3.sat:
                model = solver.model()
                knobs = {
                    d.name(): model[d].as_long()
                    for d in model.decls()
                    if d.arity() == 0 and not d.name().startswith("problem_")
                }
                solutions.append(knobs)
                solver.add(z3.Or([z3.Int(k) != knobs[k] for k in _FREE if k in knobs]))
            for knobs in solutions:
                info = str(iree_codegen.materialize_compilation_info(op, knobs))
                if pipeline == "TileAndFuse" and "NV_MMA_SYNC" in info:
                    info = info.replace(
                        "lowering_config<{", "lowering_config<{convert_acc_gemm, ", 1
                    )
                found.append(SmtCandidate(dispatch, pipeline, knobs, _full_names(info)))
    return rank(found)


def _pruning(z3, pipeline: str, prune: Prune) -> list:
    wg0, wg1, red = z3.Int("wg_0"), z3.Int("wg_1"), z3.Int("red_2")
    mc, nc = z3.Int("sg_m_cnt"), z3.Int("sg_n_cnt")
    warps = mc * nc
    k_elements = 16 * red if pipeline == "TileAndFuse" else red
    rules = [
        z3.Or([wg0 == t for t in prune.tiles]),
        z3.Or([wg1 == t for t in prune.tiles]),
        warps >= prune.warps[0],
        warps <= prune.warps[1],
        k_elements >= prune.k_tile[0],
        k_elements <= prune.k_tile[1],
        z3.Int("prefetch_num_stages") == prune.prefetch_stages,
        # IREE compiles a workgroup_size inconsistent with the subgroup counts: tie it here
        z3.Int("wg_size_x") == SUBGROUP * warps,
        z3.Int("wg_size_y") == 1,
        z3.Int("wg_size_z") == 1,
        # each warp's accumulator tile: (wg_0 / sg_m_cnt) x (wg_1 / sg_n_cnt) f32 over 32 lanes
        wg0 * wg1 <= prune.max_accumulators * SUBGROUP * warps,
    ]
    return rules


def rank(candidates: list[SmtCandidate]) -> list[SmtCandidate]:
    """Most sensible first: more reuse per byte loaded (the tile's area over its perimeter), then
    4-8 warps, then the longer K step; a stable order, so a sampled prefix is reproducible."""

    def score(c: SmtCandidate) -> tuple:
        wm, wn = c.knobs["wg_0"], c.knobs["wg_1"]
        return (-(wm * wn) / (wm + wn), not 4 <= c.warps <= 8, -c.k_elements, c.describe())

    return sorted(candidates, key=score)


def _function_of(op) -> str:
    parent = op.operation.parent
    while parent is not None and parent.name not in ("func.func", "util.func"):
        parent = parent.parent
    if parent is None:
        return "?"
    from iree.compiler import ir

    return ir.StringAttr(parent.attributes["sym_name"]).value


def _full_names(info: str) -> str:
    """The attribute text with its nested attributes' dialect prefixes written out (the printer
    elides `#iree_codegen.translation_info` inside `compilation_info`; a spec parses either,
    but the full form reads the same everywhere)."""
    return info.replace(
        "translation_info = <", "translation_info = #iree_codegen.translation_info<"
    )


def pick(candidates: Sequence[SmtCandidate], count: int) -> list[SmtCandidate]:
    """`count` candidates spread over the space: round-robin over (pipeline, workgroup tile,
    K step) groups in rank order, so a small budget tries different shapes, not 8 warp
    arrangements of one tile."""
    groups: dict[tuple, list[SmtCandidate]] = {}
    for c in candidates:
        key = (c.pipeline, c.knobs["wg_0"], c.knobs["wg_1"], c.k_elements)
        groups.setdefault(key, []).append(c)
    picked: list[SmtCandidate] = []
    depth = 0
    while len(picked) < count and any(len(g) > depth for g in groups.values()):
        for g in groups.values():
            if len(g) > depth and len(picked) < count:
                picked.append(g[depth])
        depth += 1
    return picked
