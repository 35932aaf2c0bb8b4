"""The kernel library, without a GPU: real Triton kernels compiled for sm_90a, and the rewrite
of a graph's matmuls into their IREE external dispatches, compiled for CUDA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from myelin.compiler.pipeline import compile_module
from myelin.compiler.targets import TargetDevice
from myelin.kernels import apply_kernels
from myelin.kernels._triton import ACTIVATION_CODES, MERGE_CODES, MatmulConfig, compile_matmul
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir

# mm: A x B^T, dynamic M, f32 accumulation narrowed by a truncf (one kernel writes f16);
# mm_ab: A x B at f16; bf16: A x B^T in bf16; decode: M = 8 (the skinny kernel); odd: K = 100 is no multiple of 64 (stays IREE's);
# f32: f32 inputs (no kernel takes them); linear: x @ w.t() as torch's F.linear lowers it (a
# linalg.transpose of the [N, K] weight feeding an A x B matmul: the kernel reads w as B^T);
# biased: a linear's bias add, which the kernel does before writing C.
GRAPH = """
#abt = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>,
        affine_map<(m, n, k) -> (m, n)>]
#id = affine_map<(i, j) -> (i, j)>
func.func @mm(%a: tensor<?x256xf16>, %b: tensor<128x256xf16>) -> tensor<?x128xf16> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x256xf16>
  %e = tensor.empty(%m) : tensor<?x128xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x128xf32>) -> tensor<?x128xf32>
  %r = linalg.matmul indexing_maps = #abt ins(%a, %b : tensor<?x256xf16>, tensor<128x256xf16>)
      outs(%f : tensor<?x128xf32>) -> tensor<?x128xf32>
  %e2 = tensor.empty(%m) : tensor<?x128xf16>
  %t = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%r : tensor<?x128xf32>) outs(%e2 : tensor<?x128xf16>) {
  ^bb0(%x: f32, %y: f16):
    %q = arith.truncf %x : f32 to f16
    linalg.yield %q : f16
  } -> tensor<?x128xf16>
  return %t : tensor<?x128xf16>
}
func.func @mm_ab(%a: tensor<64x256xf16>, %b: tensor<256x128xf16>) -> tensor<64x128xf16> {
  %e = tensor.empty() : tensor<64x128xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<64x128xf16>) -> tensor<64x128xf16>
  %r = linalg.matmul ins(%a, %b : tensor<64x256xf16>, tensor<256x128xf16>)
      outs(%f : tensor<64x128xf16>) -> tensor<64x128xf16>
  return %r : tensor<64x128xf16>
}
func.func @bf16(%a: tensor<32x128xbf16>, %b: tensor<64x128xbf16>) -> tensor<32x64xf32> {
  %e = tensor.empty() : tensor<32x64xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<32x64xf32>) -> tensor<32x64xf32>
  %r = linalg.matmul indexing_maps = #abt ins(%a, %b : tensor<32x128xbf16>, tensor<64x128xbf16>)
      outs(%f : tensor<32x64xf32>) -> tensor<32x64xf32>
  return %r : tensor<32x64xf32>
}
func.func @decode(%a: tensor<8x256xf16>, %b: tensor<128x256xf16>) -> tensor<8x128xf16> {
  %e = tensor.empty() : tensor<8x128xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<8x128xf16>) -> tensor<8x128xf16>
  %r = linalg.matmul indexing_maps = #abt ins(%a, %b : tensor<8x256xf16>, tensor<128x256xf16>)
      outs(%f : tensor<8x128xf16>) -> tensor<8x128xf16>
  return %r : tensor<8x128xf16>
}
func.func @odd(%a: tensor<64x100xf16>, %b: tensor<100x128xf16>) -> tensor<64x128xf16> {
  %e = tensor.empty() : tensor<64x128xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<64x128xf16>) -> tensor<64x128xf16>
  %r = linalg.matmul ins(%a, %b : tensor<64x100xf16>, tensor<100x128xf16>)
      outs(%f : tensor<64x128xf16>) -> tensor<64x128xf16>
  return %r : tensor<64x128xf16>
}
func.func @f32(%a: tensor<64x128xf32>, %b: tensor<128x128xf32>) -> tensor<64x128xf32> {
  %e = tensor.empty() : tensor<64x128xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x128xf32>) -> tensor<64x128xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x128xf32>, tensor<128x128xf32>)
      outs(%f : tensor<64x128xf32>) -> tensor<64x128xf32>
  return %r : tensor<64x128xf32>
}
func.func @linear(%x: tensor<64x256xf16>, %w: tensor<128x256xf16>) -> tensor<64x128xf16> {
  %et = tensor.empty() : tensor<256x128xf16>
  %wt = linalg.transpose ins(%w : tensor<128x256xf16>) outs(%et : tensor<256x128xf16>)
      permutation = [1, 0]
  %e = tensor.empty() : tensor<64x128xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<64x128xf16>) -> tensor<64x128xf16>
  %r = linalg.matmul ins(%x, %wt : tensor<64x256xf16>, tensor<256x128xf16>)
      outs(%f : tensor<64x128xf16>) -> tensor<64x128xf16>
  return %r : tensor<64x128xf16>
}
func.func @biased(%x: tensor<64x256xf16>, %w: tensor<128x256xf16>, %bias: tensor<128xf16>)
    -> tensor<64x128xf16> {
  %e = tensor.empty() : tensor<64x128xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<64x128xf16>) -> tensor<64x128xf16>
  %r = linalg.matmul indexing_maps = #abt ins(%x, %w : tensor<64x256xf16>, tensor<128x256xf16>)
      outs(%f : tensor<64x128xf16>) -> tensor<64x128xf16>
  %b = linalg.generic {indexing_maps = [#id, affine_map<(i, j) -> (j)>, #id],
      iterator_types = ["parallel", "parallel"]}
      ins(%r, %bias : tensor<64x128xf16>, tensor<128xf16>) outs(%e : tensor<64x128xf16>) {
  ^bb0(%v: f16, %c: f16, %o: f16):
    %s = arith.addf %v, %c : f16
    linalg.yield %s : f16
  } -> tensor<64x128xf16>
  return %b : tensor<64x128xf16>
}
"""
FUNCTIONS = ["mm", "mm_ab", "bf16", "decode", "odd", "f32", "linear", "biased"]


def test_a_matmul_kernel_compiles_to_sm_90a_wgmma_code_without_a_gpu():
    kernel = compile_matmul(MatmulConfig("f16", "f16", b_transposed=True))
    assert kernel.cubin[:4] == b"\x7fELF"  # assembled here, loads without the driver's JIT
    assert ".target sm_90a" in kernel.ptx and "wgmma.mma_async" in kernel.ptx
    entry = kernel.ptx[kernel.ptx.index(".entry") : kernel.ptx.index(")")]
    # exactly what IREE passes: 3 bindings, then M, N, K (Triton's scratch pointers removed)
    assert re.findall(r"\.param \.(u64|u32)", entry) == ["u64"] * 3 + ["u32"] * 3
    assert kernel.name in entry
    assert kernel.threads == 256 and kernel.shared_bytes == 147456  # 3 stages of 128x64 + 64x256


def test_the_bias_activation_and_merge_epilogue_in_tritons_interpreter():
    """The tl.dot kernel's epilogue against torch (f32 sums, bias added, the activation, the
    merge with another [M, N] tensor, then f16), for each of `ACTIVATION_CODES` and
    `MERGE_CODES`, with M and N past whole tiles; within 2e-3 of the largest output (f16
    rounding). The interpreter runs the kernel's Python on the CPU."""
    code = """
import json, torch, triton
import torch.nn.functional as F
from myelin.kernels._triton import ACTIVATION_CODES, MERGE_CODES, _matmul_fn
g = torch.Generator().manual_seed(0)
m, n, k = 70, 48, 128
a, w = torch.randn(m, k, generator=g).half(), torch.randn(n, k, generator=g).half()
bias = torch.randn(n, generator=g).half()
other = torch.randn(m, n, generator=g).half()
apply = {"": lambda t: t, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
         "silu": F.silu, "relu": F.relu}
merge = {"": lambda t: t, "add": lambda t: t + other.float(), "mul": lambda t: t * other.float()}
errors = {}
for act, act_code in ACTIVATION_CODES.items():
    for how, merge_code in MERGE_CODES.items():
        c = torch.full((m, n), float("nan")).half()
        _matmul_fn()[(triton.cdiv(m, 64) * triton.cdiv(n, 32),)](
            a, w, bias, other if merge_code else None, c, m, n, k, BM=64, BN=32, BK=64,
            GROUP_M=8, B_T=True, BIAS=True, ACT=act_code, MERGE=merge_code)
        ref = merge[how](apply[act](a.float() @ w.float().T + bias.float())).half().float()
        errors[f"{act}+{how}"] = float((c.float() - ref).abs().max() / ref.abs().max())
print(json.dumps(errors))
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(errors) == len(ACTIVATION_CODES) * len(MERGE_CODES), errors
    assert all(e < 2e-3 for e in errors.values()), errors


@pytest.fixture(scope="module")
def kernelized(tmp_path_factory):
    imported = import_mlir(tmp_path_factory.mktemp("kernels"), GRAPH)
    return apply_kernels(imported.module_bytecode, library="triton")


def test_the_rewrite_reports_which_matmul_goes_to_which_kernel(kernelized):
    sites = {s["function"]: s for s in kernelized.sites}
    assert sites["mm"]["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"
    assert sites["mm"]["m"] is None and sites["mm"]["reason"] == "matched, with its truncf"
    assert sites["mm_ab"]["kernel"] == "plex_matmul_tma_ab_f16_f16_128x256x64_w8s3"
    assert sites["bf16"]["kernel"] == "plex_matmul_abt_bf16_f32_128x256x64_w8s3"
    assert sites["odd"]["kernel"] is None and "K % 64" in sites["odd"]["reason"]
    assert sites["f32"]["kernel"] is None and "f16 or bf16" in sites["f32"]["reason"]
    assert sites["decode"]["kernel"] == "plex_matmul_abt_f16_f16_16x32x256_w4s4"
    linear = sites["linear"]
    assert linear["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"
    assert linear["op"] == "matmul_transpose_b" and (linear["m"], linear["n"], linear["k"]) == (
        64,
        128,
        256,
    )
    assert "B^T read from the transpose's input" in linear["reason"]
    biased = sites["biased"]
    assert biased["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3_bias"
    assert biased["reason"] == "matched, with its bias"
    assert len(kernelized.kernels) == 5


def test_matched_ops_become_extern_dispatches_and_the_rest_stays_iree_codegen(kernelized):
    _, calls = flow_dispatches(kernelized.module_bytecode, FUNCTIONS)
    externs = [name for exe, name in calls if exe.startswith("extern_dispatch")]
    assert sorted(externs) == sorted(
        [
            "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3",
            "plex_matmul_tma_ab_f16_f16_128x256x64_w8s3",
            "plex_matmul_abt_bf16_f32_128x256x64_w8s3",
            "plex_matmul_abt_f16_f16_16x32x256_w4s4",
            "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3",  # linear
            "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3_bias",
        ]
    )
    # the bias add went into the kernel too: no dispatch of IREE's own
    assert not [n for exe, n in calls if n.startswith("biased_dispatch_")], calls
    # linear's weight is read in place: no dispatch materializes its transpose
    assert not [n for exe, n in calls if "linear_dispatch" in n and "transpose" in n], calls
    codegen = [name for exe, name in calls if not exe.startswith("extern_dispatch")]
    assert any("odd_dispatch" in n and "matmul" in n for n in codegen), codegen
    assert any("f32_dispatch" in n and "matmul" in n for n in codegen), codegen
    # mm's truncf went into its kernel: mm has no dispatch of IREE's own
    assert not [n for n in codegen if n.startswith("mm_dispatch_")], codegen
    # and the whole module compiles to a CUDA VM module holding the cubins
    gpu = [TargetDevice("gpu", target="cuda")]
    compiled = compile_module(
        kernelized.module_bytecode, phase="input", devices=gpu, functions=FUNCTIONS
    )
    assert set(compiled.signatures) == set(FUNCTIONS)
    assert compiled.vmfb.count(b"\x7fELF") >= 4
