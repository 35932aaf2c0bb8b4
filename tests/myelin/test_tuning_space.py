"""The tuning spaces reject, before any compile, the configs IREE 3.13 accepts silently and
compiles into slow or wrong code; specs are rendered in the format it applies."""

from __future__ import annotations

from myelin.tuning.cpu import CpuTarget, CpuTiles, configured_contractions
from myelin.tuning.cuda import MmaTiles, gemv_space, mma_space
from myelin.tuning.spec import ContractionMatch, SpecEntry, instrument_spec, render_spec

MAPS = (
    "affine_map<(d0, d1, d2) -> (d0, d2)>",
    "affine_map<(d0, d1, d2) -> (d2, d1)>",
    "affine_map<(d0, d1, d2) -> (d0, d1)>",
)
DYNAMIC_M = ContractionMatch("f32", "f32", "f32", MAPS, (), (None,), (384,), (384,))
AVX2 = CpuTarget(native_vector_bytes=32)  # 8 f32 lanes, 16 ymm registers
AVX512 = CpuTarget(native_vector_bytes=64)


def test_cpu_constraints_name_what_iree_would_compile_badly():
    good = CpuTiles(dm=96, dn=128, vm=6, vn=16, vk=4, peel=True)  # 12 + 2 + 1 ymm registers
    assert good.violations(DYNAMIC_M, AVX2) == []
    assert any(
        "peeling" in w for w in CpuTiles(128, 128, 8, 16, 4, False).violations(DYNAMIC_M, AVX2)
    )
    assert any(
        "SIMD width" in w for w in CpuTiles(128, 96, 8, 12, 4, True).violations(DYNAMIC_M, AVX2)
    )
    # 16x32 on AVX-512 needs 16*2 + 2 + 1 zmm registers: it spills (seen in the hot loop's asm)
    assert any(
        "spill" in w for w in CpuTiles(128, 128, 16, 32, 4, True).violations(DYNAMIC_M, AVX512)
    )
    assert CpuTiles(128, 128, 8, 32, 4, True).violations(DYNAMIC_M, AVX512) == []


def test_cpu_config_and_spec_format():
    info = CpuTiles(64, 32, 4, 16, 2, True).compilation_info(DYNAMIC_M)
    assert (
        "distribution = [64, 32, 0], vector_common_parallel = [4, 16, 0], vector_reduction = [0, 0, 2]"
        in info
    )
    assert "{enable_loop_peeling}" in info
    spec = render_spec([SpecEntry("mm", DYNAMIC_M, info)])
    assert spec.count("transform.foreach_match") == 1  # two would fail IREE's verifier
    assert "dims_equal %m" not in spec  # a dynamic size never equals a number
    assert "dims_equal %n, [384]" in spec and "dims_equal %k, [384]" in spec
    marked, sites = instrument_spec(spec)
    assert sites == 1 and 'transform.annotate %op "plex.tuned"' in marked


def test_contractions_are_read_from_configured_ir_with_aliases():
    ir_text = """
#config1 = #iree_cpu.lowering_config<distribution = [64, 32, 0], vector_common_parallel = [8, 8, 0], vector_reduction = [0, 0, 8]>
hal.executable.variant public @x target(<"llvm-cpu", "embedded-elf-x86_64", {cpu = "znver3", native_vector_size = 32 : i64}>) {
      func.func @hidden_dispatch_0_matmul_Dx32x16_f32() {
          %18 = linalg.matmul {lowering_config = #config1} ins(%13, %14 : tensor<?x16xf32>, tensor<16x32xf32>) outs(%17 : tensor<?x32xf32>) -> tensor<?x32xf32>
      }
}
"""
    [c] = configured_contractions(ir_text)
    assert c.dispatch == "hidden_dispatch_0_matmul_Dx32x16_f32"
    assert (c.match.m, c.match.n, c.match.k) == ((None,), (32,), (16,))
    assert "distribution = [64, 32, 0]" in c.default_config


def test_cuda_matmul_space_keeps_only_consistent_configs():
    space = mma_space(8192, 8192, 8192)
    assert MmaTiles(128, 64, 4, 4, 2) in space  # IREE's default for 8192^3 f16
    assert all(1 <= t.warps <= 8 for t in space)
    assert all(2 * (t.wm + t.wn) * 16 * t.r <= 166912 for t in space)
    assert "workgroup_size = [128, 1, 1]" in MmaTiles(128, 64, 4, 4, 2).compilation_info()
    assert MmaTiles(512, 512, 1, 1, 2).violations(8192, 8192, 8192)  # legal to IREE, absurd
    assert gemv_space("nk", 28672, 8192) and gemv_space("kn", 28672, 8192)
