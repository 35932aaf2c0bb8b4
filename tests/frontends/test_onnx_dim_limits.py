"""An ONNX graph that slices a stored table up to a dynamic size (BERT's exported
`position_ids[:, :seq]`) supports no larger size: past it the slice comes out short, onnxruntime
fails, and IREE (compiled without broadcast checks) returned finite wrong values. The build
records the table's length as the dim's limit, and a larger call is refused before IREE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import myelin  # noqa: E402
from myelin.errors import InputError  # noqa: E402
from tests.conftest import build_app  # noqa: E402
from tests.frontends.test_onnx_frontend import write_package  # noqa: E402

ROWS = 16


def positions_model() -> onnx.ModelProto:
    """y = x + table[:, :seq]: x is [batch, seq, 4], the table [1, 16, 4]."""
    table = np.random.default_rng(0).standard_normal((1, ROWS, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "zero"], ["end"]),
        helper.make_node("Slice", ["table", "zero", "end", "axes"], ["rows"]),
        helper.make_node("Add", ["x", "rows"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_dim_that_slices_a_stored_table_is_limited_to_its_length(tmp_path: Path) -> None:
    model = positions_model()
    app = write_package(tmp_path / "positions", model)
    mln = build_app(app, tmp_path / "positions.mln")
    reference = ort.InferenceSession(model.SerializeToString())
    loaded = myelin.Instance().load(mln)
    try:
        (x_spec,) = loaded.entrypoint("forward").signature.inputs
        assert x_spec.limits[1][0] == ROWS and x_spec.limits[0] is None
        with loaded.session() as session:
            x = np.random.default_rng(1).standard_normal((2, ROWS, 4)).astype(np.float32)
            (expected,) = reference.run(None, {"x": x})
            np.testing.assert_allclose(session.call("forward", x), expected, atol=1e-6)
            too_long = np.zeros((2, ROWS + 1, 4), np.float32)
            with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="16 by 17"):
                reference.run(None, {"x": too_long})
            with pytest.raises(InputError, match=r"at most 16 there: positions along it are"):
                session.call("forward", too_long)
    finally:
        loaded.close()
