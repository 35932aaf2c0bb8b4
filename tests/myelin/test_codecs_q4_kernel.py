"""q4 matvecs on AVX2 CPUs through the C kernel linked into IREE's executable
(myelin.codecs._q4_kernel): checked against numpy on the stored bytes (the Q8 activation
quantization done the same way in numpy, and the float decode by cosine), the IR it leaves (one
kernel dispatch reading the encoded parameters, nothing decoded), and the variants that keep the
grouped matvec."""

from __future__ import annotations

import numpy as np
import pytest
from test_codecs_ir import Encoded, _function

from myelin import hostinfo
from myelin.codecs import _q4_kernel as q4_kernel
from myelin.codecs import check_encoded_module, q4
from myelin.compiler.targets import TargetDevice, target_flags

N, K = 128, 160  # two kernel blocks of 64 outputs, five groups of 32
M = 192  # the matmul's outputs: a second kernel executable in the same module

needs_avx2 = pytest.mark.skipif(
    not q4_kernel.applies([TargetDevice("cpu")]), reason="the host CPU has no AVX2 + FMA"
)

MODEL = f"""module @kernel {{
  util.global private @w_lin = #flow.parameter.named<"g"::"lin"> : tensor<{N}x{K}xf32>
  util.global private @w_mm = #flow.parameter.named<"g"::"mm"> : tensor<{K}x{M}xf32>
  util.global private @w_g16 = #flow.parameter.named<"g"::"g16"> : tensor<{K}x{N}xf32>
  func.func @lin(%x: tensor<1x1x{K}xf32>) -> tensor<1x1x{N}xf32> {{
    %w = util.global.load @w_lin : tensor<{N}x{K}xf32>
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
  func.func @mm(%x: tensor<1x{K}xf32>, %bias: tensor<1x{M}xf32>) -> tensor<1x{M}xf32> {{
    %w = util.global.load @w_mm : tensor<{K}x{M}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{M}xf32>) outs(%bias : tensor<1x{M}xf32>) -> tensor<1x{M}xf32>
    return %y : tensor<1x{M}xf32>
  }}
  func.func @g16(%x: tensor<1x{K}xf32>, %bias: tensor<1x{N}xf32>) -> tensor<1x{N}xf32> {{
    %w = util.global.load @w_g16 : tensor<{K}x{N}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{N}xf32>) outs(%bias : tensor<1x{N}xf32>) -> tensor<1x{N}xf32>
    return %y : tensor<1x{N}xf32>
  }}
}}
"""


@pytest.fixture(scope="module")
def encoded() -> Encoded:
    return Encoded(MODEL, [("lin", "q4"), ("mm", "q4"), ("g16", "q4:g16")])


def _q8_reference(
    encoded: Encoded, key: str, x: np.ndarray, init: np.ndarray, n: int = N
) -> np.ndarray:
    """What the kernel computes, in numpy on the stored parts: the activation quantized per
    group of 32 (round half away from zero, in float32 as the C code), integer dot products,
    the factors in float."""
    stored = {s.key: s.data for s in encoded.graph.stored}
    codes = q4.unpack(stored[key], K * n).reshape(K, n).astype(np.int64)
    scale = stored[f"{key}.scale"].reshape(-1, n).astype(np.float64)
    offset = stored[f"{key}.offset"].reshape(-1, n).astype(np.float64)
    rs, ro = stored[f"{key}.row_scale"], stored[f"{key}.row_offset"]
    xg = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xg).max(axis=1)
    inv = np.float32(127) / amax
    t = xg * inv[:, None]
    xq = np.trunc(t + np.where(t < 0, np.float32(-0.5), np.float32(0.5))).astype(np.int64)
    d = (amax / np.float32(127)).astype(np.float64)
    partial = np.einsum("ge,gen->gn", xq, codes.reshape(-1, 32, n))
    folded = rs * (d[:, None] * scale * partial).sum(0)
    folded += ro * (xg.astype(np.float64).sum(1)[:, None] * offset).sum(0)
    return init.reshape(-1) + folded


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def host_call(encoded):
    return encoded.session()


@needs_avx2
def test_kernel_matches_numpy_on_the_stored_bytes(encoded, host_call):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    got = host_call("lin", x)
    want = _q8_reference(encoded, "lin", x, np.zeros(N, np.float32))
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # against the weight's float decode: only the activation's 8-bit quantization differs
    assert _cosine(got, x @ encoded.decoded("lin").T) > 0.999
    x2 = rng.standard_normal((1, K)).astype(np.float32)
    bias = rng.standard_normal((1, M)).astype(np.float32)
    got = host_call("mm", x2, bias)
    want = _q8_reference(encoded, "mm", x2, bias, M)
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # q4:g16 is no group the kernel takes: the grouped matvec, exact to the float decode
    bias = bias[:, :N]
    got = host_call("g16", x2, bias)
    np.testing.assert_allclose(got, bias + x2 @ encoded.decoded("g16"), rtol=1e-5, atol=1e-5)


@needs_avx2
def test_kernel_dispatch_reads_the_encoded_parameters_and_materializes_nothing(encoded):
    text: list[str] = []
    cpu = TargetDevice("cpu")  # this host's CPU, which has AVX2: the kernel applies
    flags = target_flags([cpu])
    parts, sizes = encoded.parts, encoded.sizes
    found = check_encoded_module(
        encoded.graph.module_bytecode, flags, parts, sizes, devices=[cpu], text=text
    )
    assert found == []
    for name, n in (("lin", N), ("mm", M)):
        body = _function(text[0], name)
        # one dispatch, of the kernel's executable, whose operands are the parameters' loads
        assert body.count(f"flow.dispatch @__plex_q4_matvec_{K}x{n}") == 1, body
        assert "flow.dispatch.workgroups" not in body and "arith.uitofp" not in body
        assert f"tensor<5x32x{n}xi4>" in body and f"tensor<{K}x{n}xf32>" not in body
    assert _function(text[0], "g16").count("flow.dispatch.workgroups") == 1
    assert "hal.import.static" in text[0] and q4_kernel.SYMBOL in text[0]


def test_other_targets_keep_the_grouped_matvec(encoded):
    assert not q4_kernel.applies([TargetDevice("gpu", target="cuda")])
    assert not q4_kernel.applies([TargetDevice("cpu", target="vmvx")])
    assert not q4_kernel.applies([TargetDevice("cpu", cpu_features="+sse4.2")])
    assert not q4_kernel.applies([TargetDevice("a"), TargetDevice("b")])
    if hostinfo.machine() == "x86_64":
        assert q4_kernel.applies([TargetDevice("cpu", cpu_features="+avx2,+fma")])
    # a CPU named without AVX2 (x86-64 baseline): the grouped matvec, exact to the decode
    device = TargetDevice("cpu", cpu="x86-64")
    assert not q4_kernel.applies([device])
    call = encoded.session(device=device)
    x = np.random.default_rng(12).standard_normal((1, K)).astype(np.float32)
    bias = np.ones((1, M), np.float32)
    got = call("mm", x, bias)
    np.testing.assert_allclose(got, bias + x @ encoded.decoded("mm"), rtol=1e-5, atol=1e-5)
