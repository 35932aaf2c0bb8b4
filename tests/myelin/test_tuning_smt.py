"""GPU candidates from IREE's own pipeline constraints (myelin.tuning.smt): z3 solutions of the
`iree_codegen.smt.constraints` ops of a CUDA matmul, pruned to sensible ones, materialized into
compilation_info, and compiled with a spec that applies them (sm_80 PTX, compile only: no GPU
here). Real IREE 3.13 compiles; z3 from the tune extra."""

from __future__ import annotations

import builtins
import json

import pytest

from myelin.tuning.cpu import configured_contractions
from myelin.tuning.smt import MissingSolver, Prune, emit_constraints, pick, solve_constraints
from myelin.tuning.spec import SpecEntry, render_spec

z3 = pytest.importorskip("z3")

FLAGS = ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80")
T = "tensor<512x1024xf16>"
U = "tensor<1024x256xf16>"
R = "tensor<512x256xf32>"
MATMUL = f"""func.func @main(%a: {T}, %b: {U}) -> {R} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {R}
  %f = linalg.fill ins(%z : f32) outs(%e : {R}) -> {R}
  %r = linalg.matmul ins(%a, %b : {T}, {U}) outs(%f : {R}) -> {R}
  return %r : {R}
}}
"""


@pytest.fixture(scope="module")
def configured() -> str:
    return emit_constraints(MATMUL, FLAGS)


def test_every_solution_is_legal_pruned_and_consistent(configured):
    prune = Prune()
    found = solve_constraints(configured, limit=400)
    pipelines = {c.pipeline for c in found}
    assert pipelines == {"TileAndFuse", "VectorDistribute"}
    for c in found:
        k = c.knobs
        assert k["wg_0"] in prune.tiles and k["wg_1"] in prune.tiles
        assert 512 % k["wg_0"] == 0 and 256 % k["wg_1"] == 0  # the compiler's divisibility
        assert prune.warps[0] <= c.warps <= prune.warps[1]
        assert prune.k_tile[0] <= c.k_elements <= prune.k_tile[1] and 1024 % c.k_elements == 0
        # workgroup_size is tied to the subgroup counts (IREE would compile it otherwise)
        assert f"workgroup_size = [{32 * c.warps}, 1, 1]" in c.compilation_info
        assert c.compilation_info.startswith("#iree_codegen.compilation_info<")
        if c.pipeline == "TileAndFuse":
            assert "convert_acc_gemm" in c.compilation_info
    # solutions are distinct in the knobs that matter
    keys = {json.dumps(c.knobs, sort_keys=True) for c in found}
    assert len(keys) == len(found)
    spread = pick(found, 6)
    assert len({(c.pipeline, c.knobs["wg_0"], c.knobs["wg_1"], c.k_elements) for c in spread}) == 6


def test_candidates_compile_and_their_spec_applies(configured, tmp_path):
    from plex.builder.versions import fingerprint_salt
    from plex.tune._cuda import FAILED, MATCHED, CudaCandidateJob
    from synapse import Cache, Executor, Node, Plan

    [root] = configured_contractions(configured, gpu=True)
    assert root.match.m == (512,) and root.match.n == (256,) and root.match.k == (1024,)
    found = solve_constraints(configured, limit=100)
    chosen = [
        next(c for c in found if c.pipeline == p) for p in ("TileAndFuse", "VectorDistribute")
    ]
    nodes = [
        Node(
            f"c{i}",
            CudaCandidateJob(
                MATMUL, render_spec([SpecEntry("mm", root.match, c.compilation_info)]), FLAGS
            ),
        )
        for i, c in enumerate(chosen)
    ]
    results = Executor(Cache(tmp_path / "cache"), jobs=2, salt=fingerprint_salt()).run(Plan(nodes))
    for node in nodes:
        out = results[node.id].out_dir
        assert not (out / FAILED).exists(), (out / FAILED).read_text()
        assert int((out / MATCHED).read_text()) == 1  # the spec configured the matmul


def test_without_z3_the_error_says_how_to_install_it(configured, monkeypatch):
    real_import = builtins.__import__

    def no_z3(name, *args, **kwargs):
        if name == "z3":
            raise ImportError("No module named 'z3'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_z3)
    with pytest.raises(MissingSolver, match=r"z3-solver==5\.4\.0\.0"):
        solve_constraints(configured)


def test_a_source_iree_rejects_is_one_error():
    from myelin.errors import CompileError

    with pytest.raises(CompileError, match="emitting pipeline constraints failed"):
        emit_constraints("func.func @main( {", FLAGS)
