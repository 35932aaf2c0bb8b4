"""The persistent TMA matmul kernels, without a GPU: compiled for sm_90a with Triton's global
scratch moved to a binding, the scratch result in the IR sized from Triton's metadata, the grid
bounded by the SM count, and the space's refusals."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

from myelin.kernels import apply_kernels, choose_matmul_config
from myelin.kernels._space import site_key, violations
from myelin.kernels._triton import MatmulConfig, compile_matmul
from myelin.platforms import CUDA_SM_COUNT, KERNELS_CUDA_ARCH
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir
from tests.myelin.test_kernels import FUNCTIONS, GRAPH

PERSISTENT = MatmulConfig("f16", "f16", b_transposed=True, persistent=True)


@pytest.fixture(scope="module")
def kernel():
    return compile_matmul(PERSISTENT)


def test_the_persistent_kernel_compiles_to_tma_and_wgmma_with_its_scratch_as_a_binding(kernel):
    assert kernel.cubin[:4] == b"\x7fELF"
    ptx = kernel.ptx
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx  # TMA loads (and the store)
    assert "tensormap" in ptx  # descriptors made on the device, in the scratch
    entry = ptx[ptx.index(".entry") : ptx.index(")")]
    # what IREE passes: A, B, C, the scratch (4 bindings), then M, N, K; nothing after them
    assert re.findall(r"\.param \.(u64|u32)", entry) == ["u64"] * 4 + ["u32"] * 3
    # Triton's per-program scratch, from its metadata (three 128 B descriptors), and the grid
    assert kernel.scratch_bytes == 384 and kernel.scratch_align == 128
    assert kernel.max_programs == CUDA_SM_COUNT[KERNELS_CUDA_ARCH] == 132
    # the kernel rounds the scratch base up to the descriptors' alignment where it loads it
    assert re.search(r"and\.b64 \t%rd\d+, %rd\d+, -128;", ptx)
    assert kernel.shared_bytes <= 232_448


def test_the_scratch_result_and_the_bounded_grid_appear_in_the_ir(tmp_path):
    imported = import_mlir(tmp_path, GRAPH)
    # mm (dynamic M, A x B^T, f16 out) takes the library's default: persistent
    kernelized = apply_kernels(imported.module_bytecode, library="triton")
    sites = {s["function"]: s for s in kernelized.sites}
    assert sites["mm"]["kernel"] == PERSISTENT.name
    # an f32 result's C tile does not fit beside the stages: not persistent
    assert sites["bf16"]["kernel"] == "plex_matmul_abt_bf16_f32_128x256x64_w8s3"
    flow, _ = flow_dispatches(kernelized.module_bytecode, FUNCTIONS)
    line = next(ln for ln in flow.splitlines() if f"@{PERSISTENT.name}[" in ln)
    # two results: C and the unread scratch, 132 programs x 384 B + 128 B to align its base
    assert f"tensor<{132 * 384 + 128}xi8>" in line, line
    assert "tensor<?x128xf16>" in line
    # the workgroup count is min(tiles, SM count)
    assert "affine_map<()[s0, s1] -> ((s0 ceildiv 128) * (s1 ceildiv 256), 132)>" in flow


def test_a_tuned_persistent_config_reaches_an_a_x_b_site(tmp_path):
    imported = import_mlir(tmp_path, GRAPH)
    config = MatmulConfig("f16", "f16", False, 64, 128, 64, 8, 4, 3, persistent=True)
    tuned = {site_key("matmul", "f16", "f16", 64, 128, 256): config}
    kernelized = apply_kernels(imported.module_bytecode, library="triton", tuned=tuned)
    sites = {s["function"]: s for s in kernelized.sites}
    assert sites["mm_ab"]["kernel"] == "plex_matmul_tma_ab_f16_f16_64x128x64_w4s3"
    assert "tuned config" in sites["mm_ab"]["reason"]


def test_the_space_refuses_what_a_persistent_kernel_cannot_do():
    # the TMA store's C tile beside 3 stages: f16 out fits, f32 out does not
    assert not violations(PERSISTENT, 2048, 4096, 4096)
    f32 = MatmulConfig("f16", "f32", True, persistent=True)
    assert any("shared memory" in w for w in violations(f32, 2048, 4096, 4096))
    # 4 stages at 128x256x64 plus the C tile: over the 227 KiB of a block
    four = MatmulConfig("f16", "f16", True, num_stages=4, persistent=True)
    assert any("shared memory" in w for w in violations(four, 2048, 4096, 4096))
    # decode M: too few tiles to loop over
    skinny = MatmulConfig("f16", "f16", True, 16, 32, 256, 1, 4, 4, persistent=True)
    assert any("persistent with M = 8" in w for w in violations(skinny, 8, 4096, 4096))
    # the library's own choices
    assert choose_matmul_config("f16", "f16", True, 2048, 4096, 4096).persistent
    assert not choose_matmul_config("f16", "f32", True, 2048, 4096, 4096).persistent
    assert not choose_matmul_config("f16", "f16", True, 8, 4096, 4096).persistent


def test_the_full_epilogue_compiles_with_the_bias_and_merge_tensor_as_bindings():
    """A persistent kernel with a bias, an activation and a merge (Llama's `silu(gate) * up`
    with a bias, the most the epilogue does): exactly the bindings its wrapper passes, A, B,
    bias, the other tensor, C and the scratch, then M, N, K."""
    full = MatmulConfig(
        "f16", "f16", b_transposed=True, persistent=True, bias=True, activation="silu", merge="mul"
    )
    kernel = compile_matmul(full)
    assert kernel.name.endswith("_bias_silu_mul")
    entry = kernel.ptx[kernel.ptx.index(".entry") : kernel.ptx.index(")")]
    assert re.findall(r"\.param \.(u64|u32)", entry) == ["u64"] * 6 + ["u32"] * 3
