"""Which matmul config a shape gets (`choose_matmul_config`), and that each config compiles for
sm_90a within the shared memory a block may have (no GPU needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from myelin.kernels import choose_matmul_config
from myelin.kernels._triton import compile_matmul


@pytest.mark.parametrize(
    "m, n, k, name",
    [
        # the Llama-7B block's prefill projections (x @ W^T, 2048 tokens)
        (2048, 4096, 4096, "plex_matmul_abt_f16_f16_256x128x64_w8s4"),
        (2048, 11008, 4096, "plex_matmul_abt_f16_f16_256x128x64_w8s4"),
        (2048, 4096, 11008, "plex_matmul_abt_f16_f16_256x128x64_w8s4"),
        # a dynamic M (the 8192^3 benchmark's graph) and a small static M keep the default
        (None, 8192, 8192, "plex_matmul_abt_f16_f16_128x256x64_w8s3"),
        (512, 4096, 4096, "plex_matmul_abt_f16_f16_128x256x64_w8s3"),
        # decode: one token per sequence
        (8, 4096, 4096, "plex_matmul_abt_f16_f16_16x32x256_w4s4"),
    ],
)
def test_each_shape_gets_its_config(m, n, k, name):
    assert choose_matmul_config("f16", "f16", True, m, n, k).name == name


def test_an_a_x_b_prefill_matmul_keeps_the_default_config():
    config = choose_matmul_config("f16", "f16", False, 2048, 4096, 4096)
    assert config.name == "plex_matmul_ab_f16_f16_128x256x64_w8s3"


def test_the_prefill_config_compiles_to_sm_90a_and_fits_shared_memory():
    kernel = compile_matmul(choose_matmul_config("f16", "f16", True, 2048, 4096, 4096))
    assert "wgmma.mma_async" in kernel.ptx and kernel.threads == 256
    assert kernel.shared_bytes <= 227 * 1024  # the H200's per-block opt-in limit
