"""A Llama-7B-shaped transformer block (RMSNorm, rotary embeddings, SDPA, SwiGLU) in float16,
written as user model code is: activations `[batch, seq, dim]` throughout (`F.linear` on 3-D
tensors, as `nn.Linear` and Hugging Face's Llama do), `scaled_dot_product_attention` on
`[batch, heads, seq, head_dim]`, `torch.cat` to append to the cache.

It checks that the kernel library reaches models as users write them (docs/kernels.md: linears
over more than two dims are exported as one 2-D matmul). Every weight is an argument, so PLeX
and torch eager read the same GPU memory and nothing large travels to the GPU machine. The GPU
suite's `plain-block-*` cases (benchmarks/gpu_sources.py) build and time `Step("prefill")`
(1 x 2048 tokens) and `Step("decode")` (8 sequences over a 2048-token cache); `Shape` shrinks it
for the CPU check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-5


@dataclass(frozen=True)
class Shape:
    dim: int = 4096
    heads: int = 32
    ffn: int = 11008
    tokens: int = 2048  # prefill: one sequence of this many tokens
    batch: int = 8  # decode: this many sequences, one new token each
    cache: int = 2048  # decode: the tokens already in each sequence's cache

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def weights(self) -> dict[str, tuple[int, ...]]:
        """Weight arguments in order, nn.Linear's [out, in]."""
        d, f = self.dim, self.ffn
        return {
            "attn_norm": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d),
            "mlp_norm": (d,), "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f),
        }  # fmt: skip


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # the mean of squares in float32: float16 overflows at |x| > 256
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(ms + EPS)).to(x.dtype) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim], cos/sin [seq, head_dim / 2] (rotate-half form)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, d = t.shape
    return t.view(b, s, heads, d // heads).transpose(1, 2)


def _qkv(x, cos, sin, attn_norm, wq, wk, wv):
    heads = x.shape[-1] // (2 * cos.shape[-1])
    h = rms_norm(x, attn_norm)
    q = rotate(_heads(F.linear(h, wq), heads), cos, sin)
    k = rotate(_heads(F.linear(h, wk), heads), cos, sin)
    return q, k, _heads(F.linear(h, wv), heads)


def _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down):
    b, _, s, _ = attn.shape
    x = x + F.linear(attn.transpose(1, 2).reshape(b, s, x.shape[-1]), wo)
    h = rms_norm(x, mlp_norm)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def prefill(x, cos, sin, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down):
    """x [1, tokens, dim] -> (y, k, v), k/v [1, heads, tokens, head_dim]."""
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down), k, v


def decode(
    x, cos, sin, k_cache, v_cache, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down
):
    """x [batch, 1, dim]; k_cache/v_cache [batch, heads, cache, head_dim] -> (y, k, v) of the
    new token (the caller writes them into its cache)."""
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)
    keys = torch.cat((k_cache, k), dim=2)
    values = torch.cat((v_cache, v), dim=2)
    attn = F.scaled_dot_product_attention(q, keys, values)
    return _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down), k, v


class Step(torch.nn.Module):
    """`prefill` or `decode` as `forward` (no parameters of its own: the weights are arguments)."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = {"prefill": prefill, "decode": decode}[step]

    def forward(self, *args: torch.Tensor):
        return self.step(*args)


def rope(tokens: int, start: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    ang = np.arange(start, start + tokens, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float16), np.sin(ang).astype(np.float16)


def example_inputs(step: str, shape: Shape, seed: int = 1) -> tuple[np.ndarray, ...]:
    """The arguments of `step`, float16, from numpy's seeded generator (the same on any
    machine): activations and cache N(0, 1), weights scaled by 1/sqrt(fan-in), norms near 1."""
    rng = np.random.default_rng(seed)

    def normal(*dims: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    weights = [
        normal(*s, scale=0.1) + np.float16(1) if len(s) == 1 else normal(*s, scale=s[1] ** -0.5)
        for s in shape.weights().values()
    ]
    if step == "prefill":
        x = normal(1, shape.tokens, shape.dim)
        return (x, *rope(shape.tokens, 0, shape.head_dim), *weights)
    kv = (shape.batch, shape.heads, shape.cache, shape.head_dim)
    return (
        normal(shape.batch, 1, shape.dim),
        *rope(1, shape.cache, shape.head_dim),
        normal(*kv),
        normal(*kv),
        *weights,
    )
