"""Write a tiny seeded Llama and its tokenizer into tinyllama/, as `save_pretrained` does for a
model you download: config.json, model.safetensors, generation_config.json, tokenizer.json.

    .venv/bin/python examples/hf-llm/make_model.py

The weights are random (seed 0), so the text is noise; the point is the path from a Hugging
Face folder to streamed text. For a real model, put its folder here instead (e.g. the files of
TinyLlama/TinyLlama-1.1B-Chat-v1.0) and keep `source` in plex.toml pointing at it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
TEXT = [
    "once upon a time there was a small model that wrote short stories",
    "the quick brown fox jumps over the lazy dog",
] * 50


def main() -> None:
    folder = HERE / "tinyllama"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
