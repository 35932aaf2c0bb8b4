"""Weight codecs through `plex build`: policy in the manifests, the encode step in the DAG and
its cache key, the .mln records, the runtime result, the check and `--strict`, and the reports
(`plex inspect`, `plex build`, `plex accuracy`)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import myelin
from myelin.codecs import choose_layout, decode, encode
from plex.builder import build
from plex.errors import BuildError, BuildWarning, ManifestError
from plex.manifest import load_app

N, K, V, D = 96, 128, 200, 64

MODEL = f"""module @lm {{
  util.global private @w = #flow.parameter.named<"lm"::"proj.weight"> : tensor<{N}x{K}xf32>
  util.global private @b = #flow.parameter.named<"lm"::"proj.bias"> : tensor<{N}xf32>
  util.global private @e = #flow.parameter.named<"lm"::"emb"> : tensor<{V}x{D}xf32>
  // torch's Linear: y = x @ w^T + b, the weight transposed on the way
  func.func @proj(%x: tensor<?x{K}xf32>) -> tensor<?x{N}xf32> {{
    %c0 = arith.constant 0 : index
    %m = tensor.dim %x, %c0 : tensor<?x{K}xf32>
    %w = util.global.load @w : tensor<{N}x{K}xf32>
    %b = util.global.load @b : tensor<{N}xf32>
    %et = tensor.empty() : tensor<{K}x{N}xf32>
    %wt = linalg.transpose ins(%w : tensor<{N}x{K}xf32>) outs(%et : tensor<{K}x{N}xf32>) permutation = [1, 0]
    %z = arith.constant 0.0 : f32
    %e0 = tensor.empty(%m) : tensor<?x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e0 : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
    %mm = linalg.matmul ins(%x, %wt : tensor<?x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
    %y = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}} ins(%mm, %b : tensor<?x{N}xf32>, tensor<{N}xf32>) outs(%e0 : tensor<?x{N}xf32>) {{
    ^bb0(%a: f32, %c: f32, %o: f32):
      %s = arith.addf %a, %c : f32
      linalg.yield %s : f32
    }} -> tensor<?x{N}xf32>
    return %y : tensor<?x{N}xf32>
  }}
  func.func @embed(%ids: tensor<?xi64>) -> tensor<?x{D}xf32> {{
    %c0 = arith.constant 0 : index
    %n = tensor.dim %ids, %c0 : tensor<?xi64>
    %t = util.global.load @e : tensor<{V}x{D}xf32>
    %e1 = tensor.empty(%n) : tensor<?x{D}xf32>
    %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}} ins(%ids : tensor<?xi64>) outs(%e1 : tensor<?x{D}xf32>) {{
    ^bb0(%in: i64, %out: f32):
      %row = arith.index_cast %in : i64 to index
      %col = linalg.index 1 : index
      %v = tensor.extract %t[%row, %col] : tensor<{V}x{D}xf32>
      linalg.yield %v : f32
    }} -> tensor<?x{D}xf32>
    return %r : tensor<?x{D}xf32>
  }}
}}
"""

# The same matmul, with the weight through an optimization barrier: nothing can fuse its decode.
UNFUSED = MODEL.replace(
    "%wt = linalg.transpose ins(%w ",
    f"%wb = util.optimization_barrier %w : tensor<{N}x{K}xf32>\n"
    "    %wt = linalg.transpose ins(%wb ",
)

PACKAGE = """\
[package]
name = "lm"

[graph.lm]
source = "model.mlir"
weights = "params"

[weights.params]
source = "params.safetensors"
scope = "lm"
codec = "int8"
"""

APP = """\
[app]
name = "lm"
packages = ["lm"]

[weights.codec]
"emb" = "q4"
"""


def write_app(root: Path, *, model: str = MODEL, app: str = APP, package: str = PACKAGE) -> Path:
    pkg = root / "lm"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "model.mlir").write_text(model)
    (pkg / "plex.toml").write_text(package)
    rng = np.random.default_rng(5)
    save_file(
        {
            "proj.weight": (rng.standard_normal((N, K)) * 0.05).astype(np.float32),
            "proj.bias": rng.standard_normal(N).astype(np.float32),
            "emb": rng.standard_normal((V, D)).astype(np.float32),
        },
        str(pkg / "params.safetensors"),
    )
    (root / "app.toml").write_text(app)
    return root / "app.toml"


def weights(root: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(root / "lm" / "params.safetensors"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, object]:
    root = tmp_path_factory.mktemp("codec-build")
    app = write_app(root)
    result = build(app, root / "lm.mln")
    return root, root / "lm.mln", result


def plex(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plex", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "240"},
    )


def by_key(mln: Path) -> dict[str, dict]:
    model = myelin.Instance().load(mln)
    try:
        return {p["key"]: p for p in model.manifest["parameters"]}
    finally:
        model.close()


def test_the_mln_records_codec_logical_shape_storage_and_rule(built):
    _, mln, result = built
    p = by_key(mln)
    assert set(p) == {
        "proj.weight",
        "proj.weight.scale",
        "proj.bias",
        "emb",
        "emb.scale",
        "emb.offset",
        "emb.row_scale",
        "emb.row_offset",
    }
    w = p["proj.weight"]
    assert (w["codec"], w["dtype"], w["shape"], w["role"]) == ("int8", "float32", [N, K], "data")
    # stored in the order the matmul reads it, [in, out]: the decode streams it contiguously
    assert w["storage"] == {"dtype": "int8", "shape": [K, N]} and w["order"] == [1, 0]
    assert w["length"] == N * K
    assert w["rule"] == "default of [weights.params] of package lm" and w["reduce_axes"] == [1]
    assert (p["proj.weight.scale"]["of"], p["proj.weight.scale"]["length"]) == (
        "proj.weight",
        4 * N,
    )
    e = p["emb"]
    assert (e["codec"], e["storage"], e["length"]) == (
        "q4:g32",
        {"dtype": "uint4", "shape": [V, D]},  # a gathered table keeps rows contiguous
        V * D // 2,
    )
    assert e["rule"] == '[weights.codec] "emb" (exact name)'
    bias = p["proj.bias"]
    assert (bias["codec"], bias["length"]) == ("none", 4 * N)
    assert bias["rule"].startswith("kept fp32: rank 1 (norms, biases)")
    assert "encode:lm:lm" in result.results


def reference(root: Path, mln: Path, key: str) -> np.ndarray:
    """The weight as the artifact decodes it: the recorded codec applied to the source weights."""
    p = by_key(mln)[key]
    layout = choose_layout(
        p["codec"], tuple(p["shape"]), p["dtype"], tuple(p["reduce_axes"]), tuple(p["order"])
    )
    return decode(encode(weights(root)[key], layout), layout)


def test_the_artifact_computes_with_the_decoded_weights(built):
    root, mln, _ = built
    x = np.random.default_rng(2).standard_normal((3, K)).astype(np.float32)
    ids = np.array([0, 199, 5, 5], dtype=np.int64)
    model = myelin.Instance().load(mln)
    with model.session() as s:
        y, e = s.call("proj", x), s.call("embed", ids)
    model.close()
    w = weights(root)
    np.testing.assert_allclose(
        y, x @ reference(root, mln, "proj.weight").T + w["proj.bias"], rtol=1e-5, atol=1e-5
    )
    # q * scale + offset: LLVM may contract it into one fused multiply-add (one rounding less)
    np.testing.assert_allclose(e, reference(root, mln, "emb")[ids], rtol=1e-6, atol=1e-6)
    exact = x @ w["proj.weight"].T + w["proj.bias"]
    assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < 1e-2  # what int8 costs


def test_inspect_and_build_report_codecs_and_sizes(built, tmp_path):
    root, mln, _ = built
    shown = plex("inspect", str(mln))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "why this codec" in text and "int8" in text and "q4:g32" in text
    row = next(line for line in text.splitlines() if " proj.weight " in line)
    assert "float32" in row and f"{N}x{K}" in row and str(N * K + 4 * N) in row
    assert "kept fp32: rank 1" in text
    rebuilt = plex(
        "build", str(root / "app.toml"), "-o", str(tmp_path / "again.mln"), "--progress", "plain"
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "parameters by codec: int8 12.4 KiB (1), q4:g32 8.6 KiB (1), none 384 B (1)" in (
        rebuilt.stderr
    )


def test_a_policy_change_re_encodes_without_re_importing(built, tmp_path):
    root, _, _ = built
    app = root / "app.toml"
    app.write_text(APP.replace('"q4"', '"q4:g16"'))
    try:
        result = build(app, tmp_path / "g16.mln")
    finally:
        app.write_text(APP)
    status = {node: r.status for node, r in result.results.items()}
    assert status["import:lm:lm"] == "hit" and status["weights:lm:params"] == "hit"
    assert status["encode:lm:lm"] == "built" and status["compile:lm:lm:default"] == "built"
    assert by_key(tmp_path / "g16.mln")["emb"]["codec"] == "q4:g16"


def test_an_unfused_decode_warns_and_fails_with_strict(tmp_path):
    app = write_app(tmp_path, model=UNFUSED)
    with pytest.warns(BuildWarning, match="parameter lm::proj.weight: its decode is not fused"):
        build(app, tmp_path / "warned.mln")
    assert (tmp_path / "warned.mln").exists()
    with pytest.raises(BuildError, match="--strict makes a decode that is not fused an error"):
        build(app, tmp_path / "strict.mln", strict=True)
    assert not (tmp_path / "strict.mln").exists()


def test_a_fused_build_does_not_warn(built, tmp_path):
    root, _, _ = built
    with warnings.catch_warnings():
        warnings.simplefilter("error", BuildWarning)
        build(root / "app.toml", tmp_path / "quiet.mln", strict=True)


# compute pinned to f32: an all-q4 or all-int8 app would take bf16 matmul inputs on an
# AVX512-BF16 host (myelin.compiler.targets.compute_choice), and this test checks the decoded
# weights' f32 results
DATA_TILED_APP = APP.replace(
    "[weights.codec]",
    '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-task"\ndata_tiling = true\n'
    'compute = "f32"\n\n'
    "[weights.codec]",
).replace('"emb" = "q4"', '"emb" = "q4"\n"proj.weight" = "q4"')


def test_codecs_build_and_compute_with_data_tiling(tmp_path):
    """IREE's data tiling on (as examples/minilm ships): the matmul weight is decoded once at
    load into the packed layout, which the build reports (and --strict accepts: it is chosen,
    not a decode that failed to fuse); the gathered table stays decoded row by row; the
    results are the decoded weights'; int8 and q4 both on the matmul here."""
    for codec in ("int8", "q4"):
        folder = tmp_path / codec
        app = write_app(
            folder, app=DATA_TILED_APP.replace('"proj.weight" = "q4"', f'"proj.weight" = "{codec}"')
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BuildWarning)
            build(app, folder / "lm.mln", strict=True)
        messages = [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]
        assert messages == [
            "module lm [variant default]: 1 encoded matmul weight(s) decode once at load into "
            "data tiling's packed layout (float32 in memory, as fp32's packed copies; the .mln "
            "keeps the encoded bytes): lm::proj.weight"
        ]
        mln = folder / "lm.mln"
        assert by_key(mln)["proj.weight"]["codec"] == ("q4:g32" if codec == "q4" else codec)
        x = np.random.default_rng(2).standard_normal((3, K)).astype(np.float32)
        ids = np.array([0, 199, 5], dtype=np.int64)
        model = myelin.Instance().load(mln)
        with model.session() as s:
            y, e = s.call("proj", x), s.call("embed", ids)
        model.close()
        w = weights(folder)
        want = x @ reference(folder, mln, "proj.weight").T + w["proj.bias"]
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(e, reference(folder, mln, "emb")[ids], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("where", "text", "message"),
    [
        ("package", 'codec = "int4"', "unknown codec 'int4'; accepted: fp32, fp16, bf16, int8, q4"),
        ("package", 'codec = "q4:g7"', "invalid codec 'q4:g7': the group size must be an even"),
        ("app", '"*" = "q5"', "unknown codec 'q5'"),
    ],
)
def test_codec_names_are_checked_at_their_line(tmp_path, where, text, message):
    if where == "package":
        app = write_app(tmp_path, package=PACKAGE.replace('codec = "int8"', text))
        line = PACKAGE.splitlines().index('codec = "int8"') + 1
        file = "plex.toml"
    else:
        app = write_app(tmp_path, app=APP.replace('"emb" = "q4"', text))
        line = APP.splitlines().index('"emb" = "q4"') + 1
        file = "app.toml"
    with pytest.raises(ManifestError) as info:
        load_app(app)
    assert f"{file}:{line}:" in str(info.value) and message in str(info.value)


def test_accuracy_compares_the_codec_build_with_fp32(built):
    root, _, _ = built
    assert "Usage" in plex("accuracy", "--help").stdout
    result = plex("accuracy", str(root / "app.toml"), "-f", "proj", "--codec", "q4")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "codec build:" in out and "fp32 build:" in out
    row = next(line for line in out.splitlines() if line.startswith("proj "))
    cosine = float(row.split()[4])
    assert 0.99 < cosine < 1.0  # q4 on proj.weight (the app's rules still give emb q4 too)
    # token ids need no --input: the artifact records their range, the ids are drawn from it
    ids = plex("accuracy", str(root / "app.toml"), "-f", "embed")
    assert ids.returncode == 0, ids.stderr
    assert any(line.startswith("embed ") for line in ids.stdout.splitlines())


def test_an_onnx_graph_gets_codecs_from_the_app(tmp_path):
    """Frontend independence: ONNX initializers (a MatMul's [K, N] and a Gemm's transposed
    [N, K]) are encoded like any other parameter; the result matches onnxruntime's fp32."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((128, 96)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((64, 96)) * 0.05).astype(np.float32)
    b2 = rng.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b2, "b2"))],
    )
    pkg = tmp_path / "tiny"
    pkg.mkdir()
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        str(pkg / "model.onnx"),
    )
    (pkg / "plex.toml").write_text(
        '[package]\nname = "tiny"\n\n[graph.tiny]\nsource = "model.onnx"\n'
    )
    (tmp_path / "app.toml").write_text(
        '[app]\nname = "tiny"\npackages = ["tiny"]\n\n[weights.codec]\n"*" = "int8"\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", BuildWarning)
        build(tmp_path / "app.toml", tmp_path / "tiny.mln")
    p = by_key(tmp_path / "tiny.mln")
    assert (p["w1"]["codec"], p["w1"]["order"], p["w2"]["codec"], p["w2"]["order"]) == (
        "int8",
        [0, 1],
        "int8",
        [1, 0],  # the Gemm reads w2 transposed: stored that way
    )
    assert p["b2"]["codec"] == "none"
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    model = myelin.Instance().load(tmp_path / "tiny.mln")
    with model.session() as s:
        y = s.call(next(iter(model.entrypoints)), x)
    model.close()
    want = ort.InferenceSession(str(pkg / "model.onnx")).run(None, {"x": x})[0]
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < 1e-2
