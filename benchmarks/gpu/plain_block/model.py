"""The Llama-7B-shaped block of benchmarks/gpu/block, written as user model code is: activations
`[batch, seq, dim]` throughout (`F.linear` on 3-D tensors, as `nn.Linear` and Hugging Face's
Llama do), `scaled_dot_product_attention` on `[batch, heads, seq, head_dim]`, `torch.cat` for the
cache. Same weights (arguments, as there), same sizes: prefill 1 x 2048, decode 8 over 2048.

It checks that the kernel library reaches models as users write them (docs/kernels.md: linears
over more than two dims are exported as one 2-D matmul): `block_h200.py --model plain_block`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# block_model.py links to ../block/model.py: the same norms, rotary tables and seeded weights
from block_model import DIM, HEAD_DIM, HEADS, rms_norm, rope, weights

PREFILL_TOKENS, DECODE_BATCH, CACHE = 2048, 8, 2048


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, 128], cos/sin [seq, 64] (rotate-half form)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _heads(t: torch.Tensor) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)


def _qkv(x, cos, sin, attn_norm, wq, wk, wv):
    h = rms_norm(x, attn_norm)
    q = rotate(_heads(F.linear(h, wq)), cos, sin)
    k = rotate(_heads(F.linear(h, wk)), cos, sin)
    return q, k, _heads(F.linear(h, wv))


def _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down):
    b, _, s, _ = attn.shape
    x = x + F.linear(attn.transpose(1, 2).reshape(b, s, DIM), wo)
    h = rms_norm(x, mlp_norm)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def prefill(x, cos, sin, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down):
    """x [1, 2048, 4096] -> (y, k, v), k/v [1, 32, 2048, 128]."""
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down), k, v


def decode(
    x, cos, sin, k_cache, v_cache, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down
):
    """x [8, 1, 4096]; k_cache/v_cache [8, 32, 2048, 128] -> (y, k, v) of the new token."""
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)  # [8, 32, 1, 128]
    keys = torch.cat((k_cache, k), dim=2)
    values = torch.cat((v_cache, v), dim=2)
    attn = F.scaled_dot_product_attention(q, keys, values)
    return _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down), k, v


def example_inputs(device: str = "cpu", seed: int = 1) -> dict[str, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    w = weights(device)
    xp = torch.randn(1, PREFILL_TOKENS, DIM, generator=g).half().to(device)
    xd = torch.randn(DECODE_BATCH, 1, DIM, generator=g).half().to(device)
    kv = (DECODE_BATCH, HEADS, CACHE, HEAD_DIM)
    kc = torch.randn(kv, generator=g).half().to(device)
    vc = torch.randn(kv, generator=g).half().to(device)
    cp, sp = (t.to(device) for t in rope(PREFILL_TOKENS))
    cd, sd = (t.to(device) for t in rope(1, CACHE))
    return {"prefill": (xp, cp, sp, *w), "decode": (xd, cd, sd, kc, vc, *w)}


class Block(torch.nn.Module):
    """No parameters of its own (the weights are arguments)."""

    def prefill(self, *args: torch.Tensor):
        return prefill(*args)

    def decode(self, *args: torch.Tensor):
        return decode(*args)


def build() -> dict:
    """The torch frontend's entry: both functions with example inputs of the real shapes."""
    m = Block()
    xs = {k: tuple(torch.zeros_like(t) for t in v) for k, v in example_inputs().items()}
    return {"prefill": (m.prefill, xs["prefill"]), "decode": (m.decode, xs["decode"])}
