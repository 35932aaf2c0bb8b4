"""A Llama-style decoder-only transformer with `prefill` and `decode` entrypoints.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with seeded random
weights (this example is about deployment, not text quality). The KV cache is explicit: `prefill`
returns it and `decode` takes it and returns the updated one, so the graph holds no state and
both entrypoints read the same weights. The cache has a fixed maximum length; `decode` writes
position `pos` with a select, which keeps every shape static.

The layers are defined once, here: examples/pipeline and the GPU benchmark's float16 decoder
build from `Block`, `prefill_layers` and `decode_layers` (each through a `llama_model.py` in its
own folder that links to this file, so this file is among the Python sources that key their
builds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 32000
    dim: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 1408
    max_len: int = 256  # KV cache length: prompt + generated tokens
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    Norm: type[nn.Module] = RMSNorm  # a subclass may compute the norm its own way

    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.attn_norm = self.Norm(c.dim, c.norm_eps)
        self.wq = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.mlp_norm = self.Norm(c.dim, c.norm_eps)
        self.w_gate = nn.Linear(c.dim, c.ffn, bias=False)
        self.w_up = nn.Linear(c.dim, c.ffn, bias=False)
        self.w_down = nn.Linear(c.ffn, c.dim, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [b, heads, s, hd]; k, v [b, kv_heads, s, hd], with rotary embeddings applied."""
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.c.heads, self.c.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, self.c.kv_heads, self.c.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, self.c.kv_heads, self.c.head_dim).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = attn.shape
        x = x + self.wo(attn.transpose(1, 2).reshape(b, s, self.c.dim))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the two halves of the head dimension (cos, sin: [s, hd/2])."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rope_frequencies(c: Config) -> torch.Tensor:
    """The inverse frequencies of the rotary embedding [hd/2] (a module's buffer)."""
    return 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))


def rope(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [s, hd/2] of the rotary angles at `positions` [s]."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def repeat_kv(c: Config, t: torch.Tensor) -> torch.Tensor:
    """The kv heads repeated for the query heads that share them (grouped-query attention)."""
    return t.repeat_interleave(c.heads // c.kv_heads, dim=1)


def prefill_layers(c: Config, blocks, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """x [b, s, dim] through `blocks` with causal attention -> (x, ks, vs), per block its cache
    [b, kv_heads, max_len, head_dim] holding positions 0..s-1 (the caller stacks them, after
    what it computes from x: the graph keeps the order the model always had)."""
    s = x.shape[1]
    ks, vs = [], []
    for block in blocks:
        q, k, v = block.qkv(x, cos, sin)
        attn = F.scaled_dot_product_attention(q, repeat_kv(c, k), repeat_kv(c, v), is_causal=True)
        x = block.finish(x, attn)
        ks.append(F.pad(k, (0, 0, 0, c.max_len - s)))
        vs.append(F.pad(v, (0, 0, 0, c.max_len - s)))
    return x, ks, vs


def decode_layers(
    c: Config,
    blocks,
    x: torch.Tensor,
    pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
):
    """x [b, 1, dim] at position pos [1] through `blocks` -> (x, ks, vs), per block its cache
    with that position written (stacked by the caller); attention reads positions 0..pos."""
    slots = torch.arange(c.max_len, device=x.device)
    write = (slots == pos)[None, None, :, None]  # [1, 1, max_len, 1]
    hidden = torch.where(slots <= pos, 0.0, float("-inf"))  # [max_len]
    ks, vs = [], []
    for i, block in enumerate(blocks):
        q, k, v = block.qkv(x, cos, sin)
        kc = torch.where(write, k, k_cache[i])
        vc = torch.where(write, v, v_cache[i])
        scores = q @ repeat_kv(c, kc).transpose(-1, -2) / math.sqrt(c.head_dim)
        attn = torch.softmax(scores + hidden, dim=-1) @ repeat_kv(c, vc)
        x = block.finish(x, attn)
        ks.append(kc)
        vs.append(vc)
    return x, ks, vs


class Llama(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(c), persistent=False)

    def prefill(self, tokens: torch.Tensor):
        """tokens [1, s] -> (logits of the last position [1, vocab], k_cache, v_cache), the
        caches [layers, 1, kv_heads, max_len, head_dim] holding positions 0..s-1."""
        x = self.embed(tokens)
        cos, sin = rope(self.inv_freq, torch.arange(tokens.shape[1], device=tokens.device))
        x, ks, vs = prefill_layers(self.c, self.blocks, x, cos, sin)
        return self.lm_head(self.norm(x[:, -1, :])), torch.stack(ks), torch.stack(vs)

    def decode(
        self, token: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ):
        """token [1, 1] at position pos [1] -> (logits [1, vocab], k_cache, v_cache) with that
        position written; attention reads positions 0..pos."""
        x = self.embed(token)
        cos, sin = rope(self.inv_freq, pos)
        x, ks, vs = decode_layers(self.c, self.blocks, x, pos, cos, sin, k_cache, v_cache)
        return self.lm_head(self.norm(x[:, -1, :])), torch.stack(ks), torch.stack(vs)


def make_model(c: Config) -> Llama:
    torch.manual_seed(c.seed)
    model = Llama(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            p.normal_(0.0, 0.02)
    return model.eval()


def entrypoints(c: Config) -> dict:
    """What PLeX exports: two entrypoints of one model, so they share its weights. The prompt
    length of `prefill` is dynamic (plex.toml); `decode` is all static."""
    model = make_model(c)
    prompt = torch.zeros((1, 8), dtype=torch.int64)
    cache_shape = (c.layers, 1, c.kv_heads, c.max_len, c.head_dim)
    k_cache, v_cache = torch.zeros(cache_shape), torch.zeros(cache_shape)
    return {
        "prefill": (model.prefill, (prompt,)),
        "decode": (model.decode, (prompt[:, :1], torch.tensor([8]), k_cache, v_cache)),
    }


def build() -> dict:
    return entrypoints(Config())


def generate(prefill, decode, prompt: list[int], steps: int) -> tuple[list[int], list]:
    """Greedy decoding with any prefill/decode pair (torch eager or a MyeLiN session): returns
    the generated ids and the logits of every step."""
    logits, k, v = prefill(np.array([prompt], dtype=np.int64))
    out, all_logits = [], [np.asarray(logits)]
    for i in range(steps):
        token = int(np.argmax(all_logits[-1][0]))
        out.append(token)
        if i == steps - 1:
            break
        pos = np.array([len(prompt) + i], dtype=np.int64)
        logits, k, v = decode(np.array([[token]], dtype=np.int64), pos, k, v)
        all_logits.append(np.asarray(logits))
    return out, all_logits


def numpy_call(fn):
    """`fn` (torch tensors in, a tuple of them out) as numpy in, numpy out, without autograd."""

    def call(*args):
        with torch.no_grad():
            out = fn(*(torch.from_numpy(np.asarray(a)) for a in args))
        return tuple(t.numpy() for t in out)

    return call


def eager(model: Llama):
    """numpy-in, numpy-out prefill and decode of the torch model, for comparisons."""
    return numpy_call(model.prefill), numpy_call(model.decode)
