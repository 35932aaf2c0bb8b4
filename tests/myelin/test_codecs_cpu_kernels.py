"""Encoded matvecs on x86 CPUs through the C kernels linked into IREE's executable
(myelin.codecs._cpu_kernels): q4 (AVX-512 VNNI where the CPU has it, else AVX2), int8 (AVX-512
VNNI) and fp16 (AVX-512), on their blocked layouts [N / B, K, B], each checked against numpy on
the stored bytes (q4's and int8's activation quantized to 8 bits per group of 32 the same way
in numpy; the float decode by cosine), the IR they leave (one kernel dispatch reading the
encoded parameters, nothing decoded), and the variants that keep IREE's code."""

from __future__ import annotations

import numpy as np
import pytest
from test_codecs_ir import Encoded, _function

from myelin import hostinfo
from myelin.codecs import _cpu_kernels as cpu_kernels
from myelin.codecs import check_encoded_module, q4
from myelin.compiler.targets import TargetDevice, target_flags

N, K = 128, 160  # one AVX-512 q4/fp16 block of 128 outputs (two int8 blocks), five groups of 32
M = 256  # the matmul's outputs: a second kernel executable in the same module
NARROW = 192  # outputs no AVX-512 q4 block (128) divides: the AVX2 q4 kernel's (64) does
# fp16 stores [N / B, K, B], B = 256 where N is a multiple (9 blocks here, one workgroup each),
# else 128 (N: one block, NARROW_16: 17 blocks); q4 the same (B = 256, else 128, else 64)
WIDE = 9 * 256
NARROW_16 = 17 * 128
AVX2 = TargetDevice("cpu", cpu="haswell", cpu_features="+avx2,+fma")  # no AVX-512: q4 on AVX2
HOST = cpu_kernels.select([TargetDevice("cpu")])


def needs(form: str):
    return pytest.mark.skipif(form not in HOST, reason=f"the host CPU has no {form} kernel")


MODEL = f"""module @kernel {{
  util.global private @w_lin = #flow.parameter.named<"g"::"lin"> : tensor<{N}x{K}xf32>
  util.global private @w_mm = #flow.parameter.named<"g"::"mm"> : tensor<{K}x{M}xf32>
  util.global private @w_g16 = #flow.parameter.named<"g"::"g16"> : tensor<{K}x{N}xf32>
  util.global private @w_narrow = #flow.parameter.named<"g"::"narrow"> : tensor<{K}x{NARROW}xf32>
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
  util.global private @w_wide = #flow.parameter.named<"g"::"wide"> : tensor<{K}x{WIDE}xf32>
  func.func @wide(%x: tensor<1x{K}xf32>) -> tensor<1x{WIDE}xf32> {{
    %w = util.global.load @w_wide : tensor<{K}x{WIDE}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<1x{WIDE}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<1x{WIDE}xf32>) -> tensor<1x{WIDE}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{WIDE}xf32>) outs(%acc : tensor<1x{WIDE}xf32>) -> tensor<1x{WIDE}xf32>
    return %y : tensor<1x{WIDE}xf32>
  }}
  util.global private @w_pa = #flow.parameter.named<"g"::"pa"> : tensor<{K}x{N}xf32>
  util.global private @w_pb = #flow.parameter.named<"g"::"pb"> : tensor<{K}x{N}xf32>
  func.func @pair(%x: tensor<1x{K}xf32>) -> tensor<1x{N}xf32> {{
    %a = util.global.load @w_pa : tensor<{K}x{N}xf32>
    %b = util.global.load @w_pb : tensor<{K}x{N}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<1x{N}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<1x{N}xf32>) -> tensor<1x{N}xf32>
    %ya = linalg.matmul ins(%x, %a : tensor<1x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<1x{N}xf32>) -> tensor<1x{N}xf32>
    %yb = linalg.matmul ins(%x, %b : tensor<1x{K}xf32>, tensor<{K}x{N}xf32>) outs(%acc : tensor<1x{N}xf32>) -> tensor<1x{N}xf32>
    %y = arith.addf %ya, %yb : tensor<1x{N}xf32>
    return %y : tensor<1x{N}xf32>
  }}
  util.global private @w_n16 = #flow.parameter.named<"g"::"n16"> : tensor<{K}x{NARROW_16}xf32>
  func.func @n16(%x: tensor<1x{K}xf32>) -> tensor<1x{NARROW_16}xf32> {{
    %w = util.global.load @w_n16 : tensor<{K}x{NARROW_16}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<1x{NARROW_16}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<1x{NARROW_16}xf32>) -> tensor<1x{NARROW_16}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{NARROW_16}xf32>) outs(%acc : tensor<1x{NARROW_16}xf32>) -> tensor<1x{NARROW_16}xf32>
    return %y : tensor<1x{NARROW_16}xf32>
  }}
  func.func @narrow(%x: tensor<1x{K}xf32>) -> tensor<1x{NARROW}xf32> {{
    %w = util.global.load @w_narrow : tensor<{K}x{NARROW}xf32>
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<1x{NARROW}xf32>
    %acc = linalg.fill ins(%z : f32) outs(%e : tensor<1x{NARROW}xf32>) -> tensor<1x{NARROW}xf32>
    %y = linalg.matmul ins(%x, %w : tensor<1x{K}xf32>, tensor<{K}x{NARROW}xf32>) outs(%acc : tensor<1x{NARROW}xf32>) -> tensor<1x{NARROW}xf32>
    return %y : tensor<1x{NARROW}xf32>
  }}
}}
"""


@pytest.fixture(scope="module")
def encoded() -> Encoded:
    return Encoded(
        MODEL,
        [
            ("lin", "q4"),
            ("mm", "q4"),
            ("g16", "q4:g16"),
            ("narrow", "q4"),
            ("wide", "q4"),  # 9 stored blocks of 256 outputs
            ("n16", "q4"),  # 17 of 128
            ("pa", "q4"),  # two matvecs of one activation: one quantizer dispatch
            ("pb", "q4"),
        ],
    )


@pytest.fixture(scope="module")
def encoded_int8() -> Encoded:
    return Encoded(
        MODEL,
        [
            ("lin", "int8"),
            ("mm", "int8"),
            ("g16", "fp16"),
            ("narrow", "int8"),
            ("wide", "fp16"),
            ("n16", "fp16"),
            ("pa", "int8"),
            ("pb", "int8"),
        ],
    )


def _q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation quantized per group of 32 as the kernels do (cpu_matvec.h: round half
    away from zero, in float32): (codes [G, 32], d [G], exact group sums [G])."""
    xg = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xg).max(axis=1)
    t = xg * (np.float32(127) / amax)[:, None]
    xq = np.trunc(t + np.where(t < 0, np.float32(-0.5), np.float32(0.5))).astype(np.int64)
    return xq, (amax / np.float32(127)).astype(np.float64), xg.astype(np.float64).sum(1)


def _q4_reference(
    encoded: Encoded, key: str, x: np.ndarray, init: np.ndarray, n: int = N
) -> np.ndarray:
    """What the q4 kernels compute, in numpy on the stored parts: integer dot products with the
    quantized activation, the factors in float."""
    stored = {s.key: s.data for s in encoded.graph.stored}
    block = next(b for b in cpu_kernels.Q4_BLOCKS if n % b == 0)  # [N / B, K, B] codes
    codes = _unblocked(q4.unpack(stored[key], K * n), n, block).astype(np.int64)
    scale = _unblocked(stored[f"{key}.scale"], n, block, K // 32).astype(np.float64)
    offset = _unblocked(stored[f"{key}.offset"], n, block, K // 32).astype(np.float64)
    rs, ro = stored[f"{key}.row_scale"], stored[f"{key}.row_offset"]
    xq, d, xs = _q8(x)
    partial = np.einsum("ge,gen->gn", xq, codes.reshape(-1, 32, n))
    folded = rs * (d[:, None] * scale * partial).sum(0)
    folded += ro * (xs[:, None] * offset).sum(0)
    return init.reshape(-1) + folded


def _unblocked(stored: np.ndarray, n: int, block: int, rows: int = K) -> np.ndarray:
    """Blocks of outputs [N / B, rows, B] (the stored layout of fp16, int8 and q4 codes, of q4's
    group factors with K / 32 rows) as [rows, N]: block b holds outputs [b * B, (b + 1) * B),
    row by row."""
    return stored.reshape(n // block, rows, block).transpose(1, 0, 2).reshape(rows, n)


def _int8_reference(
    encoded: Encoded, key: str, x: np.ndarray, init: np.ndarray, n: int
) -> np.ndarray:
    """What the int8 kernel computes: integer dot products of the stored codes (blocks of 256
    outputs, else 64) with the quantized activation per group, times d per group, times the
    output's scale."""
    stored = {s.key: s.data for s in encoded.graph.stored}
    codes = _unblocked(stored[key], n, 256 if n % 256 == 0 else 64).astype(np.int64)
    xq, d, _ = _q8(x)
    partial = np.einsum("ge,gen->gn", xq, codes.reshape(-1, 32, n))
    scale = stored[f"{key}.scale"].reshape(-1)
    return init.reshape(-1) + scale * (d[:, None] * partial).sum(0)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to float32 summation order: relative to the largest output."""
    got, want = got.reshape(-1), want.reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _check_q4(encoded: Encoded, call) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    got = call("lin", x)
    _close(got, _q4_reference(encoded, "lin", x, np.zeros(N, np.float32)))
    # against the weight's float decode: only the activation's 8-bit quantization differs
    assert _cosine(got, x @ encoded.decoded("lin").T) > 0.999
    x2 = rng.standard_normal((1, K)).astype(np.float32)
    bias = rng.standard_normal((1, M)).astype(np.float32)
    _close(call("mm", x2, bias), _q4_reference(encoded, "mm", x2, bias, M))
    zeros = np.zeros(NARROW, np.float32)
    _close(call("narrow", x2), _q4_reference(encoded, "narrow", x2, zeros, NARROW))
    for name, n in (("wide", WIDE), ("n16", NARROW_16)):  # a workgroup walks several blocks
        _close(call(name, x2), _q4_reference(encoded, name, x2, np.zeros(n, np.float32), n))
    zeros = np.zeros(N, np.float32)
    want = _q4_reference(encoded, "pa", x2, zeros) + _q4_reference(encoded, "pb", x2, zeros)
    _close(call("pair", x2), want)
    # q4:g16 is no group the kernels take: the grouped matvec, exact to the float decode
    bias = bias[:, :N]
    got = call("g16", x2, bias)
    np.testing.assert_allclose(got, bias + x2 @ encoded.decoded("g16"), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def host_call(encoded):
    return encoded.session()


@needs("q4")
def test_q4_kernel_matches_numpy_on_the_stored_bytes(encoded, host_call):
    _check_q4(encoded, host_call)


@needs("q4")
def test_q4_avx2_kernel_matches_numpy_on_the_stored_bytes(encoded):
    # a variant for a CPU named with AVX2 only: the AVX2 kernel, on this host too
    assert [k.name for k in cpu_kernels.select([AVX2])["q4"]] == ["q4_matvec_avx2"]
    _check_q4(encoded, encoded.session(device=AVX2))


@needs("int8")
@needs("fp16")
def test_int8_and_fp16_kernels_match_numpy_on_the_stored_bytes(encoded_int8):
    _check_int8_fp16(encoded_int8, encoded_int8.session())


def _check_int8_fp16(encoded_int8: Encoded, call) -> None:
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    got = call("lin", x)
    _close(got, _int8_reference(encoded_int8, "lin", x, np.zeros(N, np.float32), N))
    assert _cosine(got, x @ encoded_int8.decoded("lin").T) > 0.9999
    x2 = rng.standard_normal((1, K)).astype(np.float32)
    bias = rng.standard_normal((1, M)).astype(np.float32)
    _close(call("mm", x2, bias), _int8_reference(encoded_int8, "mm", x2, bias, M))
    zeros = np.zeros(NARROW, np.float32)  # 3 blocks of 64
    _close(call("narrow", x2), _int8_reference(encoded_int8, "narrow", x2, zeros, NARROW))
    zeros = np.zeros(N, np.float32)
    pair = [_int8_reference(encoded_int8, k, x2, zeros, N) for k in ("pa", "pb")]
    _close(call("pair", x2), pair[0] + pair[1])
    # fp16: no quantization, the float decode up to summation order; and that of the stored
    # blocks by hand
    bias = bias[:, :N]
    _close(call("g16", x2, bias), bias + x2 @ encoded_int8.decoded("g16"))
    _close(call("n16", x2), x2 @ encoded_int8.decoded("n16"))
    got = call("wide", x2)
    _close(got, x2 @ encoded_int8.decoded("wide"))
    stored = {s.key: s.data for s in encoded_int8.graph.stored}["wide"]
    _close(got, x2 @ _unblocked(stored, WIDE, 256).astype(np.float32))


@needs("q4")
@needs("int8")
@needs("fp16")
def test_kernels_that_prefetch_compute_what_the_others_do(encoded, encoded_int8, monkeypatch):
    # Only a Zen 5 target prefetches down the weight stream (PREFETCH_AHEAD_BYTES): here the
    # host's CPU is given the distance, so the prefetching objects are built and run whatever
    # this CPU is
    monkeypatch.setattr(cpu_kernels, "PREFETCH_AHEAD_BYTES", {hostinfo.llvm_cpu() or "": 4096})
    host = cpu_kernels.select([TargetDevice("cpu")])
    assert {k.ahead_bytes for ks in host.values() for k in ks} == {4096}
    assert all("-DPLEX_AHEAD_BYTES=4096" in k.cflags for ks in host.values() for k in ks)
    _check_q4(encoded, encoded.session())
    _check_int8_fp16(encoded_int8, encoded_int8.session())


def _kernel_calls(encoded: Encoded, calls: dict[str, str]) -> str:
    """The dispatch-creation IR for the host CPU; each function of `calls` one dispatch of the
    kernel executable named there, reading the stored parameters."""
    text: list[str] = []
    cpu = TargetDevice("cpu")  # this host's CPU: its kernels apply
    found = check_encoded_module(
        encoded.graph.module_bytecode,
        target_flags([cpu]),
        encoded.parts,
        encoded.sizes,
        devices=[cpu],
        text=text,
    )
    assert found == []
    for name, executable in calls.items():
        body = _function(text[0], name)
        assert body.count(f"flow.dispatch @{executable}") == 1, body
        assert "flow.dispatch.workgroups" not in body and "itofp" not in body
        assert "arith.extf" not in body
    assert "hal.import.static" in text[0]
    return text[0]


@needs("q4")
def test_q4_kernel_dispatch_reads_the_encoded_parameters_and_materializes_nothing(encoded):
    kernel = HOST["q4"][0]
    calls = {"lin": f"__plex_{kernel.name}_{K}x{N}", "mm": f"__plex_{kernel.name}_{K}x{M}"}
    # the first kernel that takes the shape: on an AVX-512 CPU, AVX2's for 192 outputs
    calls["narrow"] = f"__plex_{HOST['q4'][-1].name}_{K}x{NARROW}"
    text = _kernel_calls(encoded, calls)
    for name, n in (("lin", N), ("mm", M)):  # blocks of 128 and of 256 outputs
        body = _function(text, name)
        block = 256 if n % 256 == 0 else 128
        assert f"tensor<{n // block}x5x32x{block}xi4>" in body, body
        assert f"tensor<{K}x{n}xf32>" not in body
    assert _function(text, "g16").count("flow.dispatch.workgroups") == 1
    assert kernel.symbol in text
    _quantized_once(text, kernel)


def _quantized_once(text: str, kernel: cpu_kernels.Kernel) -> None:
    """Each function's matvecs read the activation packed by one dispatch of the kernel's
    quantizer, `pair`'s two matvecs of one activation included."""
    quantizer = f"flow.dispatch @__plex_{kernel.name}_quantize_{K}"
    assert kernel.quantizer in text
    for name in ("lin", "mm", "pair"):
        assert _function(text, name).count(quantizer) == 1, name
    pair = _function(text, "pair")
    assert pair.count(f"flow.dispatch @__plex_{kernel.name}_{K}x{N}") == 2, pair


@needs("int8")
@needs("fp16")
def test_int8_and_fp16_kernel_dispatches_read_the_encoded_parameters(encoded_int8):
    int8, fp16 = HOST["int8"][0].name, HOST["fp16"][0].name
    calls = {"lin": f"__plex_{int8}_{K}x{N}", "mm": f"__plex_{int8}_{K}x{M}"}
    calls |= {"g16": f"__plex_{fp16}_{K}x{N}", "wide": f"__plex_{fp16}_{K}x{WIDE}"}
    text = _kernel_calls(encoded_int8, calls)
    assert f"tensor<{N // 64}x{K}x64xi8>" in _function(text, "lin")
    assert f"tensor<1x{K}x256xi8>" in _function(text, "mm")
    assert f"tensor<1x{K}x128xf16>" in _function(text, "g16")
    assert f"tensor<{WIDE // 256}x{K}x256xf16>" in _function(text, "wide")
    _quantized_once(text, HOST["int8"][0])
    assert "quantize" not in _function(text, "g16")  # fp16 reads the activation as it is


def _names(device: TargetDevice) -> dict[str, list[str]]:
    return {form: [k.name for k in ks] for form, ks in cpu_kernels.select([device]).items()}


def test_kernel_selection_follows_the_target_cpu_features():
    assert _names(TargetDevice("gpu", target="cuda")) == {}
    assert _names(TargetDevice("cpu", target="vmvx")) == {}
    assert _names(TargetDevice("cpu", cpu_features="+sse4.2")) == {}
    assert cpu_kernels.select([TargetDevice("a"), TargetDevice("b")]) == {}
    assert _names(TargetDevice("cpu", cpu="x86-64")) == {}  # a CPU named, no features
    if hostinfo.machine() == "x86_64":
        assert _names(AVX2) == {"q4": ["q4_matvec_avx2"]}
        vnni = TargetDevice("cpu", cpu_features="+avx2,+fma,+avx512f,+avx512bw,+avx512vnni,+f16c")
        assert _names(vnni) == {
            "q4": ["q4_matvec_avx512vnni", "q4_matvec_avx2"],  # AVX2 for N % 128 != 0
            "int8": ["int8_matvec_avx512vnni"],
            "fp16": ["fp16_matvec_avx512"],
        }
        # the prefetch distance follows the CPU named: Zen 5's 4 KiB, none on Zen 4
        for cpu, ahead in (("znver5", 4096), ("znver4", 0), ("x86-64-v4", 0)):
            named = TargetDevice("cpu", cpu=cpu, cpu_features=vnni.cpu_features)
            chosen = cpu_kernels.select([named])
            assert {k.ahead_bytes for ks in chosen.values() for k in ks} == {ahead}
            key = cpu_kernels.selection_key([named])
            assert f" ahead={ahead} " in key
            # the workgroup split changes the executables too: a cache must not serve an old one
            split = f"{cpu_kernels.MAX_WORKGROUPS}/{cpu_kernels.BYTES_PER_QUANTIZING_WORKGROUP}"
            assert key.endswith(f"workgroups={split}")


def test_other_targets_keep_irees_matvec(encoded, encoded_int8):
    # a CPU named without AVX2 (x86-64 baseline): IREE's code, exact to the decode
    device = TargetDevice("cpu", cpu="x86-64")
    x = np.random.default_rng(12).standard_normal((1, K)).astype(np.float32)
    bias = np.ones((1, M), np.float32)
    for enc in (encoded, encoded_int8):
        got = enc.session(device=device)("mm", x, bias)
        np.testing.assert_allclose(got, bias + x @ enc.decoded("mm"), rtol=1e-5, atol=1e-5)
    # fp16's blocks decoded by IREE's code: the same outputs
    got = encoded_int8.session(device=device)("wide", x)
    np.testing.assert_allclose(got, x @ encoded_int8.decoded("wide"), rtol=1e-5, atol=1e-5)
