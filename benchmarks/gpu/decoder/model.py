"""The decoder the H200 benchmark runs: examples/llama's architecture (RMSNorm, rotary position
embeddings, grouped-query attention, SwiGLU MLP, explicit KV cache; `prefill` and `decode` share
the weights), written to run in float16 end to end at the benchmark's shapes.

Why not examples/llama itself: the benchmark needs batch 8 x 512-token prefill (examples/llama
exports batch 1 and a 256-slot cache) in float16 (its rotary tables and masks are float32, which
promotes half inputs), and the .mln must travel to the GPU machine through a 64 MiB limit
(examples/llama's 56M float32 parameters are 224 MB). Same layers, smaller vocabulary and depth:
16.3M parameters, 33 MB of float16 weights.

Used three ways: PLeX builds it (plex.toml beside this file, `model.py:build`),
torch eager runs the same module on CUDA, and the benchmark loads the weights PLeX stored in the
.mln into the torch module so both compute with identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 4096
    dim: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 1408
    batch: int = 8
    prompt: int = 512
    max_len: int = 576  # KV cache slots: the prompt plus 64 generated tokens
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0
    dtype: torch.dtype = torch.float16

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in float32: float16 overflows at |x| > 256 (x^2 > 65504).
        ms = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(ms + self.eps)).to(x.dtype) * self.weight


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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Decoder(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return angles.cos().to(self.c.dtype), angles.sin().to(self.c.dtype)

    def repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.c.heads // self.c.kv_heads, dim=1)

    def prefill(self, tokens: torch.Tensor):
        """tokens [b, s] -> (logits of the last position [b, vocab], k_cache, v_cache); the
        caches [layers, b, kv_heads, max_len, head_dim] hold positions 0..s-1."""
        s = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.rope(torch.arange(s, device=tokens.device))
        ks, vs = [], []
        for block in self.blocks:
            q, k, v = block.qkv(x, cos, sin)
            attn = F.scaled_dot_product_attention(
                q, self.repeat_kv(k), self.repeat_kv(v), is_causal=True
            )
            x = block.finish(x, attn)
            ks.append(F.pad(k, (0, 0, 0, self.c.max_len - s)))
            vs.append(F.pad(v, (0, 0, 0, self.c.max_len - s)))
        logits = self.lm_head(self.norm(x[:, -1, :]))
        return logits, torch.stack(ks), torch.stack(vs)

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
                q, self.repeat_kv(kc), self.repeat_kv(vc), attn_mask=masked
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
