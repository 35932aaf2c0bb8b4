"""The q4 skinny-M kernel for Hopper (myelin.kernels._q4) and the codec's kernel form
(myelin.codecs._q4_gpu): the encode step gives exactly the covered q4 matmuls a kernel form, the
kernels step turns it into the kernel's external dispatch, every other compile keeps the fused
decode (and computes what numpy does on the stored bytes), the kernel compiles for sm_90a, and
its Triton source computes the q4 product (Triton's interpreter, on CPU). The GPU run is
tests/gpu/test_cuda_q4_kernel.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from test_codecs_ir import Encoded

from myelin.codecs._q4_gpu import KERNEL_FORM_ATTRIBUTE, Q4_MATMUL_ATTRIBUTE, choose_kernel_forms
from myelin.compiler.session import CompilerSession
from myelin.kernels import _q4

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason='Triton is a build extra (".[kernels]")'
)

K, N = 256, 128


def _linear(name: str, x: str, n: int, k: int, act: str = "f16") -> str:
    """A torch-style Linear as the torch frontend imports it: w [n, k] transposed, an f32
    accumulation into a zero fill."""
    rows = x.removeprefix("tensor<").split("x")[:-1]
    out = "tensor<" + "x".join([*rows[:-1], str(n)]) + "xf32>"
    wt = f"tensor<{k}x{n}x{act}>"
    if len(rows) == 2:
        mm = f"linalg.matmul ins(%x, %t : {x}, {wt}) outs(%acc : {out}) -> {out}"
        b = ""
    else:  # [b, 1, k] x the weight broadcast over b: the decoder's decode step
        bt = f"tensor<{rows[0]}x{k}x{n}x{act}>"
        b = f"""%e3 = tensor.empty() : {bt}
    %bc = linalg.broadcast ins(%t : {wt}) outs(%e3 : {bt}) dimensions = [0]
    """
        mm = f"linalg.batch_matmul ins(%x, %bc : {x}, {bt}) outs(%acc : {out}) -> {out}"
    return f"""
  util.global private @w_{name} = #flow.parameter.named<"g"::"{name}"> : tensor<{n}x{k}x{act}>
  func.func @{name}(%x: {x}) -> {out} {{
    %w = util.global.load @w_{name} : tensor<{n}x{k}x{act}>
    %e0 = tensor.empty() : {wt}
    %t = linalg.transpose ins(%w : tensor<{n}x{k}x{act}>) outs(%e0 : {wt}) permutation = [1, 0]
    {b}%z = arith.constant 0.0 : f32
    %e2 = tensor.empty() : {out}
    %acc = linalg.fill ins(%z : f32) outs(%e2 : {out}) -> {out}
    %y = {mm}
    return %y : {out}
  }}"""


# covered: 8 rows (2-D and batch-of-1-rows forms), f16 and bf16; not covered: 32 rows, 96
# outputs, f32 activations
COVERED = {"dec8": 8, "bdec8": 8, "dec1": 1, "bf": 4}
MODEL = (
    "module @q4gpu {"
    + _linear("dec8", f"tensor<8x{K}xf16>", N, K)
    + _linear("bdec8", f"tensor<8x1x{K}xf16>", N, K)
    + _linear("dec1", f"tensor<1x{K}xf16>", N, K)
    + _linear("bf", f"tensor<4x{K}xbf16>", N, K, "bf16")
    + _linear("rows32", f"tensor<32x{K}xf16>", N, K)
    + _linear("n96", f"tensor<8x{K}xf16>", 96, K)
    + _linear("f32", f"tensor<8x{K}xf32>", N, K, "f32")
    + "\n}\n"
)


@pytest.fixture(scope="module")
def encoded() -> Encoded:
    return Encoded(MODEL, [("*", "q4")])


def _ops(module_bytecode: bytes, attribute: str) -> list[str]:
    found: list[str] = []
    with CompilerSession(["--iree-hal-target-device=cuda"]) as session:
        module = session.parse(module_bytecode)
        with session.context:

            def visit(op):
                if attribute in op.attributes:
                    found.append(str(op.attributes[attribute]).strip('"'))
                return 0  # WalkResult.ADVANCE

            module.operation.walk(visit)
    return found


def test_the_encode_step_gives_only_covered_matmuls_a_kernel_form(encoded):
    forms = sorted(_ops(encoded.graph.module_bytecode, Q4_MATMUL_ATTRIBUTE))
    assert forms == sorted(f"g::{name}" for name in COVERED)
    assert sorted(_ops(encoded.graph.module_bytecode, KERNEL_FORM_ATTRIBUTE)) == forms


def test_covers_says_why_not():
    assert _q4.covers("f16", 8, 4096, 4096, 32) is None
    assert "M = 32" in _q4.covers("f16", 32, 4096, 4096, 32)
    assert "M = None" in _q4.covers("f16", None, 4096, 4096, 32)
    assert "N % 64" in _q4.covers("f16", 8, 96, 4096, 32)
    assert "f32" in _q4.covers("f32", 8, 4096, 4096, 32)
    assert "q4:g32" in _q4.covers("f16", 8, 4096, 4096, 16)


def test_split_k_fills_the_h200():
    """Every decoder7b projection gets 256 outputs a program and a split of its groups that
    fills the H200 (at least 256 programs) with at most 16 groups a program; 11008 = 43 * 256
    contracted elements split 43 ways (the old power-of-two rule gave 128 programs)."""
    want = {(4096, 4096): 16, (11008, 4096): 8, (4096, 11008): 43, (32000, 4096): 8}
    for (n, k), split in want.items():
        c = _q4.choose("f16", n, k)
        blocks, got = c.grid
        assert (c.block_n, got) == (256, split), c
        assert blocks * got >= 256 and k % (got * _q4.GROUP) == 0, c
        assert k // got // _q4.GROUP <= 16, c


def test_other_compiles_keep_the_fused_decode_and_compute_the_q4_product(encoded):
    call = encoded.session()  # llvm-cpu: the compile step chooses the fused form
    rng = np.random.default_rng(5)
    for name, rows in [("dec8", (8,)), ("bdec8", (8, 1)), ("rows32", (32,))]:
        x = rng.standard_normal((*rows, K)).astype(np.float16)
        want = x.astype(np.float32) @ encoded.decoded(name).T.astype(np.float32)
        np.testing.assert_allclose(call(name, x), want, rtol=2e-3, atol=2e-3)


def test_choosing_the_fused_form_leaves_no_kernel_form(encoded):
    with CompilerSession(["--iree-hal-target-device=cuda"]) as session:
        module = session.parse(encoded.graph.module_bytecode)
        with session.context:
            choose_kernel_forms(module.operation, False)
            text = str(module)
    assert Q4_MATMUL_ATTRIBUTE not in text and KERNEL_FORM_ATTRIBUTE not in text


@needs_triton
def test_the_kernels_step_puts_the_q4_kernel_in_place_of_each_covered_matmul(encoded):
    from myelin.kernels import apply_kernels

    result = apply_kernels(encoded.graph.module_bytecode, library="triton")
    q4_sites = [s for s in result.sites if s["op"] == "q4_matmul"]
    assert sorted(s["location"] for s in q4_sites) == sorted(f"g::{n}" for n in COVERED)
    assert all(s["kernel"].startswith("plex_q4_matmul_") for s in q4_sites)
    by_name = {s["location"]: s for s in q4_sites}
    assert (by_name["g::bdec8"]["m"], by_name["g::bdec8"]["n"], by_name["g::bdec8"]["k"]) == (
        8,
        N,
        K,
    )
    assert by_name["g::bf"]["dtype"] == "bf16"
    assert any(k.startswith("plex_q4_matmul_bf16") for k in result.kernels)
    assert _ops(result.module_bytecode, Q4_MATMUL_ATTRIBUTE) == []
    with CompilerSession(["--iree-hal-target-device=cuda"]) as session:
        text = str(session.parse(result.module_bytecode))
    # one wrapper per kernel and operand types (dec8 and bdec8 share one), one call per use
    assert text.count('hal.dispatch.extern "plex_q4_matmul_') == 3
    assert text.count("util.call @__plex_q4_kernel_") == len(COVERED)
    # the kernel reads the codes in place (a byte view of the i4 parameter), nothing decoded
    assert "flow.tensor.bitcast" in text
    # the uncovered q4 matmuls keep the codec's fused decode
    assert text.count("plex.decode") >= 3


@needs_triton
def test_the_q4_kernel_compiles_for_sm90a():
    c = _q4.choose("f16", 4096, 4096)
    kernel = _q4.compile_q4(c)
    assert kernel.cubin[:4] == b"\x7fELF" and kernel.name == c.name
    entry = kernel.ptx[kernel.ptx.index(".entry") :].split("{", 1)[0]
    assert entry.count(".param") == 8  # 7 bindings and M: exactly what IREE passes
    assert ".target sm_90a" in kernel.ptx


_INTERPRETED = """
import numpy as np, torch
from myelin.codecs import q4
from myelin.kernels import _q4
from myelin.kernels._q4_triton import plex_q4_matmul
rng = np.random.default_rng(0)
t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
# blocks of 128, 256 and 64 outputs; splits 2, 3 (12 groups: not a power of 2) and 2
for m, n, k in [(5, 128, 256), (8, 256, 384), (3, 192, 256)]:
    w = rng.normal(0, 0.02, (n, k)).astype(np.float32)
    layout = q4.layout((n, k), "float32", (1,), {"group": 32, "order": (1, 0)})
    parts = q4.encode(w, layout)
    x = rng.normal(0, 1, (m, k)).astype(np.float16)
    want = x.astype(np.float32) @ q4.decode(parts, layout).T
    c = _q4.choose("f16", n, k)
    part = torch.zeros((c.split, m, n), dtype=torch.float32)
    plex_q4_matmul[c.grid](t(x), t(parts[0]), t(parts[1].view(np.uint8)),
                           t(parts[2].view(np.int8)), t(parts[3]), t(parts[4]), part, m,
                           N=n, K=k, KS=k // c.split, G=32, BM=16, BN=c.block_n)
    err = np.abs(part.sum(0).numpy() - want).max() / np.abs(want).max()
    assert err <= 1e-5, err
    print("ok", c.split, err)
"""


@needs_triton
def test_the_kernel_source_computes_the_q4_product():
    """Triton's interpreter on CPU (its own process: Triton reads TRITON_INTERPRET when it
    first loads), against the numpy decode of the same stored parts, in fp32: max error at most
    1e-5 of the largest output."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line.split()[:2] for line in done.stdout.splitlines()] == [
        ["ok", "2"],
        ["ok", "3"],
        ["ok", "2"],
    ]
