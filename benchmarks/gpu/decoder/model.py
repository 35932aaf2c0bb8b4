"""The decoder the H200 benchmark runs: examples/llama's architecture (RMSNorm, rotary position
embeddings, grouped-query attention, SwiGLU MLP, explicit KV cache; `prefill` and `decode` share
the weights), written to run in float16 end to end at the benchmark's shapes.

Why not examples/llama itself: the benchmark needs batch 8 x 512-token prefill (examples/llama
exports batch 1 and a 256-slot cache) in float16 (its rotary tables and masks are float32, which
promotes half inputs), and the .mln must travel to the GPU machine through a 64 MiB limit
(examples/llama's 56M float32 parameters are 224 MB). Same layers, smaller vocabulary and depth:
16.3M parameters, 33 MB of float16 weights. The layers themselves are examples/llama's
(`llama_model.py` here links to examples/llama/model.py, so that file keys this package's build);
what is this module's own is the float16 arithmetic: the norm, the rotary tables, the decode mask.

Used three ways: PLeX builds it (plex.toml beside this file, `model.py:build`),
torch eager runs the same module on CUDA, and the benchmark loads the weights PLeX stored in the
.mln into the torch module so both compute with identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_model
import torch
import torch.nn.functional as F
from llama_model import prefill_layers, repeat_kv
from torch import nn


@dataclass(frozen=True)
class Config(llama_model.Config):
    vocab: int = 4096
    layers: int = 4
    batch: int = 8
    prompt: int = 512
    max_len: int = 576  # KV cache slots: the prompt plus 64 generated tokens
    dtype: torch.dtype = torch.float16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in float32: float16 overflows at |x| > 256 (x^2 > 65504).
        ms = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(ms + self.eps)).to(x.dtype) * self.weight


class Block(llama_model.Block):
    Norm = RMSNorm


class Decoder(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        self.register_buffer("inv_freq", llama_model.rope_frequencies(c), persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos().to(self.c.dtype), angles.sin().to(self.c.dtype)

    def prefill(self, tokens: torch.Tensor):
        """tokens [b, s] -> (logits of the last position [b, vocab], k_cache, v_cache); the
        caches [layers, b, kv_heads, max_len, head_dim] hold positions 0..s-1."""
        x = self.embed(tokens)
        cos, sin = self.rope(torch.arange(tokens.shape[1], device=tokens.device))
        x, ks, vs = prefill_layers(self.c, self.blocks, x, cos, sin)
        return self.lm_head(self.norm(x[:, -1, :])), torch.stack(ks), torch.stack(vs)

    def decode(
        self, token: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ):
        """token [b, 1] at position pos [1] -> (logits [b, vocab], k_cache, v_cache) with that
        position written; attention reads positions 0..pos."""
        x = self.embed(token)
        cos, sin = self.rope(pos)
        slots = torch.arange(self.c.max_len, device=token.device)
        write = (slots == pos)[None, None, :, None]
        # Additive mask over the cache's slots (0: filled, -inf: not yet), as Llama's HF code
        # passes `attn_mask` to `scaled_dot_product_attention`: softmax(q k^T / sqrt(d) + mask) v.
        masked = torch.where(slots <= pos, 0.0, float("-inf")).to(self.c.dtype)[None, None, None]
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            q, k, v = block.qkv(x, cos, sin)
            kc = torch.where(write, k, k_cache[i])
            vc = torch.where(write, v, v_cache[i])
            attn = F.scaled_dot_product_attention(
                q, repeat_kv(self.c, kc), repeat_kv(self.c, vc), attn_mask=masked
            )
            x = block.finish(x, attn)
            ks.append(kc)
            vs.append(vc)
        logits = self.lm_head(self.norm(x[:, -1, :]))
        return logits, torch.stack(ks), torch.stack(vs)


def make_decoder(c: Config) -> Decoder:
    torch.manual_seed(c.seed)
    model = Decoder(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.02)
    return model.to(c.dtype).eval()


def example_inputs(c: Config) -> dict[str, tuple[torch.Tensor, ...]]:
    cache = torch.zeros((c.layers, c.batch, c.kv_heads, c.max_len, c.head_dim), dtype=c.dtype)
    tokens = torch.zeros((c.batch, c.prompt), dtype=torch.int64)
    return {
        "prefill": (tokens,),
        "decode": (tokens[:, :1], torch.tensor([c.prompt]), cache, cache.clone()),
    }


def build() -> dict:
    """PLeX's torch frontend entry: both entrypoints of one module, so they share weights."""
    c = Config()
    model = make_decoder(c)
    inputs = example_inputs(c)
    return {
        "prefill": (model.prefill, inputs["prefill"]),
        "decode": (model.decode, inputs["decode"]),
    }
