"""`session.call(..., out=)` and device results that export DLPack, on the CPU (the CUDA side,
zero-copy import and export of torch CUDA tensors, ran on the H200: docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import pytest

import myelin
from myelin.errors import InputError
from myelin.runtime.tensors import output_arguments, with_output_arguments
from plex.builder import build

GRAPH = """
func.func @scale(%x: tensor<4xf32>) -> tensor<4xf32> {
  %two = arith.constant dense<2.0> : tensor<4xf32>
  %y = arith.mulf %x, %two : tensor<4xf32>
  return %y : tensor<4xf32>
}
func.func @scale_into(%x: tensor<4xf32>, %out: tensor<4xf32> {iree.abi.output = 0 : index})
    -> tensor<4xf32> {
  %y = call @scale(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    (root / "g.mlir").write_text(GRAPH)
    (root / "plex.toml").write_text('[package]\nname = "o"\n\n[graph.g]\nsource = "g.mlir"\n')
    (root / "app.toml").write_text(
        '[app]\nname = "o"\npackages = ["."]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
        'cpu = "generic"\n'
    )
    return myelin.Instance().load(build(root / "app.toml", root / "o.mln").output)


def test_out_writes_the_result_into_the_callers_array_and_returns_it(model):
    x = np.arange(4, dtype=np.float32)
    out = np.full(4, np.nan, np.float32)
    with model.session() as s:
        assert s.call("scale_into", x, out=out) is out
    np.testing.assert_array_equal(out, 2 * x)


def test_out_on_an_entrypoint_without_result_storage_says_how_to_declare_it(model):
    with model.session() as s, pytest.raises(InputError, match=r"iree\.abi\.output = 0"):
        s.call("scale", np.ones(4, np.float32), out=np.empty(4, np.float32))


def test_a_device_result_exports_dlpack(model):
    torch = pytest.importorskip("torch")
    with model.session() as s:
        y = s.call("scale", np.ones(4, np.float32), output="device")
    assert y.__dlpack_device__() == (1, 0)  # kDLCPU: a host-memory device
    assert torch.from_dlpack(y).tolist() == [2.0] * 4


def test_output_arguments_are_read_from_the_abi_declaration():
    declaration = (
        "async func @f(%input0: tensor<?x8xf16>, %input1: tensor<8x8xf16>, %input2: "
        "tensor<?x8xf16> {iree.abi.output = 0 : index}) -> (%output0: tensor<?x8xf16>)"
    )
    assert output_arguments(declaration) == ((2, 0),)
    assert with_output_arguments("f", ("a", "b"), ("c",), ((2, 0),)) == ("a", "b", "c")
    with pytest.raises(InputError, match="1 result"):
        with_output_arguments("f", ("a", "b"), ("c", "d"), ((2, 0),))
