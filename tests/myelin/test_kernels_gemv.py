"""The CUDA-core GEMV kernel (block_m = 1), without a GPU: compiled for sm_90a with no tl.dot
(no wgmma or mma), wide vector loads of the weight, exactly IREE's parameters, and one program
per column block of the site's (M, N) where a tuning entry names it for an M = 1 site."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

from myelin.kernels import apply_kernels
from myelin.kernels._space import site_key, violations
from myelin.kernels._triton import MatmulConfig, compile_matmul
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir

# the tuned entry of benchmarks/gpu/tunekern_tuned, in both layouts
GEMV = {bt: MatmulConfig("f16", "f16", bt, 1, 128, 128, 1, 4, 2) for bt in (True, False)}
GRAPH = """
func.func @gemv(%x: tensor<1x256xf16>, %w: tensor<512x256xf16>) -> tensor<1x512xf16> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x512xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x512xf32>) -> tensor<1x512xf32>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>,
      affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]
      ins(%x, %w : tensor<1x256xf16>, tensor<512x256xf16>)
      outs(%f : tensor<1x512xf32>) -> tensor<1x512xf32>
  %e2 = tensor.empty() : tensor<1x512xf16>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
      affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%r : tensor<1x512xf32>) outs(%e2 : tensor<1x512xf16>) {
  ^bb0(%a: f32, %b: f16):
    %q = arith.truncf %a : f32 to f16
    linalg.yield %q : f16
  } -> tensor<1x512xf16>
  return %t : tensor<1x512xf16>
}
"""


@pytest.mark.parametrize("b_transposed", [True, False])
def test_the_gemv_kernel_compiles_to_cuda_core_code_with_wide_loads(b_transposed):
    config = GEMV[b_transposed]
    assert not violations(config, 1, 28672, 8192)
    kernel = compile_matmul(config)
    assert kernel.cubin[:4] == b"\x7fELF" and kernel.name == config.name
    ptx = kernel.ptx
    assert ".target sm_90a" in ptx
    assert "wgmma" not in ptx and "mma.sync" not in ptx  # no tensor cores: FMAs
    assert "fma.rn.f32" in ptx and "ld.global.v4" in ptx  # 16-byte loads of the weight
    entry = ptx[ptx.index(".entry") : ptx.index(")")]
    # what IREE passes: A, B, C, then M, N, K; no scratch
    assert re.findall(r"\.param \.(u64|u32)", entry) == ["u64"] * 3 + ["u32"] * 3
    assert kernel.scratch_bytes == 0 and kernel.max_programs == 0
    assert kernel.threads == 128


def test_a_tuned_gemv_config_reaches_an_m_1_site_one_program_per_column_block(tmp_path):
    imported = import_mlir(tmp_path, GRAPH)
    config = MatmulConfig("f16", "f16", True, 1, 128, 128, 1, 4, 2)
    tuned = {site_key("matmul_transpose_b", "f16", "f16", 1, 512, 256): config}
    kernelized = apply_kernels(imported.module_bytecode, library="triton", tuned=tuned)
    (site,) = kernelized.sites
    assert site["kernel"] == "plex_matmul_abt_f16_f16_1x128x128_w4s2"
    assert "tuned config" in site["reason"]
    flow, dispatches = flow_dispatches(kernelized.module_bytecode, ["gemv"])
    assert [entry for _, entry in dispatches] == [config.name]
    # the workload is (M, N) = (1, 512): (M ceildiv 1) * (N ceildiv 128) = 4 programs
    line = next(ln for ln in flow.splitlines() if f"@{config.name}[" in ln)
    assert f"@{config.name}[%c1, %c512]" in line, line
