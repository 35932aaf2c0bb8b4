"""The ONNX frontend end to end: onnx.helper models -> plex build -> myelin, against onnxruntime.

Models are built in the test (no files checked in) and compiled once per module.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import myelin  # noqa: E402
from myelin.mln import MlnReader  # noqa: E402
from plex.builder import build  # noqa: E402
from plex.errors import BuildError, BuildWarning  # noqa: E402

RTOL = 1e-5  # relative L2 error against onnxruntime, fp32


def write_package(
    folder: Path, model: onnx.ModelProto, *, graph_extra: str = "", external_data: bool = False
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if external_data:
        onnx.save(
            model,
            str(folder / "model.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights.bin",
            size_threshold=256,
        )
    else:
        onnx.save(model, str(folder / "model.onnx"))
    (folder / "plex.toml").write_text(
        textwrap.dedent(f"""\
        [package]
        name = "{folder.name}"
        version = "0.1.0"

        [graph.net]
        source = "model.onnx"
        {graph_extra}
        """)
    )
    (folder / "app.toml").write_text(f'[app]\nname = "{folder.name}"\npackages = ["."]\n')
    return folder / "app.toml"


def relerr(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def conv_net(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv(1->8, 3x3) -> Relu -> Flatten -> Gemm(288->10) -> Softmax, dynamic batch."""
    rng = np.random.default_rng(seed)
    weights = {
        "conv.weight": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
        "conv.bias": rng.standard_normal(8).astype(np.float32),
        "fc.weight": (rng.standard_normal((10, 288)) / 17).astype(np.float32),
        "fc.bias": rng.standard_normal(10).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "Conv", ["image", "conv.weight", "conv.bias"], ["c"], name="conv", pads=[0, 0, 0, 0]
        ),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_net",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weights


def run(mln: Path, *inputs: np.ndarray, entry: str = "forward") -> np.ndarray:
    with myelin.Instance().load(mln) as model, model.session() as session:
        return session.call(entry, *inputs)


def reference(model: onnx.ModelProto, **feeds: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.fixture(scope="module")
def conv_mln(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, onnx.ModelProto, dict]:
    model, weights = conv_net()
    root = tmp_path_factory.mktemp("onnx_conv")
    return build(write_package(root / "convnet", model), root / "conv.mln").output, model, weights


def test_conv_net_matches_onnxruntime_for_several_batch_sizes(conv_mln) -> None:
    mln, model, _ = conv_mln
    for batch in (1, 3, 16):
        image = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
        got = run(mln, image)
        assert got.shape == (batch, 10)
        assert relerr(got, reference(model, image=image)) < RTOL


def test_initializers_become_mln_parameters_not_inline_constants(conv_mln) -> None:
    mln, _, weights = conv_mln
    with MlnReader(mln) as reader:
        params = {p["key"]: p for p in reader.manifest["parameters"]}
    for key, value in weights.items():
        if value.nbytes < 256:  # small constants stay in the module, where IREE folds them
            continue
        assert params[key]["shape"] == list(value.shape)
        assert params[key]["dtype"] == "float32"
    assert {"conv.weight", "fc.weight"} <= set(params)


def test_signature_keeps_onnx_names_and_dynamic_batch(conv_mln) -> None:
    mln, _, _ = conv_mln
    with myelin.Instance().load(mln) as model:
        signature = model.entrypoints["forward"].signature
    assert [t.name for t in signature.inputs] == ["image"]
    assert [t.name for t in signature.outputs] == ["probs"]
    assert signature.inputs[0].shape == (None, 1, 8, 8)
    assert signature.inputs[0].dims == ("N", 1, 8, 8)  # the model's dim_param


def test_external_data_weights_and_a_named_entrypoint(tmp_path: Path) -> None:
    model, _ = conv_net(seed=3)
    app = write_package(
        tmp_path / "extnet", model, graph_extra='entrypoints = ["classify"]', external_data=True
    )
    assert (tmp_path / "extnet" / "weights.bin").stat().st_size > 10_000
    mln = build(app, tmp_path / "ext.mln").output
    image = np.random.default_rng(7).standard_normal((2, 1, 8, 8)).astype(np.float32)
    got = run(mln, image, entry="classify")
    assert (
        relerr(got, reference(onnx.load(str(tmp_path / "extnet" / "model.onnx")), image=image))
        < RTOL
    )


def old_opset_cnn() -> onnx.ModelProto:
    """Opset 9 MaxPool + BatchNormalization (IREE 3.13 lowers neither at opset 9)."""
    rng = np.random.default_rng(5)
    stats = {
        "bn.scale": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "bn.bias": rng.standard_normal(4).astype(np.float32),
        "bn.mean": rng.standard_normal(4).astype(np.float32),
        "bn.var": rng.uniform(0.5, 2.0, 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("BatchNormalization", ["x", *stats], ["bn"], name="bn", epsilon=1e-5),
        helper.make_node(
            "MaxPool", ["bn"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])],
        initializer=[numpy_helper.from_array(v, k) for k, v in stats.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    return model


def test_old_opset_model_is_upgraded_and_matches(tmp_path: Path) -> None:
    model = old_opset_cnn()
    mln = build(write_package(tmp_path / "oldnet", model), tmp_path / "old.mln").output
    x = np.random.default_rng(1).standard_normal((2, 4, 6, 6)).astype(np.float32)
    assert relerr(run(mln, x), reference(model, x=x)) < RTOL


def test_unsupported_op_is_one_build_error_naming_op_and_node(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("TensorScatter", ["cache", "update"], ["y"], name="cache_write")],
        "scatter",
        [
            helper.make_tensor_value_info("cache", TensorProto.FLOAT, [1, 2, 8, 4]),
            helper.make_tensor_value_info("update", TensorProto.FLOAT, [1, 2, 1, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    with pytest.raises(BuildError) as caught:
        build(write_package(tmp_path / "scatter", model), tmp_path / "scatter.mln")
    message = str(caught.value)
    assert "TensorScatter" in message and "cache_write" in message
    assert "\n" not in message


def test_op_known_to_miscompute_warns(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Det", ["m"], ["d"], name="determinant")],
        "det",
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    app = write_package(tmp_path / "det", model)
    with pytest.warns(BuildWarning, match=r"Det does not pivot.*'determinant'"):
        build(app, tmp_path / "det.mln")
    # every build of the artifact says it again, the fully cached one too
    with pytest.warns(BuildWarning, match=r"Det does not pivot.*'determinant'"):
        result = build(app, tmp_path / "again.mln")
    assert all(r.status == "hit" for i, r in result.results.items() if i != "compose")


def test_ops_without_lowering_are_expanded_into_their_function_bodies(tmp_path: Path) -> None:
    """RMSNormalization and Attention (opset 23) have no IREE lowering; their ONNX function
    bodies do, once the Shape arithmetic inside them is folded to constants."""
    graph = helper.make_graph(
        [
            helper.make_node("RMSNormalization", ["x", "scale"], ["h"], name="norm", axis=-1),
            helper.make_node(
                "Attention",
                ["h", "h", "h"],
                ["y"],
                name="attention",
                q_num_heads=2,
                kv_num_heads=2,
                is_causal=1,
            ),
        ],
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])],
        initializer=[numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    mln = build(write_package(tmp_path / "block", model), tmp_path / "block.mln").output
    x = np.random.default_rng(2).standard_normal((2, 4, 8)).astype(np.float32)
    assert relerr(run(mln, x), reference(model, x=x)) < RTOL


def test_an_opset_upgrade_that_would_change_the_graph_signature_is_not_made() -> None:
    """onnx's version converter takes Scan 8 -> 9 by dropping the batch axis from the graph's
    inputs and outputs: a different function. The frontend keeps the opset-8 model (and says
    so) instead of building something that refuses the model's own inputs."""
    from myelin.frontends._onnx_preprocess import upgrade_opset

    f32 = TensorProto.FLOAT
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s", "x_t"], ["s_next"]),
            helper.make_node("Identity", ["s_next"], ["y_t"]),
        ],
        "body",
        [helper.make_tensor_value_info(n, f32, [2]) for n in ("s", "x_t")],
        [helper.make_tensor_value_info(n, f32, [2]) for n in ("s_next", "y_t")],
    )
    scan = helper.make_node(
        "Scan", ["", "init", "xs"], ["final", "ys"], num_scan_inputs=1, body=body
    )
    graph = helper.make_graph(
        [scan],
        "scan",
        [
            helper.make_tensor_value_info("init", f32, [1, 2]),
            helper.make_tensor_value_info("xs", f32, [1, 3, 2]),
        ],
        [
            helper.make_tensor_value_info("final", f32, [1, 2]),
            helper.make_tensor_value_info("ys", f32, [1, 3, 2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 4
    kept, note = upgrade_opset(model)
    assert kept is model
    assert note is not None and "would change the graph's inputs or outputs; kept 8" in note
