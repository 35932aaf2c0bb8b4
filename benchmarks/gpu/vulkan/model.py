"""The transformers of the Vulkan-vs-CUDA run (benchmarks/gpu/vulkan_models.py), random weights
from a fixed seed, eager attention (IREE 3.13's SPIR-V pipeline cannot lower the fused attention
op that torch's SDPA becomes):

- minilm: all-MiniLM-L6-v2's layer shape (hidden 384, 12 heads, FFN 1536) with 3 of its 6
  layers and a vocabulary of 1024 tokens (the real one's 30522 rows are 47 MB), so that the
  artifacts travel to the GPU machine beside the runtime wheel (the device call carries 64 MiB);
  batch 8, 128 tokens.
- vit: ViT-Tiny's layer shape (hidden 192, 3 heads, FFN 768, patch 16, 224x224) with 6 of its
  12 layers, for the same reason; batch 8.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTModel

BATCH = 8
SEQ = 128
IMAGE = 224


class Hidden(torch.nn.Module):
    """The last hidden state: one tensor out, as MyeLiN returns it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args).last_hidden_state


def minilm_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1024,
        hidden_size=384,
        num_hidden_layers=3,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    return Hidden(BertModel(config, add_pooling_layer=False).eval())


def minilm_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 1024, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return ids, torch.ones_like(ids)


def vit_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=IMAGE,
        patch_size=16,
        num_channels=3,
        hidden_size=192,
        num_hidden_layers=6,
        num_attention_heads=3,
        intermediate_size=768,
        attn_implementation="eager",
    )
    return Hidden(ViTModel(config, add_pooling_layer=False).eval())


def vit_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1)),)


def minilm() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return minilm_model(), minilm_inputs()


def vit() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return vit_model(), vit_inputs()
