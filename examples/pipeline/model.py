"""A small Llama-style decoder cut into two pipeline stages, one graph each, so that an app can
place the first half of its layers on one device and the second half on another.

`front` holds the token embedding and layers [0, split); `back` holds layers [split, layers),
the final norm and the output head. Both stages take an explicit KV cache of their own layers
(returned by prefill, taken and returned by decode), so each cache stays on its stage's device
and only the hidden states cross between the stages: [1, prompt, dim] once per prefill,
[1, 1, dim] per decoded token. The architecture is examples/llama's (RMSNorm, rotary positions,
grouped-query attention, SwiGLU) at a test-sized config with seeded random weights.
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
    vocab: int = 256
    dim: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 160
    max_len: int = 64  # KV cache length: prompt + generated tokens
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def split(self) -> int:
        """The first layer of the back stage."""
        return self.layers // 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.wq = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.mlp_norm = RMSNorm(c.dim, c.norm_eps)
        self.w_gate = nn.Linear(c.dim, c.ffn, bias=False)
        self.w_up = nn.Linear(c.dim, c.ffn, bias=False)
        self.w_down = nn.Linear(c.ffn, c.dim, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
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


class Layers(nn.Module):
    """A run of decoder layers with prefill and decode over their own KV cache."""

    def __init__(self, c: Config, blocks: list[Block]) -> None:
        super().__init__()
        self.c = c
        self.blocks = nn.ModuleList(blocks)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos(), angles.sin()

    def repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.c.heads // self.c.kv_heads, dim=1)

    def prefill(self, x: torch.Tensor):
        """x [1, s, dim] -> (x after these layers, k_cache, v_cache [n, 1, kv_heads, max_len,
        head_dim] holding positions 0..s-1)."""
        s = x.shape[1]
        cos, sin = self.rope(torch.arange(s, device=x.device))
        ks, vs = [], []
        for block in self.blocks:
            q, k, v = block.qkv(x, cos, sin)
            attn = F.scaled_dot_product_attention(
                q, self.repeat_kv(k), self.repeat_kv(v), is_causal=True
            )
            x = block.finish(x, attn)
            ks.append(F.pad(k, (0, 0, 0, self.c.max_len - s)))
            vs.append(F.pad(v, (0, 0, 0, self.c.max_len - s)))
        return x, torch.stack(ks), torch.stack(vs)

    def decode(self, x: torch.Tensor, pos: torch.Tensor, k_cache, v_cache):
        """x [1, 1, dim] at position pos [1] -> (x after these layers, caches with pos written)."""
        cos, sin = self.rope(pos)
        slots = torch.arange(self.c.max_len, device=x.device)
        write = (slots == pos)[None, None, :, None]
        hidden = torch.where(slots <= pos, 0.0, float("-inf"))
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            q, k, v = block.qkv(x, cos, sin)
            kc = torch.where(write, k, k_cache[i])
            vc = torch.where(write, v, v_cache[i])
            scores = q @ self.repeat_kv(kc).transpose(-1, -2) / math.sqrt(self.c.head_dim)
            attn = torch.softmax(scores + hidden, dim=-1) @ self.repeat_kv(vc)
            x = block.finish(x, attn)
            ks.append(kc)
            vs.append(vc)
        return x, torch.stack(ks), torch.stack(vs)


class Front(nn.Module):
    """Stage 1: tokens -> hidden states after layers [0, split)."""

    def __init__(self, embed: nn.Embedding, layers: Layers) -> None:
        super().__init__()
        self.embed, self.layers = embed, layers

    def prefill(self, tokens: torch.Tensor):
        return self.layers.prefill(self.embed(tokens))

    def decode(self, token: torch.Tensor, pos: torch.Tensor, k_cache, v_cache):
        return self.layers.decode(self.embed(token), pos, k_cache, v_cache)


class Back(nn.Module):
    """Stage 2: hidden states -> logits of the last position, through layers [split, layers)."""

    def __init__(self, layers: Layers, norm: RMSNorm, lm_head: nn.Linear) -> None:
        super().__init__()
        self.layers, self.norm, self.lm_head = layers, norm, lm_head

    def prefill(self, hidden: torch.Tensor):
        x, k, v = self.layers.prefill(hidden)
        return self.lm_head(self.norm(x[:, -1, :])), k, v

    def decode(self, hidden: torch.Tensor, pos: torch.Tensor, k_cache, v_cache):
        x, k, v = self.layers.decode(hidden, pos, k_cache, v_cache)
        return self.lm_head(self.norm(x[:, -1, :])), k, v


def make_stages(c: Config) -> tuple[Front, Back]:
    """Both stages of one seeded model (every stage build draws the same weights)."""
    torch.manual_seed(c.seed)
    embed = nn.Embedding(c.vocab, c.dim)
    blocks = [Block(c) for _ in range(c.layers)]
    norm = RMSNorm(c.dim, c.norm_eps)
    lm_head = nn.Linear(c.dim, c.vocab, bias=False)
    with torch.no_grad():
        for module in (embed, *blocks, lm_head):
            for name, p in module.named_parameters():
                if not name.endswith("norm.weight"):
                    p.normal_(0.0, 0.02)
    front = Front(embed, Layers(c, blocks[: c.split]))
    back = Back(Layers(c, blocks[c.split :]), norm, lm_head)
    return front.eval(), back.eval()


def _cache(c: Config, layers: int) -> torch.Tensor:
    return torch.zeros((layers, 1, c.kv_heads, c.max_len, c.head_dim))


def front(c: Config = Config()) -> dict:
    stage, _ = make_stages(c)
    prompt = torch.zeros((1, 8), dtype=torch.int64)
    cache = _cache(c, c.split)
    return {
        "prefill": (stage.prefill, (prompt,)),
        "decode": (stage.decode, (prompt[:, :1], torch.tensor([8]), cache, cache)),
    }


def back(c: Config = Config()) -> dict:
    _, stage = make_stages(c)
    hidden = torch.zeros((1, 8, c.dim))
    cache = _cache(c, c.layers - c.split)
    return {
        "prefill": (stage.prefill, (hidden,)),
        "decode": (stage.decode, (hidden[:, :1], torch.tensor([8]), cache, cache)),
    }


def generate(front_prefill, front_decode, back_prefill, back_decode, prompt, steps):
    """Greedy decoding through the two stages (torch eager or MyeLiN entrypoints; with MyeLiN,
    pass `output="device"` callables so caches and hidden states stay on their devices). Returns
    the generated ids and the logits of every step, as numpy."""
    hidden, k0, v0 = front_prefill(np.array([prompt], dtype=np.int64))
    logits, k1, v1 = back_prefill(hidden)
    out, all_logits = [], [_numpy(logits)]
    for i in range(steps):
        token = int(np.argmax(all_logits[-1][0]))
        out.append(token)
        if i == steps - 1:
            break
        pos = np.array([len(prompt) + i], dtype=np.int64)
        hidden, k0, v0 = front_decode(np.array([[token]], dtype=np.int64), pos, k0, v0)
        logits, k1, v1 = back_decode(hidden, pos, k1, v1)
        all_logits.append(_numpy(logits))
    return out, all_logits


def _numpy(value) -> np.ndarray:
    return value.to_host() if hasattr(value, "to_host") else np.asarray(value)


def eager(c: Config = Config()):
    """numpy-in, numpy-out (front_prefill, front_decode, back_prefill, back_decode) in torch."""
    stages = make_stages(c)

    def run(fn):
        def call(*args):
            with torch.no_grad():
                out = fn(*(torch.from_numpy(np.asarray(a)) for a in args))
            return tuple(t.numpy() for t in out)

        return call

    return tuple(run(getattr(s, f)) for s in stages for f in ("prefill", "decode"))
