"""Sources of the full CPU table that differ from zoo.py's as a user's model differs: GPT-2 small
given its attention mask, Whisper-tiny's encoder with transformers' default attention. Importing
this module adds them to `zoo.SOURCES`.

They live in a file of their own because a case's generated graph names the digest of the files
that define its source (benchmarks/runner.py): zoo.py's cases do not depend on this file, so a
change here rebuilds only the cases that use it."""

from __future__ import annotations

import numpy as np

from benchmarks import zoo


class _WithMask(zoo.torch.nn.Module):
    """A causal LM called with its ids and attention mask by keyword (its second positional
    argument is the KV cache), returning its logits."""

    def __init__(self, model: zoo.torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: zoo.torch.Tensor, mask: zoo.torch.Tensor) -> zoo.torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, return_dict=False)[0]


def gpt2_small_masked(batch: int, seq: int):
    """GPT-2 small (12 layers), logits of a `seq`-token prefill, with an attention mask of ones
    as a second input, as a tokenizer gives it. Without a mask, transformers 5 looks for packed
    sequences with `torch.diff`, which torch.onnx's opset 17 cannot export, so ONNX Runtime and
    OpenVINO could not take the model."""
    module, (ids,) = zoo.gpt2(batch, seq, layers=12)
    return _WithMask(module.model), (ids, np.ones_like(ids))


def whisper_tiny_encoder_sdpa(batch: int, seq: int):
    """Whisper-tiny's encoder as transformers configures it by default: attention through
    `scaled_dot_product_attention` (zoo's `whisper-tiny-encoder` writes it out, `eager`)."""
    from transformers import WhisperConfig, WhisperModel

    zoo.torch.manual_seed(zoo.SEED)
    config = WhisperConfig(
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
        num_mel_bins=80,
    )
    model = WhisperModel(config).get_encoder().eval()
    frames = np.random.default_rng(zoo.SEED).standard_normal((batch, 80, 3000), dtype=np.float32)
    return zoo._LastHidden(model), (frames,)


SOURCES: dict[str, zoo.Source] = {
    "gpt2-small-masked": gpt2_small_masked,
    "whisper-tiny-encoder-sdpa": whisper_tiny_encoder_sdpa,
}
zoo.SOURCES.update(SOURCES)
