"""Weight layout as a tuning knob (`[tuning.<name>] layouts`): the build stores a parameter in
the chosen layout (transposed at encode time), the consumer reads it there (no transpose at
run time), the outputs are bit-identical to the untransposed build's, the .mln records the
stored order, and the choice is part of the build's key. Real compiles of examples/mlp on
llvm-cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning, ManifestError
from plex.manifest import load_app
from tests.plex.build_helpers import copy_example

X = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)


def laid_out_app(folder: Path, layouts: str) -> Path:
    """examples/mlp with a tuning table that sets only weight layouts."""
    app = copy_example("mlp", folder)
    with (folder / "plex.toml").open("a") as f:
        f.write(f'\n[tuning.cpu]\ntarget = "llvm-cpu"\nlayouts = {{ {layouts} }}\n')
    app.write_text(app.read_text() + '\n[myelin]\ntuning = "mlp:cpu"\n')
    return app


def forward(path: Path) -> np.ndarray:
    with myelin.Instance().load(path) as model, model.session() as session:
        return np.asarray(session.call("forward", X))


def parameters(path: Path) -> dict[str, dict]:
    with MlnReader(path) as reader:
        return {p.key: p.to_json() for p in reader.artifact_manifest.parameters}


def parameter_data(path: Path, key: str) -> np.ndarray:
    with MlnReader(path) as reader:
        p = next(p for p in reader.artifact_manifest.parameters if p.key == key)
        view = reader.section_view(p.section)[p.offset : p.offset + p.length]
        return np.frombuffer(view, np.float32).copy()


def ran(result) -> set[str]:
    return {n for n, r in result.results.items() if r.status == "built" and n != "compose"}


def test_a_transposed_weight_computes_the_same_and_is_recorded(tmp_path):
    cache = tmp_path / "cache"
    plain = copy_example("mlp", tmp_path / "plain")
    build(plain, tmp_path / "plain.mln", cache_dir=cache)
    # w1 is stored K x N (16 x 32) in the source: "nk" transposes it; w2 stays K x N
    app = laid_out_app(tmp_path / "nk", '"w1" = "nk", "mlp::w2" = "kn"')
    build(app, tmp_path / "nk.mln", cache_dir=cache)

    np.testing.assert_array_equal(forward(tmp_path / "nk.mln"), forward(tmp_path / "plain.mln"))
    w1, w2 = parameters(tmp_path / "nk.mln")["w1"], parameters(tmp_path / "nk.mln")["w2"]
    assert w1["shape"] == [16, 32] and w1["storage"]["shape"] == [32, 16]
    assert w1["order"] == [1, 0] and w1["weight_layout"] == "nk"
    assert "order" not in w2 and w2["shape"] == [32, 8]  # already "kn": stored as it was
    shown = subprocess.run(
        [sys.executable, "-m", "plex", "inspect", str(tmp_path / "nk.mln")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "16x32 (stored nk)" in shown.stdout, shown.stdout + shown.stderr
    # the stored bytes are the transpose of the logical weight
    stored = parameter_data(tmp_path / "nk.mln", "w1").reshape(32, 16)
    logical = parameter_data(tmp_path / "plain.mln", "w1").reshape(16, 32)
    np.testing.assert_array_equal(stored, logical.T)


def test_the_consumer_reads_the_stored_layout_without_a_transpose(tmp_path):
    """No dispatch of its own transposes the weight back: the matmul's map reads it."""
    cache = tmp_path / "cache"
    plain, app = (
        copy_example("mlp", tmp_path / "plain"),
        laid_out_app(tmp_path / "nk", '"w1" = "nk"'),
    )
    build(plain, tmp_path / "plain.mlir", compile_to="flow", cache_dir=cache)
    build(app, tmp_path / "nk.mlir", compile_to="flow", cache_dir=cache)
    flow = (tmp_path / "nk.mlir").read_text()
    assert flow.count("flow.executable private") == (tmp_path / "plain.mlir").read_text().count(
        "flow.executable private"
    )
    assert "tensor<32x16xf32>" in flow and "linalg.transpose" not in flow


def test_the_layout_is_keyed_and_rebuilds_only_the_encode_and_compile(tmp_path):
    cache = tmp_path / "cache"
    app = laid_out_app(tmp_path / "a", '"w1" = "nk"')
    build(app, tmp_path / "a.mln", cache_dir=cache)
    assert not ran(build(app, tmp_path / "b.mln", cache_dir=cache))  # unchanged: all hits
    text = (tmp_path / "a" / "plex.toml").read_text().replace('"w1" = "nk"', '"w2" = "nk"')
    (tmp_path / "a" / "plex.toml").write_text(text)
    changed = ran(build(app, tmp_path / "c.mln", cache_dir=cache))
    assert any(n.startswith("encode:") for n in changed)
    assert any(n.startswith("compile:") for n in changed)
    assert not any(n.startswith(("import:", "weights:")) for n in changed)
    assert parameters(tmp_path / "c.mln")["w2"]["storage"]["shape"] == [8, 32]
    assert "order" not in parameters(tmp_path / "c.mln")["w1"]


def test_a_layout_that_matches_nothing_warns(tmp_path):
    app = laid_out_app(tmp_path / "a", '"nothing_here" = "nk"')
    with pytest.warns(BuildWarning, match='"nothing_here" matches no parameter'):
        build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache")


def test_an_unknown_layout_is_one_clear_error(tmp_path):
    app = laid_out_app(tmp_path / "a", '"w1" = "transposed"')
    with pytest.raises(ManifestError, match="unknown weight layout 'transposed'"):
        load_app(app)


GEMV_KN = """
util.global private @w = #flow.parameter.named<"m"::"w"> : tensor<64x256xf16>
func.func @main(%x: tensor<1x64xf16>) -> tensor<1x256xf32> {
  %w = util.global.load @w : tensor<64x256xf16>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x256xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x256xf32>) -> tensor<1x256xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%x, %w : tensor<1x64xf16>, tensor<64x256xf16>) outs(%f : tensor<1x256xf32>) {
  ^bb0(%a: f16, %b: f16, %c: f32):
    %a32 = arith.extf %a : f16 to f32
    %b32 = arith.extf %b : f16 to f32
    %m = arith.mulf %a32, %b32 : f32
    %s = arith.addf %c, %m : f32
    linalg.yield %s : f32
  } -> tensor<1x256xf32>
  return %r : tensor<1x256xf32>
}
"""


def test_the_rewrite_gives_the_other_layouts_gemv():
    """A K x N f16 GEMV weight re-laid-out "nk" is read as the N x K GEMV reads its weight
    (what benchmarks/probes/gpu/tune_bundle.py times as the layout knob's candidates)."""
    import io

    from myelin.compiler.session import CompilerSession
    from myelin.tuning.layout import LayoutRequest, apply_layouts

    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
    with CompilerSession(flags) as session:
        buffer = io.BytesIO()
        session.parse(GEMV_KN.encode(), what="gemv").write_bytecode(buffer)
    out, [result] = apply_layouts(
        buffer.getvalue(), [LayoutRequest("w", "m", "w", (64, 256), "nk")]
    )
    assert result.order == (1, 0), result.reason
    with CompilerSession(flags) as session:
        text = str(session.parse(out, what="gemv"))
    assert '#flow.parameter.named<"m"::"w"> : tensor<256x64xf16>' in text
    assert "ins(%arg0, %w : tensor<1x64xf16>, tensor<256x64xf16>)" in text
    assert "affine_map<(d0, d1, d2) -> (d1, d2)>" in text  # N x K: the weight read along K
    assert "linalg.transpose" not in text


LINEAR = """
util.global private @w = #flow.parameter.named<"m"::"w"> : tensor<32x16xf32>
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x32xf32> {
  %w = util.global.load @w : tensor<32x16xf32>
  %e0 = tensor.empty() : tensor<16x32xf32>
  %t = linalg.transpose ins(%w : tensor<32x16xf32>) outs(%e0 : tensor<16x32xf32>) permutation = [1, 0]
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x32xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x32xf32>) -> tensor<4x32xf32>
  %r = linalg.matmul ins(%x, %t : tensor<4x16xf32>, tensor<16x32xf32>) outs(%f : tensor<4x32xf32>) -> tensor<4x32xf32>
  return %r : tensor<4x32xf32>
}
"""


def test_a_torch_linear_weight_stored_kn_loses_its_transpose():
    """torch's Linear: an [out, in] weight transposed before the matmul. Stored "kn", the
    matmul reads it directly and the transpose is gone; "nk" is how it is stored already."""
    import io

    from myelin.compiler.session import CompilerSession
    from myelin.tuning.layout import LayoutRequest, apply_layouts

    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
    with CompilerSession(flags) as session:
        buffer = io.BytesIO()
        session.parse(LINEAR.encode(), what="linear").write_bytecode(buffer)
    out, [kn] = apply_layouts(buffer.getvalue(), [LayoutRequest("w", "m", "w", (32, 16), "kn")])
    _, [nk] = apply_layouts(buffer.getvalue(), [LayoutRequest("w", "m", "w", (32, 16), "nk")])
    assert kn.order == (1, 0) and nk.order == () and nk.reason == "already stored nk"
    with CompilerSession(flags) as session:
        text = str(session.parse(out, what="linear"))
    assert "linalg.transpose" not in text
    assert "ins(%arg0, %w : tensor<4x16xf32>, tensor<16x32xf32>)" in text


BROADCAST = """
util.global private @w = #flow.parameter.named<"m"::"w"> : tensor<16x32xf32>
func.func @main(%x: tensor<2x4x16xf32>) -> tensor<2x4x32xf32> {
  %w = util.global.load @w : tensor<16x32xf32>
  %e0 = tensor.empty() : tensor<2x16x32xf32>
  %b = linalg.broadcast ins(%w : tensor<16x32xf32>) outs(%e0 : tensor<2x16x32xf32>) dimensions = [0]
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x4x32xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4x32xf32>) -> tensor<2x4x32xf32>
  %r = linalg.batch_matmul ins(%x, %b : tensor<2x4x16xf32>, tensor<2x16x32xf32>) outs(%f : tensor<2x4x32xf32>) -> tensor<2x4x32xf32>
  return %r : tensor<2x4x32xf32>
}
"""


def test_a_weight_read_through_a_broadcast_is_left_as_it_is_with_the_reason():
    import io

    from myelin.compiler.session import CompilerSession
    from myelin.tuning.layout import LayoutRequest, apply_layouts

    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
    with CompilerSession(flags) as session:
        buffer = io.BytesIO()
        session.parse(BROADCAST.encode(), what="bmm").write_bytecode(buffer)
    _, [result] = apply_layouts(buffer.getvalue(), [LayoutRequest("w", "m", "w", (16, 32), "nk")])
    assert result.order == () and "broadcast" in result.reason
