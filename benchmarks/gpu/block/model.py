"""A Llama-7B-shaped transformer block (dim 4096, 32 heads of 128, ffn 11008, RMSNorm, rotary
embeddings, SwiGLU) in float16, with every weight an argument: the H200 benchmark passes the
weights in as GPU tensors, so nothing large travels and PLeX and torch eager read the same memory.

Two functions, each compiled by PLeX (plex.toml beside this file) and run by torch eager as they
are:
- `prefill(x[T, 4096], cos, sin, *weights)`: T = 2048 tokens of one sequence, causal attention
  (`scaled_dot_product_attention`); returns the block's output and the sequence's K and V.
- `decode(x[8, 4096], cos, sin, k_cache, v_cache, *weights)`: one new token for each of 8
  sequences, attending over a full 2048-token cache [8, 32, 2048, 128] plus itself
  (`scaled_dot_product_attention` over `cat(cache, new)`); returns the output and the new
  token's K and V (the caller writes them into its cache).
Activations are 2-D ([tokens, dim]) so every projection is one `x @ W^T` matmul.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DIM, HEADS, HEAD_DIM, FFN = 4096, 32, 128, 11008
PREFILL_TOKENS, DECODE_BATCH, CACHE = 2048, 8, 2048
EPS = 1e-5
# Weight arguments in order, with their shapes (nn.Linear's [out, in]).
WEIGHTS = {
    "attn_norm": (DIM,),
    "wq": (DIM, DIM),
    "wk": (DIM, DIM),
    "wv": (DIM, DIM),
    "wo": (DIM, DIM),
    "mlp_norm": (DIM,),
    "w_gate": (FFN, DIM),
    "w_up": (FFN, DIM),
    "w_down": (DIM, FFN),
}


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # The mean of squares in float32: float16 overflows at |x| > 256.
    ms = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(ms + EPS)).to(x.dtype) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, 128], cos/sin [tokens, 1, 64]: rotary embeddings (rotate-half form)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _qkv(x, cos, sin, attn_norm, wq, wk, wv):
    t = x.shape[0]
    h = rms_norm(x, attn_norm)
    c, s = cos[:, None, :], sin[:, None, :]
    q = rotate(F.linear(h, wq).view(t, HEADS, HEAD_DIM), c, s)
    k = rotate(F.linear(h, wk).view(t, HEADS, HEAD_DIM), c, s)
    v = F.linear(h, wv).view(t, HEADS, HEAD_DIM)
    return q, k, v


def _finish(x, attn, wo, mlp_norm, w_gate, w_up, w_down):
    x = x + F.linear(attn, wo)
    h = rms_norm(x, mlp_norm)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def prefill(x, cos, sin, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down):
    t = x.shape[0]
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)
    # [1, heads, tokens, 128]: torch's fused (flash) attention takes 4-D inputs only; with 3-D
    # ones eager torch falls back to its unfused math path.
    attn = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True
    )[0]
    y = _finish(x, attn.transpose(0, 1).reshape(t, DIM), wo, mlp_norm, w_gate, w_up, w_down)
    return y, k, v


def decode(
    x, cos, sin, k_cache, v_cache, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down
):
    """x [8, 4096]; k_cache/v_cache [8, 32, 2048, 128] (every slot valid)."""
    b = x.shape[0]
    q, k, v = _qkv(x, cos, sin, attn_norm, wq, wk, wv)  # [8, 32, 128]
    # The cache plus the new token, as a decoder appends it, then torch's fused attention (one
    # query row per sequence and head): PLeX's split-KV kernel reads the cache and the new token
    # in place (the concat is never made); torch eager makes the concatenated copy.
    keys = torch.cat((k_cache, k[:, :, None]), dim=2)  # [8, 32, 2049, 128]
    values = torch.cat((v_cache, v[:, :, None]), dim=2)
    attn = F.scaled_dot_product_attention(q[:, :, None], keys, values)[:, :, 0]  # [8, 32, 128]
    y = _finish(x, attn.reshape(b, DIM), wo, mlp_norm, w_gate, w_up, w_down)
    return y, k, v


def rope(tokens: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    ang = torch.arange(start, start + tokens).float()[:, None] * inv[None, :]
    return ang.cos().half(), ang.sin().half()


def weights(device: str = "cpu", seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in WEIGHTS.items():
        if name.endswith("norm"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            w = torch.randn(shape, generator=g) * (1.0 / math.sqrt(shape[1]))
        out.append(w.half().to(device))
    return out


def example_inputs(device: str = "cpu", seed: int = 1) -> dict[str, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    w = weights(device)
    xp = torch.randn(PREFILL_TOKENS, DIM, generator=g).half().to(device)
    xd = torch.randn(DECODE_BATCH, DIM, generator=g).half().to(device)
    kv = (DECODE_BATCH, HEADS, CACHE, HEAD_DIM)
    kc = torch.randn(kv, generator=g).half().to(device)
    vc = torch.randn(kv, generator=g).half().to(device)
    cp, sp = (t.to(device) for t in rope(PREFILL_TOKENS))
    cd, sd = (t.to(device) for t in rope(DECODE_BATCH, CACHE))
    return {"prefill": (xp, cp, sp, *w), "decode": (xd, cd, sd, kc, vc, *w)}


class Block(torch.nn.Module):
    """No parameters of its own (the weights are arguments): the torch frontend exports
    methods of a module."""

    def prefill(self, *args: torch.Tensor):
        return prefill(*args)

    def decode(self, *args: torch.Tensor):
        return decode(*args)


def build() -> dict:
    """PLeX's torch frontend entry: the two functions with example inputs of the real shapes
    (zeros: only shapes and dtypes matter to the export)."""
    ex = example_inputs()
    zeros = {k: tuple(torch.zeros_like(t) for t in v) for k, v in ex.items()}
    block = Block()
    return {"prefill": (block.prefill, zeros["prefill"]), "decode": (block.decode, zeros["decode"])}
