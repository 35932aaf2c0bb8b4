"""Which matmul config a shape gets (`choose_matmul_config`; no GPU needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from myelin.kernels import choose_matmul_config


@pytest.mark.parametrize(
    "m, n, k, name",
    [
        # the Llama-7B block's prefill projections (x @ W^T, 2048 tokens): persistent TMA
        # kernels, 128-column tiles at N = 11008 (each fastest there on the H200)
        (2048, 4096, 4096, "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"),
        (2048, 11008, 4096, "plex_matmul_tma_abt_f16_f16_128x128x64_w4s4"),
        (2048, 4096, 11008, "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"),
        # small output grids (a static M): the tile with the least estimated time over 132 SMs;
        # BERT-base at 8 x 512 keeps the default (96 tiles, one wave), ViT-B/16 at batch 8
        # (1576 rows) takes 128x128 (78 tiles against 39), ResNet-50 at batch 8 narrower ones;
        # a small matmul (M x N x K < 2^28) keeps the default
        (4096, 768, 768, "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"),
        (1576, 768, 768, "plex_matmul_tma_abt_f16_f16_128x128x64_w4s4"),
        (25088, 64, 576, "plex_matmul_tma_abt_f16_f16_128x64x64_w4s4"),
        (25088, 64, 64, "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"),
        (392, 512, 4608, "plex_matmul_tma_abt_f16_f16_64x64x64_w4s4"),
        # a dynamic M (the 8192^3 benchmark's graph)
        (None, 8192, 8192, "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"),
        # decode: one token per sequence
        (8, 4096, 4096, "plex_matmul_abt_f16_f16_16x32x256_w4s4"),
        (1, 4096, 4096, "plex_matmul_abt_f16_f16_16x32x256_w4s4"),
        # the one GEMV shape measured: the CUDA-core kernel (faster than cuBLAS's there)
        (1, 28672, 8192, "plex_matmul_abt_f16_f16_1x128x128_w4s2"),
    ],
)
def test_each_shape_gets_its_config(m, n, k, name):
    assert choose_matmul_config("f16", "f16", True, m, n, k).name == name
