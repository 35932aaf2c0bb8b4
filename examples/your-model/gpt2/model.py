"""A Hugging Face GPT-2 as transformers returns it: built from a small config with seeded
weights, so nothing is downloaded. For your own checkpoint, return
`transformers.AutoModelForCausalLM.from_pretrained("path/to/folder")` instead (a folder holding
config.json and model.safetensors)."""

import torch
import transformers


def build():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=1000, n_layer=2, n_head=2, n_embd=64, n_positions=128,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 8))  # batch 1: the build widens it
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
