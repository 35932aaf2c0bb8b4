"""The language models of the GPU LLM benchmark: Hugging Face folders (config.json,
model.safetensors, tokenizer.json) written from a config and a seed, on any machine.

`real` is Llama-2-7B's layer (hidden 4096, 32 heads, 32 KV heads, FFN 11008, vocabulary 32000)
or Qwen2-7B's (hidden 3584, 28 heads over 4 KV heads, FFN 18944; vocabulary 32000 instead of
152064, as the GPU zoo does: 2.2 GB less to build), with `layers` of them (2 by default: the
build machine cannot hold the 27 GB a 32-layer model takes in float32 while the frontend
exports it). `small` is the same architecture at CI widths, for checking the scripts on a CPU.

Weights come from the GPU zoo's `seeded_values` (numpy's default_rng seeded per parameter
name: the same values on any machine and library version), rounded to float16 and saved as the
checkpoint's dtype, as Llama-2-7B ships. The build here and the run on the GPU machine write the
same folder, so the frontend reads the same weights on both sides and transformers runs them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

# Per family: the config class and its keys at each size; `layers` is chosen per build.
FAMILIES: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "llama": (
        "LlamaConfig",
        {
            "real": dict(
                hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                intermediate_size=11008, vocab_size=32000, rms_norm_eps=1e-5,
                max_position_embeddings=4096,
            ),
            "small": dict(
                hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                intermediate_size=256, vocab_size=512, max_position_embeddings=1024,
            ),
        },
    ),
    "qwen2": (
        "Qwen2Config",
        {
            "real": dict(
                hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944, vocab_size=32000, rms_norm_eps=1e-6,
                rope_theta=1000000.0, max_position_embeddings=32768,
                tie_word_embeddings=False,
            ),
            "small": dict(
                hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=384, vocab_size=512, max_position_embeddings=1024,
                tie_word_embeddings=False,
            ),
        },
    ),
}  # fmt: skip
DEFAULT_LAYERS = {"real": 2, "small": 2}
TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _zoo_models():
    """benchmarks/gpu/zoo/models.py, whose `seeded_values` these weights share."""
    name = "gpu_zoo_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "zoo" / "models.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def config(family: str, size: str, layers: int, **overrides: Any) -> Any:
    """The family's config at `size`; `overrides` replace its keys (the CPU suite's causal-lm
    case is the small architecture at other widths)."""
    import transformers

    class_name, sizes = FAMILIES[family]
    keys = {**sizes[size], **TOKENS, **overrides, "num_hidden_layers": layers}
    return getattr(transformers, class_name)(**keys)


def parameter_count(family: str, size: str, layers: int) -> int:
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config(family, size, layers))
    return sum(p.numel() for p in model.parameters())


def write_folder(folder: Path, family: str, size: str, layers: int, **overrides: Any) -> Path:
    """The seeded model as save_pretrained writes it (float16 weights), plus a tokenizer.

    The model is laid out on the meta device and each weight computed on its own, so writing
    holds the float16 weights once (1.3 GB for two 7B layers), never a float32 model."""
    import torch
    import transformers
    from safetensors.torch import save_file

    sys.path.insert(0, str(REPO))
    from tests.llm.tiny_models import write_tokenizer

    seeded_values = _zoo_models().seeded_values
    cfg = config(family, size, layers, **overrides)
    cfg.dtype = "float16"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: torch.from_numpy(seeded_values(name, tuple(p.shape)).astype(np.float16))
        for name, p in model.named_parameters()
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    cfg.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def frontend_values(folder: Path, dtype: str = "float32") -> dict[str, np.ndarray]:
    """What the causal-lm frontend stores for `folder`'s model built with graph `dtype`: every
    parameter and buffer of the model as myelin.frontends.causal_lm.load_model reads it, under
    its transformers name (the keys of the .mln's parameters; payload.rebuild encodes them as
    the build did)."""
    import torch

    from myelin.frontends.causal_lm import load_model

    # float32 is the frontend's default, which a frontend without `dtype` also loads
    options = {} if dtype == "float32" else {"dtype": getattr(torch, dtype)}
    model = load_model(folder, what=f"{folder.name}/", **options)
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    return {name: tensor.detach().numpy() for name, tensor in named}


def prompt_ids(batch: int, length: int, vocab: int, seed: int = 1) -> np.ndarray:
    """[batch, length] token ids in 3 .. vocab - 1 (no pad, BOS or EOS), from numpy's seed."""
    return np.random.default_rng(seed).integers(3, vocab, (batch, length), dtype=np.int64)
