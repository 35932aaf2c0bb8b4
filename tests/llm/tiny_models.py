"""Tiny seeded Hugging Face causal LMs written with `save_pretrained`, plus a byte-level BPE
tokenizer trained here with the `tokenizers` library: what a user downloads, at test size."""

from __future__ import annotations

from pathlib import Path

# A few sentences to train the tokenizer on: its merges only need to exist, not be good.
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a language model predicts the next token from the tokens before it",
    "plex builds an artifact and myelin runs it on the device",
    "once upon a time there was a small model that wrote short stories",
] * 20

VOCAB = 512  # tokenizer and model vocabulary
COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# family -> (config class name, config keys): 2 layers, hidden 64, grouped-query attention
# where the family has it.
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": (
        "LlamaConfig",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
    ),
    "mistral": (
        "MistralConfig",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            sliding_window=None,
        ),
    ),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512)),
    "phi3": (
        "Phi3Config",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            original_max_position_embeddings=512,
            sliding_window=None,
            pad_token_id=0,
        ),
    ),
}


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))


def write_model(folder: Path, family: str = "llama", seed: int = 0, **config_keys: object) -> Path:
    """A seeded model of `family` saved into `folder` (created), with its tokenizer;
    `config_keys` replace the family's (a head dim the GPU kernels take, say)."""
    import torch
    import transformers

    class_name, keys = FAMILIES[family]
    config = getattr(transformers, class_name)(**{**COMMON, **keys, **config_keys})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder
