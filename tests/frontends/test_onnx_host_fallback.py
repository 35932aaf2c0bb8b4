"""Host fallback: an ONNX model with a node IREE 3.13 cannot lower builds with
`host_fallback = true` (the node runs in ONNX Runtime, the rest is IREE code) and matches ONNX
Runtime on the whole model; without it the build fails as before."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import myelin
from plex.builder import build
from plex.errors import BuildError, BuildWarning

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper = onnx.helper


def _model() -> onnx.ModelProto:
    """relu(x) -> DFT along axis 1 (opset 19: no lowering in IREE 3.13) -> * 2."""
    f32 = onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("DFT", ["r"], ["d"], name="dft", axis=1),
        helper.make_node("Mul", ["d", "two"], ["y"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "forward",
        [helper.make_tensor_value_info("x", f32, [2, 8, 1])],
        [helper.make_tensor_value_info("y", f32, [2, 8, 2])],
        initializer=[helper.make_tensor("two", f32, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model)


def _app(tmp_path, fallback: bool):
    package = tmp_path / "pkg"
    package.mkdir()
    onnx.save(_model(), package / "model.onnx")
    (package / "plex.toml").write_text(
        '[package]\nname = "dft"\n[graph.dft]\nsource = "model.onnx"\n'
        + ("host_fallback = true\n" if fallback else "")
    )
    app = tmp_path / "app.toml"
    app.write_text('[app]\nname = "dft"\npackages = ["pkg"]\n')
    return app


def test_an_unlowerable_node_fails_the_build_without_host_fallback(tmp_path):
    with pytest.raises(BuildError, match="DFT"):
        build(_app(tmp_path, fallback=False), tmp_path / "dft.mln")


def test_host_fallback_builds_and_matches_onnx_runtime(tmp_path):
    out = tmp_path / "dft.mln"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(_app(tmp_path, fallback=True), out)
    listed = [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]
    assert any("node 'dft' (DFT) runs on the host" in m for m in listed), listed

    x = np.random.default_rng(0).standard_normal((2, 8, 1), dtype=np.float32)
    want = ort.InferenceSession(_model().SerializeToString()).run(None, {"x": x})[0]
    model = myelin.Instance().load(out)
    with model.session() as s:
        y = s.call("forward", x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    functions = model.variant_record.modules[0].extras["host_functions"]
    assert [(f["node"], f["op_type"]) for f in functions] == [("dft", "DFT")]


def test_a_failure_naming_no_node_falls_back_on_the_only_candidate(tmp_path):
    """DFT (opset 20) with its axis a Constant: IREE fails on a location-less constant, not on
    the DFT; the DFT is the only node left to blame, so it moves to the host (reference
    implementation: numpy's FFT) and the result matches numpy."""
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [
        helper.make_node(
            "Constant", [], ["axis"], name="axis", value=helper.make_tensor("a", i64, [], [1])
        ),
        helper.make_node("DFT", ["x", "", "axis"], ["y"], name="dft"),
    ]
    graph = helper.make_graph(
        nodes,
        "forward",
        [helper.make_tensor_value_info("x", f32, [1, 10, 1])],
        [helper.make_tensor_value_info("y", f32, [1, 10, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    package = tmp_path / "pkg"
    package.mkdir()
    onnx.save(onnx.shape_inference.infer_shapes(model), package / "model.onnx")
    (package / "plex.toml").write_text(
        '[package]\nname = "dft"\n[graph.dft]\nsource = "model.onnx"\nhost_fallback = true\n'
    )
    app = tmp_path / "app.toml"
    app.write_text('[app]\nname = "dft"\npackages = ["pkg"]\n')
    out = tmp_path / "dft.mln"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BuildWarning)
        build(app, out)
    x = np.random.default_rng(0).standard_normal((1, 10, 1), dtype=np.float32)
    spectrum = np.fft.fft(x[..., 0], axis=1)
    want = np.stack([spectrum.real, spectrum.imag], axis=-1)
    model = myelin.Instance().load(out)
    with model.session() as s:
        y = s.call("forward", x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
