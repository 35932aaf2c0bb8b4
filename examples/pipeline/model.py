"""A small Llama-style decoder cut into two pipeline stages, one graph each, so that an app can
place the first half of its layers on one device and the second half on another.

`front` holds the token embedding and layers [0, split); `back` holds layers [split, layers),
the final norm and the output head. Both stages take an explicit KV cache of their own layers
(returned by prefill, taken and returned by decode), so each cache stays on its stage's device
and only the hidden states cross between the stages: [1, prompt, dim] once per prefill,
[1, 1, dim] per decoded token. The architecture is examples/llama's (RMSNorm, rotary positions,
grouped-query attention, SwiGLU) at a test-sized config with seeded random weights: its layers
come from `llama_model.py`, a link to examples/llama/model.py (inside this package's folder, so
that file is one of the sources that key this package's build).
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_model
import numpy as np
import torch
from llama_model import Block, RMSNorm, decode_layers, numpy_call, prefill_layers, rope
from torch import nn


@dataclass(frozen=True)
class Config(llama_model.Config):
    vocab: int = 256
    dim: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 160
    max_len: int = 64  # KV cache length: prompt + generated tokens

    @property
    def split(self) -> int:
        """The first layer of the back stage."""
        return self.layers // 2


class Layers(nn.Module):
    """A run of decoder layers with prefill and decode over their own KV cache."""

    def __init__(self, c: Config, blocks: list[Block]) -> None:
        super().__init__()
        self.c = c
        self.blocks = nn.ModuleList(blocks)
        self.register_buffer("inv_freq", llama_model.rope_frequencies(c), persistent=False)

    def prefill(self, x: torch.Tensor):
        """x [1, s, dim] -> (x after these layers, k_cache, v_cache [n, 1, kv_heads, max_len,
        head_dim] holding positions 0..s-1)."""
        cos, sin = rope(self.inv_freq, torch.arange(x.shape[1], device=x.device))
        x, ks, vs = prefill_layers(self.c, self.blocks, x, cos, sin)
        return x, torch.stack(ks), torch.stack(vs)

    def decode(self, x: torch.Tensor, pos: torch.Tensor, k_cache, v_cache):
        """x [1, 1, dim] at position pos [1] -> (x after these layers, caches with pos written)."""
        cos, sin = rope(self.inv_freq, pos)
        x, ks, vs = decode_layers(self.c, self.blocks, x, pos, cos, sin, k_cache, v_cache)
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
    return tuple(numpy_call(getattr(s, f)) for s in stages for f in ("prefill", "decode"))
