"""The GPU zoo: public architectures as their libraries return them (Hugging Face transformers,
timm), from configs, with seeded weights, in float16.

Each model comes in two sizes: `small` (CI: tests/plex/test_kernels_zoo.py builds them for a
Hopper device without a GPU and checks the kernel report) and `real` (the GPU suite's `zoo-*`
cases, benchmarks/cases/gpu.toml: Llama-7B and Qwen2-7B layer shapes with 2 layers, BERT-base
and ViT-B whole, Whisper-base's encoder, timm vit_base_patch16_224 and resnet50). The graph
source functions are `<model>_<size>()`, each returning `(model, example inputs by argument
name)` as a PLeX torch graph's source does.

Weights come from numpy's default_rng seeded per parameter name (`seeded_values`): numpy's
generator gives the same values on any machine and version, which torch's CPU generator does not
promise, so the GPU machine computes the very weights the build here embedded
(benchmarks/gpu_suite.py checks every section's digest). Buffers the library derives from the
config (rotary frequencies, position ids) stay as the library computes them; batch-norm
statistics are seeded.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

SEED = 0
DTYPE = torch.float16

# Per size: the configs' widths, and the example inputs' sizes (the sizes timed on the GPU).
# Small widths keep every matmul kernel-eligible (K % 64, N % 16) and head dims at 64, the
# attention kernels' smallest, so the CI test sees the forms the real models have.
SMALL = {
    "hidden": 128, "heads": 2, "kv_heads": 1, "ffn": 256, "layers": 2, "vocab": 256,
    "qwen_hidden": 128, "qwen_heads": 2, "qwen_kv_heads": 1, "qwen_ffn": 384,
    "batch": 2, "seq": 64, "image": 32, "patch": 8, "mel": 16, "frames": 64, "resnet_image": 64,
}  # fmt: skip
REAL = {
    # Llama-7B's layer: 4096 wide, 32 heads, 11008 FFN; its vocabulary
    "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008, "layers": 2, "vocab": 32000,
    # Qwen2-7B's layer: 3584 wide, 28 heads over 4 KV heads (GQA), 18944 FFN. Its 152064-token
    # vocabulary would be 2.2 GB of f16 embedding and head here: Llama's 32000 instead
    "qwen_hidden": 3584, "qwen_heads": 28, "qwen_kv_heads": 4, "qwen_ffn": 18944,
    "batch": 8, "seq": 512, "image": 224, "patch": 16, "mel": 80, "frames": 3000,
    "resnet_image": 224,
}  # fmt: skip
SIZES = {"small": SMALL, "real": REAL}
PREFILL_TOKENS = {"small": 64, "real": 2048}  # the decoders' prompt (batch 1)


def seeded_values(name: str, shape: tuple[int, ...], seed: int = SEED) -> np.ndarray:
    """The value of parameter or buffer `name` (float32): a normal draw from default_rng seeded
    by (seed, crc32 of the name), scaled as the layer kind wants it (norm scales near 1, biases
    and statistics small, weights 1/sqrt(fan-in) so activations stay O(1) through the layers)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    draw = rng.standard_normal(shape, dtype=np.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "running_var":
        return (1.0 + 0.1 * np.abs(draw)).astype(np.float32)
    if leaf in ("bias", "running_mean") or len(shape) == 0:
        return (0.02 * draw).astype(np.float32)
    if len(shape) == 1:  # norm scales (LayerNorm, RMSNorm, batch norm)
        return (1.0 + 0.1 * draw).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (draw / np.sqrt(fan_in)).astype(np.float32)


_SEEDED_BUFFERS = ("running_mean", "running_var")


def seed_weights(model: torch.nn.Module, seed: int = SEED) -> torch.nn.Module:
    """Every parameter and batch-norm statistic of `model` from `seeded_values`, in place."""
    seeded = [*model.named_parameters()]
    # buffers the library derives from the config (rotary frequencies, position ids) stay its own
    seeded += [(n, b) for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in _SEEDED_BUFFERS]
    with torch.no_grad():
        for name, tensor in seeded:
            if tensor.is_floating_point():
                tensor.copy_(torch.from_numpy(seeded_values(name, tuple(tensor.shape), seed)))
    return model


def _ids(
    size: str, batch: int | None = None, seq: int | None = None, vocab: int | None = None
) -> torch.Tensor:
    """Token ids below `vocab` (the model's own vocabulary where it differs from the size's)."""
    s = SIZES[size]
    rng = np.random.default_rng(1)
    shape = (batch or s["batch"], seq or s["seq"])
    return torch.from_numpy(rng.integers(3, vocab or s["vocab"], shape, dtype=np.int64))


def _pixels(size: str, side: int | None = None, batch: int | None = None) -> torch.Tensor:
    s = SIZES[size]
    rng = np.random.default_rng(2)
    shape = (batch or s["batch"], 3, side or s["image"], side or s["image"])
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(DTYPE)


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    return seed_weights(model.eval()).to(DTYPE)


def llama(size: str):
    s = SIZES[size]
    config = transformers.LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, use_cache=False,
    )  # fmt: skip
    tokens = PREFILL_TOKENS[size]
    return _finish(transformers.LlamaForCausalLM(config)), {"input_ids": _ids(size, 1, tokens)}


def qwen2(size: str):
    s = SIZES[size]
    config = transformers.Qwen2Config(
        vocab_size=s["vocab"], hidden_size=s["qwen_hidden"], intermediate_size=s["qwen_ffn"],
        num_hidden_layers=s["layers"], num_attention_heads=s["qwen_heads"],
        num_key_value_heads=s["qwen_kv_heads"], max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, use_cache=False, tie_word_embeddings=False,
    )  # fmt: skip
    tokens = PREFILL_TOKENS[size]
    return _finish(transformers.Qwen2ForCausalLM(config)), {"input_ids": _ids(size, 1, tokens)}


def gpt2(size: str):
    s = SIZES[size]
    config = transformers.GPT2Config(
        vocab_size=s["vocab"], n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
        n_positions=1024, bos_token_id=1, eos_token_id=2, use_cache=False,
    )  # fmt: skip
    return _finish(transformers.GPT2LMHeadModel(config)), {"input_ids": _ids(size)}


def bert(size: str):
    s = SIZES[size]
    if size == "real":
        config = transformers.BertConfig()  # bert-base-uncased's: 768 wide, 12 layers
    else:
        config = transformers.BertConfig(
            vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"], intermediate_size=s["ffn"],
        )  # fmt: skip
    ids = _ids(size, vocab=config.vocab_size)
    return _finish(transformers.BertModel(config)), {"input_ids": ids}


def vit(size: str):
    s = SIZES[size]
    if size == "real":
        config = transformers.ViTConfig()  # google/vit-base-patch16-224's: 768 wide, 12 layers
    else:
        config = transformers.ViTConfig(
            hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
            intermediate_size=s["ffn"], image_size=s["image"], patch_size=s["patch"],
        )  # fmt: skip
    return _finish(transformers.ViTModel(config)), {"pixel_values": _pixels(size)}


def whisper_encoder(size: str):
    s = SIZES[size]
    if size == "real":
        config = transformers.WhisperConfig(  # openai/whisper-base's encoder
            d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
            # the unused decoder is built too: its heads must divide d_model (the default's 6
            # in recent transformers does not)
            decoder_layers=1, decoder_attention_heads=8, num_mel_bins=80,
            max_source_positions=1500,
        )  # fmt: skip
    else:
        config = transformers.WhisperConfig(
            d_model=s["hidden"], encoder_layers=s["layers"], encoder_attention_heads=s["heads"],
            encoder_ffn_dim=s["ffn"], decoder_layers=1, decoder_attention_heads=s["heads"],
            num_mel_bins=s["mel"], max_source_positions=s["frames"] // 2,
        )  # fmt: skip
    encoder = transformers.WhisperModel(config).get_encoder()
    rng = np.random.default_rng(3)
    features = rng.standard_normal((s["batch"], s["mel"], s["frames"]), dtype=np.float32)
    return _finish(encoder), {"input_features": torch.from_numpy(features).to(DTYPE)}


def _timm(name: str, size: str, side: int, batch: int | None = None, **small: object):
    import timm  # imports torchvision: tests/frontends/_torchvision_shim where none loads

    kwargs = {} if size == "real" else small
    model = timm.create_model(name, pretrained=False, **kwargs)
    return _finish(model), {"x": _pixels(size, side, batch)}


def timm_vit_base(size: str):
    s = SIZES[size]
    small = {"img_size": s["image"], "patch_size": s["patch"], "embed_dim": s["hidden"]}
    return _timm("vit_base_patch16_224", size, s["image"], depth=2, num_heads=2, **small)


def timm_resnet50(size: str, batch: int | None = None):
    # small: one block per stage (the same layer kinds) on a 64-pixel image; `batch`: images
    # other than the size's (the convolution cases of benchmarks/cases/gpu.toml)
    return _timm("resnet50", size, SIZES[size]["resnet_image"], batch, layers=(1, 1, 1, 1))


MODELS: dict[str, Callable] = {
    "llama": llama,
    "qwen2": qwen2,
    "gpt2": gpt2,
    "bert": bert,
    "vit": vit,
    "whisper_encoder": whisper_encoder,
    "timm_vit_base": timm_vit_base,
    "timm_resnet50": timm_resnet50,
}


def _source(model: str, size: str) -> Callable:
    def source():
        return MODELS[model](size)

    source.__name__ = f"{model}_{size}"
    return source


# The graph sources: llama_small(), llama_real(), ...
for _model in MODELS:
    for _size in SIZES:
        globals()[f"{_model}_{_size}"] = _source(_model, _size)


# Hugging Face models: their attention as written out by hand (attn_implementation="eager":
# matmul, scale, additive mask, softmax, matmul) is another form users build from.
HF_MODELS = ("llama", "qwen2", "gpt2", "bert", "vit", "whisper_encoder")
DECODERS = ("llama", "qwen2", "gpt2")


def with_eager_attention(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with Hugging Face's eager attention in every layer, in place."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = "eager"
    return model


def eager(model: str, size: str):
    """A Hugging Face zoo model with eager attention, and its example inputs."""
    module, inputs = MODELS[model](size)
    return with_eager_attention(module), inputs


class _FirstOutput(torch.nn.Module):
    """The model called with its one input by name; returns its first output (logits or last
    hidden state). Decoders also get an all-ones attention mask: without one, Hugging Face's
    masking looks for packed sequences with `torch.diff`, which the TorchScript ONNX exporter
    cannot export (the mask values are the same)."""

    def __init__(self, model: torch.nn.Module, name: str, decoder: bool) -> None:
        super().__init__()
        self.model, self.name, self.decoder = model, name, decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = {"attention_mask": torch.ones_like(x)} if self.decoder else {}
        out = self.model(**{self.name: x}, **extra)
        if isinstance(out, torch.Tensor):
            return out
        return out[0]


def export_onnx(model: str, size: str, path: Path) -> Path:
    """The zoo model exported by `torch.onnx.export` (TorchScript exporter, opset 17), as a
    user exports it: Hugging Face models with eager attention (their SDPA export computes in
    f32), timm's as they are. The ONNX input keeps the torch argument's name."""
    module, inputs = eager(model, size) if model in HF_MODELS else MODELS[model](size)
    ((name, x),) = inputs.items()
    wrapped = _FirstOutput(module, name, model in DECODERS)
    torch.onnx.export(
        wrapped, (x,), str(path), input_names=[name], dynamo=False, opset_version=17
    )  # fmt: skip
    return path
