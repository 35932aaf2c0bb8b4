"""Encoded matrix-vector products (one activation row, as in a decode step) through real IREE:
q4's grouped matvec (per-group partial dot products, the group's scale and offset folded in
once per group) and the CPU matvec tiles every codec's matvec gets (myelin.codecs._matvec),
checked against numpy on the same stored bytes, with and without data tiling, plus the
no-materialization check and a CUDA compile."""

from __future__ import annotations

import numpy as np
import pytest
from test_codecs_ir import DATA_TILING, Encoded, _function, _name

from myelin.codecs._matvec import CPU_TILES_ATTRIBUTE
from myelin.compiler.pipeline import compile_imported
from myelin.compiler.targets import TargetDevice

CODECS = ["fp16", "bf16", "int8", "q4", "q4:g16"]
# K longer than q4's chunk of 256 (a many-row contraction is cut there; a matvec is not)
N, K = 96, 320


def _functions(c: str) -> str:
    return f"""
  util.global private @w_lin_{c} = #flow.parameter.named<"g"::"lin_{c}"> : tensor<{N}x{K}xf32>
  util.global private @w_mm_{c} = #flow.parameter.named<"g"::"mm_{c}"> : tensor<{K}x{N}xf32>
  func.func @lin_{c}(%x: tensor<1x1x{K}xf32>) -> tensor<1x1x{N}xf32> {{
    %w = util.global.load @w_lin_{c} : tensor<{N}x{K}xf32>
    %e0 = tensor.empty() : tensor<{K}x{N}xf32>
    %t = linalg.transpose ins(%w : tensor<{N}x{K}xf32>) outs(%e0 : tensor<{K}x{N}xf32>) permutation = [1, 0]
    %e1 = tensor.empty() : tensor<1x{K}x{N}xf32>
    %bc = linalg.broadcast ins(%t : tensor<{K}x{N}xf32>) outs(%e1 : tensor<1x{K}x{N}xf32>) dimensions = [0]
    %z = arith.constant 0.0 : f32
    %e2 = tensor.empty() : tensor<1x1x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e2 : tensor<1x1x{N}xf32>) -> tensor<1x1x{N}xf32>
    %y = linalg.batch_matmul ins(%x, %bc : tensor<1x1x{K}xf32>, tensor<1x{K}x{N}xf32>) outs(%acc : tensor<1x1x{N}xf32>) -> tensor<1x1x{N}xf32>
    return %y : tensor<1x1x{N}xf32>
  }}
  func.func @mm_{c}(%x: tensor<1x{K}xf32>, %bias: tensor<1x{N}xf32>) -> tensor<1x{N}xf32> {{
    %w = util.global.load @w_mm_{c} : tensor<{K}x{N}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{N}xf32>) outs(%bias : tensor<1x{N}xf32>) -> tensor<1x{N}xf32>
    return %y : tensor<1x{N}xf32>
  }}"""


MODEL = "module @matvec {" + "".join(_functions(_name(c)) for c in CODECS) + "\n}\n"


@pytest.fixture(scope="module")
def encoded() -> Encoded:
    return Encoded(MODEL, [(f"{kind}_{_name(c)}", c) for c in CODECS for kind in ("lin", "mm")])


@pytest.fixture(scope="module", params=DATA_TILING, ids=["plain", "data_tiling"])
def call(encoded, request):
    return encoded.session(data_tiling=request.param)


@pytest.mark.parametrize("codec", CODECS)
def test_matvec_matches_numpy_on_the_stored_bytes(encoded, call, codec):
    c, rng = _name(codec), np.random.default_rng(5)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    np.testing.assert_allclose(
        call(f"lin_{c}", x), x @ encoded.decoded(f"lin_{c}").T, rtol=1e-5, atol=1e-5
    )
    x2, bias = rng.standard_normal((1, K)).astype(np.float32), np.ones((1, N), np.float32)
    np.testing.assert_allclose(
        call(f"mm_{c}", x2, bias), bias + x2 @ encoded.decoded(f"mm_{c}"), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("data_tiling", DATA_TILING, ids=["plain", "data_tiling"])
def test_q4_matvec_is_one_grouped_dispatch_and_materializes_nothing(encoded, data_tiling):
    found, text = encoded.check(data_tiling=data_tiling)
    assert found == []
    for c in ("q4", "q4_g16"):
        for name in (f"lin_{c}", f"mm_{c}"):
            body = _function(text, name)
            # one dispatch: the activation's group sums, the unpack, the per-group partial
            # products and the sum over groups; no chunks of the contracted axis and no
            # collapsed [K, N] tile of decoded floats
            assert body.count("flow.dispatch.workgroups") == 1, body
            assert body.count("xi4>") >= 1 and "arith.uitofp" in body
            assert "tensor.collapse_shape" not in body
            assert f"tensor<{K}x{N}xf32>" not in body and "linalg.batch_matmul" not in body
    for c in ("fp16", "bf16", "int8"):
        assert _function(text, f"lin_{c}").count("flow.dispatch.workgroups") == 1


def test_cpu_tiles_are_marked_and_cuda_compiles_without_them(encoded):
    """Every codec's matvec carries the CPU tiles; a CUDA compile drops them (sm_80)."""
    from iree.compiler import ir

    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(encoded.graph.module_bytecode)
        marked = str(module).count(CPU_TILES_ATTRIBUTE)
    assert marked == 2 * len(CODECS)
    compiled = compile_imported(
        encoded.graph.module_bytecode, phase="input", devices=[TargetDevice("gpu", target="cuda")]
    )
    assert len(compiled.vmfb) > 0
