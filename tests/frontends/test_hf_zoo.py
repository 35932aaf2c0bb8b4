"""Hugging Face transformers and timm models built as the libraries return them (no wrapper),
from small seeded configs (tests/frontends/zoo), with dynamic batch and sequence (batch only for
vision and Whisper's fixed 30 s window), run through MyeLiN and compared with torch eager.

timm needs torchvision at import; the registry's torchvision wheel is a CUDA build that cannot
load beside the CPU torch, so where no torchvision imports, the tests put a placeholder package
on sys.path (tests/frontends/_torchvision_shim: torchvision's FrozenBatchNorm2d, every other
name a stub). CI installs timm with `pip install --no-deps timm==1.0.31`.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

RTOL = 1e-4  # fp32 end to end, relative to the largest reference magnitude
BATCH, SEQ = 3, 11  # neither is the example's size (1 x 8): the dims are really dynamic

# graph -> (the outputs' names as the library names them, the inputs)
TEXT = ("input_ids", "attention_mask")
MODELS = {
    "bert": (["last_hidden_state", "pooler_output"], TEXT),
    "gpt2": (["logits"], TEXT),
    "llama": (["logits"], TEXT),
    "t5_encoder": (["last_hidden_state"], TEXT),
    "clip_text": (["last_hidden_state", "pooler_output"], TEXT),
    "whisper_encoder": (["last_hidden_state"], ("input_features",)),
    "vit": (["logits"], ("pixel_values",)),
    "segformer": (["logits"], ("pixel_values",)),
    "timm_resnet50": (["output0"], ("x",)),
    "timm_vit_base": (["output0"], ("x",)),
    "timm_deit_tiny": (["output0"], ("x",)),
}


def example_inputs(graph: str, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    names = MODELS[graph][1]
    if names == TEXT:
        ids = rng.integers(3, 100, (batch, SEQ), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[0, -3:] = 0  # padding in one row: the mask is an input, not a constant
        return {"input_ids": ids, "attention_mask": mask}
    if names == ("input_features",):
        return {"input_features": rng.standard_normal((batch, 16, 32), dtype=np.float32)}
    side = 64 if graph == "timm_resnet50" else 32  # see zoo.timm_resnet50
    return {names[0]: rng.standard_normal((batch, 3, side, side), dtype=np.float32)}


def eager(zoo_source, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model, example = getattr(zoo_source, graph)()
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.no_grad():
        out = model(**tensors) if isinstance(example, dict) else model(*tensors.values())
    if isinstance(out, torch.Tensor):
        return {"output0": out.numpy()}
    return {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


@pytest.mark.parametrize("graph", list(MODELS))
def test_library_model_matches_torch_eager_at_a_new_batch_and_length(zoo_model, zoo_source, graph):
    entry = f"{graph}.forward"
    inputs = example_inputs(graph, BATCH, np.random.default_rng(0))
    with zoo_model.session() as s:
        call = s.resolve(entry)
        got = call(*inputs.values())
    got = got if isinstance(got, tuple) else (got,)
    names = [o.name for o in call.signature.outputs]
    assert names == MODELS[graph][0]
    assert [i.name for i in call.signature.inputs] == list(inputs)
    want = eager(zoo_source, graph, inputs)
    for name, value in zip(names, got, strict=True):
        assert value.shape == want[name].shape, name
        assert rel_err(value, want[name]) < RTOL, name


def test_text_models_keep_batch_and_sequence_dynamic_and_named(zoo_model):
    entries = {e["name"]: e for e in zoo_model.manifest["variants"][0]["entrypoints"]}
    for graph in ("bert", "gpt2", "llama", "t5_encoder", "clip_text"):
        ids, mask = entries[f"{graph}.forward"]["inputs"]
        assert (ids["shape"], ids["dims"][0], ids["dims"][1]) == ([None, None], "batch", "seq")
        assert mask["dims"] == ids["dims"]


def test_the_build_says_what_it_changed_for_the_export(zoo):
    """use_cache turned off (GPT-2, Llama return a DynamicCache otherwise) and the batch-1
    examples widened: each a build warning naming the graph, not a refusal."""
    cache = [w for w in zoo.warnings if "config.use_cache = True; turned off" in w]
    assert any("zoo:gpt2" in w and "GPT2LMHeadModel" in w for w in cache)
    assert any("zoo:llama" in w for w in cache)
    widened = [w for w in zoo.warnings if "size 1 in dynamic dim 'batch'; repeated to size 2" in w]
    assert {w.split(":")[1].split()[0] for w in widened} >= {"bert", "vit", "timm_resnet50"}
