"""The H200 codec benchmark's realistic-size decoder: benchmarks/gpu/decoder's float16 Llama-style
decoder (its `Decoder`, through `decoder_model.py`, a link to ../decoder/model.py) with
Llama-7B-shaped layers (dim 4096, 32 heads, ffn 11008), 2 of them, and a 32000-token vocabulary:
666M parameters, 1.33 GB in float16, so that a decode step is bound by reading the weights
(benchmarks/gpu/decoder's 16M parameters are read in less time than the step's launches take).

Entrypoints: `prefill` (8 x 64 tokens), `decode` (batch 8) and `decode1` (batch 1, the first
sequence's cache), one module so that they share the weights. The weights are seeded
(`weights()`), so the GPU machine rebuilds the .mln's parameter payload instead of receiving it
(benchmarks/gpu/payload.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from decoder_model import Config, example_inputs, make_decoder

CONFIG = Config(
    vocab=32000,
    dim=4096,
    layers=2,
    heads=32,
    kv_heads=32,
    ffn=11008,
    batch=8,
    prompt=64,
    max_len=128,
)


def _inputs() -> dict[str, tuple[torch.Tensor, ...]]:
    inputs = example_inputs(CONFIG)
    one = example_inputs(dataclasses.replace(CONFIG, batch=1))
    return {**inputs, "decode1": one["decode"]}


def weights() -> dict[str, np.ndarray]:
    """The seeded weights by torch name, as the torch frontend stores them (float16), and the
    buffers it stores with them (the rotary frequencies)."""
    model = make_decoder(CONFIG)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return {name: t.detach().numpy() for name, t in tensors}


def build() -> dict:
    """PLeX's torch frontend entry: the three entrypoints of one module (shared weights)."""
    model = make_decoder(CONFIG)
    inputs = _inputs()
    return {
        "prefill": (model.prefill, inputs["prefill"]),
        "decode": (model.decode, inputs["decode"]),
        "decode1": (model.decode, inputs["decode1"]),
    }
