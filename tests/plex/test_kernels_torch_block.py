"""A torch transformer block (the H200 benchmark's, at a small size) through `plex build` with
`kernels = "triton"`, without a GPU: every projection torch wrote as `F.linear(x, w)` goes to a
kernel that reads `w` in place (A x B^T), and what no kernel covers stays with IREE."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("triton")

from myelin.mln import MlnReader
from plex.builder import build

BLOCK_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F

    DIM, HEADS, HEAD_DIM, FFN, T, B, CACHE = 256, 4, 64, 512, 64, 8, 64


    def rms(x, w):
        ms = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(ms + 1e-5)).to(x.dtype) * w


    def ffn(x, wo, attn, norm, wg, wu, wd):
        x = x + F.linear(attn, wo)
        h = rms(x, norm)
        return x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)


    class Block(torch.nn.Module):
        def prefill(self, x, n1, wq, wk, wv, wo, n2, wg, wu, wd):
            h = rms(x, n1)
            q, k, v = (F.linear(h, w).view(T, HEADS, HEAD_DIM).transpose(0, 1)[None]
                       for w in (wq, wk, wv))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)[0]
            return ffn(x, wo, a.transpose(0, 1).reshape(T, DIM), n2, wg, wu, wd)

        def decode(self, x, kc, vc, n1, wq, wk, wv, wo, n2, wg, wu, wd):
            h = rms(x, n1)
            q = F.linear(h, wq).view(B, HEADS, 1, HEAD_DIM)
            k = F.linear(h, wk).view(B, HEADS, 1, HEAD_DIM)
            v = F.linear(h, wv).view(B, HEADS, 1, HEAD_DIM)
            s = torch.softmax((q @ torch.cat((kc, k), 2).transpose(-1, -2)).float(), -1)
            a = (s.to(x.dtype) @ torch.cat((vc, v), 2)).reshape(B, DIM)
            return ffn(x, wo, a, n2, wg, wu, wd)


    def build():
        z = lambda *s: torch.zeros(*s, dtype=torch.float16)
        w = (z(DIM), z(DIM, DIM), z(DIM, DIM), z(DIM, DIM), z(DIM, DIM), z(DIM),
             z(FFN, DIM), z(FFN, DIM), z(DIM, FFN))
        cache = z(B, HEADS, CACHE, HEAD_DIM)
        m = Block()
        return {"prefill": (m.prefill, (z(T, DIM), *w)),
                "decode": (m.decode, (z(B, DIM), cache, cache.clone(), *w))}
    """
)
PACKAGE = """
[package]
name = "blk"

[graph.blk]
source = "block.py:build"
frontend = "torch"
entrypoints = ["prefill", "decode"]
"""
APP = """
[app]
name = "blk"
packages = ["."]

[devices.hopper]
target = "cuda"
kernels = "triton"

[[variant]]
name = "hopper"
devices = ["hopper"]
"""


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("torch_block")
    (root / "block.py").write_text(BLOCK_PY)
    (root / "plex.toml").write_text(PACKAGE)
    (root / "app.toml").write_text(APP)
    out = build(Path(root / "app.toml"), root / "blk.mln").output
    with MlnReader(out) as r:
        (device,) = r.manifest["variants"][0]["devices"]
        return list(device["kernels"])


def test_every_projection_reads_its_weight_in_place_on_a_kernel(sites):
    by_function: dict[str, list[dict]] = {}
    for s in sites:
        if s["op"].startswith("matmul"):
            by_function.setdefault(s["function"], []).append(s)
    assert sorted(by_function) == ["decode", "prefill"]
    for function, mms in by_function.items():
        # q, k, v, o, gate, up, down (the attention's contractions are listed apart)
        assert len(mms) == 7, (function, mms)
        for s in mms:
            assert s["op"] == "matmul_transpose_b", s
            assert "B^T read from the transpose's input" in s["reason"], s
    shapes = sorted((s["n"], s["k"]) for s in by_function["prefill"])
    assert shapes == [(256, 256)] * 4 + [(256, 512)] + [(512, 256)] * 2
    # decode: the o and down projections add the residual, the gate applies SiLU and multiplies
    # by up; prefill's 128x256 tiles with the other tensor's tile would exceed a block's shared
    # memory, so there the gate applies SiLU and the merges stay IREE's
    plain = "plex_matmul_abt_f16_f16_16x32x256_w4s4"
    kernels = sorted(s["kernel"] for s in by_function["decode"])
    assert kernels == sorted([plain] * 4 + [f"{plain}_add"] * 2 + [f"{plain}_silu_mul"])
    plain = "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"
    kernels = sorted(s["kernel"] for s in by_function["prefill"])
    assert kernels == sorted([plain] * 6 + [f"{plain}_silu"])
    left = [s for s in by_function["prefill"] if "shared memory with it" in s["reason"]]
    assert len(left) == 3, [s["reason"] for s in by_function["prefill"]]
