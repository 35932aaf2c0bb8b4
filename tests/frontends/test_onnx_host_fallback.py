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


def _build(tmp_path, model: onnx.ModelProto, fallback: bool) -> tuple[object, list[str]]:
    """Build `model` as a one-graph package; returns (loaded .mln, build warnings)."""
    package = tmp_path / ("fallback" if fallback else "device")
    package.mkdir()
    onnx.save(model, package / "model.onnx")
    (package / "plex.toml").write_text(
        '[package]\nname = "case"\n[graph.case]\nsource = "model.onnx"\n'
        + ("host_fallback = true\n" if fallback else "")
    )
    app = package / "app.toml"
    app.write_text('[app]\nname = "case"\npackages = ["."]\n')
    out = package / "case.mln"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(app, out)
    listed = [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]
    return myelin.Instance().load(out), listed


def _det_model() -> onnx.ModelProto:
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        "forward",
        [helper.make_tensor_value_info("x", f32, [2, 3, 3])],
        [helper.make_tensor_value_info("y", f32, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model


def test_a_known_wrong_node_runs_on_the_host_with_host_fallback(tmp_path):
    """IREE 3.13's Det does not pivot: a matrix with a zero leading entry gives NaN (the build
    warns). With host fallback the node is in the known-wrong table, so it runs in ONNX Runtime
    from the start and the result matches numpy."""
    x = np.array([[[0, 1, 2], [3, 4, 5], [6, 7, 9]], [[2, 0, 1], [1, 3, 0], [0, 1, 4]]], np.float32)
    want = np.linalg.det(x.astype(np.float64)).astype(np.float32)

    device, listed = _build(tmp_path, _det_model(), fallback=False)
    assert any("Det does not pivot" in m for m in listed), listed
    with device.session() as s:
        wrong = s.call("forward", x)
    assert np.isnan(wrong[0]), "IREE's Det pivots now: drop it from SILENTLY_WRONG"

    host, listed = _build(tmp_path, _det_model(), fallback=True)
    assert any(
        "node 'det' (Det) runs on the host (host_fallback: IREE 3.13 computes it wrong" in m
        for m in listed
    ), listed
    assert not any("check its outputs" in m for m in listed), listed
    with host.session() as s:
        y = s.call("forward", x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    functions = host.variant_record.modules[0].extras["host_functions"]
    assert [(f["node"], f["op_type"]) for f in functions] == [("det", "Det")]


def test_float8_float16_casts_compile_on_the_device_through_float32(tmp_path):
    """IREE 3.13's CPU code generation cannot convert f8 <-> f16 vectors (the compile fails on
    `arith.extf`/`arith.truncf`); the frontend casts through float32 instead, which is exact.
    No host fallback: both casts run in IREE code and match ONNX's reference implementation."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from onnx.reference import ReferenceEvaluator

    f16, f8 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT8E4M3FN
    like = onnx.numpy_helper.from_array(np.zeros(1, ml_dtypes.float8_e4m3fn), "like")
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], name="up", to=f16),
        helper.make_node("Mul", ["h", "h"], ["sq"], name="square"),
        helper.make_node("CastLike", ["sq", "like"], ["y"], name="down", saturate=0),
    ]
    graph = helper.make_graph(
        nodes,
        "forward",
        [helper.make_tensor_value_info("x", f8, [16])],
        [
            helper.make_tensor_value_info("h", f16, [16]),
            helper.make_tensor_value_info("y", f8, [16]),
        ],
        initializer=[like],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.array([0.5, -1.5, 3, 7, 0.125, -0.0625, 12, 20] * 2, np.float32).astype(
        ml_dtypes.float8_e4m3fn
    )
    want_h, want_y = ReferenceEvaluator(model).run(None, {"x": x})

    loaded, _ = _build(tmp_path, model, fallback=False)
    with loaded.session() as s:
        h, y = s.call("forward", x)
    np.testing.assert_array_equal(h, want_h)
    assert y.dtype == want_y.dtype
    np.testing.assert_array_equal(y.view(np.uint8), want_y.view(np.uint8))


def test_unsigned_integer_arguments_reach_the_host_as_unsigned(tmp_path):
    """IREE integers are signless: a uint16 tensor arrives at the host as int16. The host
    module views it as the node's uint16 again (ONNX Runtime refuses int16 for a uint16 input,
    and the reference implementation would read 65535 as -1), so DequantizeLinear on uint16
    (no IREE lowering) matches ONNX Runtime."""
    u16, f32 = onnx.TensorProto.UINT16, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "scale", "zero"], ["y"], name="dq")],
        "forward",
        [
            helper.make_tensor_value_info("x", u16, [6]),
            helper.make_tensor_value_info("scale", f32, []),
            helper.make_tensor_value_info("zero", u16, []),
        ],
        [helper.make_tensor_value_info("y", f32, [6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.array([0, 1, 30000, 40000, 65534, 65535], np.uint16)
    scale, zero = np.array(0.5, np.float32), np.array(30000, np.uint16)
    feeds = {"x": x, "scale": scale, "zero": zero}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]

    loaded, listed = _build(tmp_path, model, fallback=True)
    assert any("node 'dq' (DequantizeLinear) runs on the host" in m for m in listed), listed
    with loaded.session() as s:
        # the signature is IREE's: signless int16 (the same bytes)
        y = s.call("forward", x.view(np.int16), scale, zero.view(np.int16))
    np.testing.assert_array_equal(y, want)  # exact: (x - zero) * 0.5 in float32


def test_a_host_node_with_an_omitted_optional_output(tmp_path):
    """LSTM with peephole weights (known wrong in IREE 3.13, so it runs on the host) asked only
    for Y_h: its omitted Y is no tensor of the host call, and the result matches ONNX Runtime."""
    f32 = onnx.TensorProto.FLOAT
    seq, batch, size, hidden = 3, 2, 4, 5
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.standard_normal((1, 4 * hidden, size), dtype=np.float32),
        "R": rng.standard_normal((1, 4 * hidden, hidden), dtype=np.float32),
        "B": rng.standard_normal((1, 8 * hidden), dtype=np.float32),
        "P": rng.standard_normal((1, 3 * hidden), dtype=np.float32),
    }
    lstm = helper.make_node(
        "LSTM", ["x", "W", "R", "B", "", "", "", "P"], ["", "h"], name="lstm", hidden_size=hidden
    )
    graph = helper.make_graph(
        [lstm],
        "forward",
        [helper.make_tensor_value_info("x", f32, [seq, batch, size])],
        [helper.make_tensor_value_info("h", f32, [1, batch, hidden])],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    x = rng.standard_normal((seq, batch, size), dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    loaded, listed = _build(tmp_path, model, fallback=True)
    assert any("node 'lstm' (LSTM) runs on the host" in m for m in listed), listed
    with loaded.session() as s:
        h = s.call("forward", x)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-6)


def _binarizer_model() -> onnx.ModelProto:
    """An ai.onnx.ml model (no ai.onnx opset at all): Binarizer, then ArrayFeatureExtractor."""
    f32 = onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node(
            "Binarizer", ["x"], ["b"], name="binarize", domain="ai.onnx.ml", threshold=0.25
        ),
        helper.make_node(
            "ArrayFeatureExtractor", ["b", "columns"], ["y"], name="pick", domain="ai.onnx.ml"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "forward",
        [helper.make_tensor_value_info("x", f32, [3, 5])],
        [helper.make_tensor_value_info("y", f32, [3, 2])],
        initializer=[onnx.numpy_helper.from_array(np.array([4, 1], np.int64), "columns")],
        value_info=[helper.make_tensor_value_info("b", f32, [3, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


def test_ops_of_other_domains_run_on_the_host(tmp_path):
    """IREE lowers only ai.onnx ops. Without host fallback an ai.onnx.ml model is one clear build
    error; with it both nodes run in ONNX Runtime and the result matches it."""
    model = _binarizer_model()
    with pytest.raises(BuildError, match="host_fallback = true"):
        _build(tmp_path, model, fallback=False)

    x = np.random.default_rng(0).standard_normal((3, 5), dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    loaded, listed = _build(tmp_path, model, fallback=True)
    for node in ("binarize", "pick"):
        assert any(f"node '{node}'" in m and "outside ai.onnx" in m for m in listed), listed
    with loaded.session() as s:
        y = s.call("forward", x)
    np.testing.assert_array_equal(y, want)


def test_a_node_whose_lowering_fails_halfway_falls_back(tmp_path):
    """RoiAlign lowers to `torch.torchvision.roi_align`, whose conversion fails on a
    location-less constant after part of the node became linalg ops: the node is still the
    only candidate, so it runs on the host and the result matches ONNX Runtime."""
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    roi = helper.make_node(
        "RoiAlign",
        ["x", "rois", "batch"],
        ["y"],
        name="roi",
        output_height=3,
        output_width=3,
        sampling_ratio=2,
        spatial_scale=1.0,
    )
    graph = helper.make_graph(
        [roi],
        "forward",
        [
            helper.make_tensor_value_info("x", f32, [1, 2, 8, 8]),
            helper.make_tensor_value_info("rois", f32, [2, 4]),
            helper.make_tensor_value_info("batch", i64, [2]),
        ],
        [helper.make_tensor_value_info("y", f32, [2, 2, 3, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((1, 2, 8, 8), dtype=np.float32),
        "rois": np.array([[0, 0, 5, 5], [1, 2, 7, 6]], np.float32),
        "batch": np.zeros(2, np.int64),
    }
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    loaded, listed = _build(tmp_path, model, fallback=True)
    assert any("node 'roi' (RoiAlign) runs on the host" in m for m in listed), listed
    with loaded.session() as s:
        y = s.call("forward", *feeds.values())
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
