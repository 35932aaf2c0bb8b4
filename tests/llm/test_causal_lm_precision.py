"""A causal LM built with weight codecs (`[weights.codec]`) or a 16-bit `dtype`, against the
same model built fp32: how soon greedy decoding departs from fp32's tokens and how far the
first decode step's logits move. The numbers are in docs/llm.md ("Weight codecs and dtype");
the tolerances here sit above them with room for other CPUs' rounding."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("iree.turbine")

import myelin
from myelin.compiler.targets import compute_choice, data_tiling_choice
from myelin.runtime.generation import Generator
from tests.llm.builds import PROMPT, build_causal_lm

pytestmark = pytest.mark.slow

NEW_TOKENS = 64

# name -> (the app's [weights.codec] table, the graph's dtype): every weight a codec may take
# ("*"; the 32x64 k/v projections and the norms stay fp32 by the codec rules).
VARIANTS: dict[str, tuple[str, str | None]] = {
    "fp32": ("", None),
    "fp16": ('[weights.codec]\n"*" = "fp16"\n', None),
    "int8": ('[weights.codec]\n"*" = "int8"\n', None),
    "q4": ('[weights.codec]\n"*" = "q4"\n', None),
    "dtype float16": ("", "float16"),
    "dtype bfloat16": ("", "bfloat16"),
}

# name -> (max |logit - fp32 logit| of the first decode step, earliest allowed index of the first
# greedy token that differs from fp32's among NEW_TOKENS; NEW_TOKENS: all identical).
TOLERANCES: dict[str, tuple[float, int]] = {
    "fp16": (1e-3, 32),
    "int8": (1e-2, 16),
    "q4": (0.15, 8),
    "dtype float16": (2e-3, 32),
    "dtype bfloat16": (1e-2, 8),
}


def first_decode_logits(generator: Generator, prompt: list[int], token: int) -> np.ndarray:
    """The logits of decoding `token` after `prompt` (the same token for every variant)."""
    ids = np.array([prompt], dtype=np.int64)
    positions = np.arange(len(prompt), dtype=np.int64)[None]
    generator.session.call("prefill", ids, positions, np.ones_like(ids))
    n = len(prompt)
    mask = np.ones((1, n + 1), dtype=np.int64)
    logits, _ = generator.session.call("decode", np.array([[token]]), np.array([[n]]), mask)
    return np.asarray(logits)


def first_divergence(tokens: list[int], reference: list[int]) -> int:
    """Index of the first token that differs from the reference; len(reference) if none."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=True)):
        if a != b:
            return i
    return len(reference)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """name -> (max abs logit error of the first decode step, first divergent token index);
    "cache" -> {name -> (cache bytes, cache dtype)}."""
    runs: dict[str, tuple[np.ndarray, list[int], int]] = {}
    dtypes: dict[str, str] = {}
    devices: dict[str, dict] = {}
    for name, (codecs, dtype) in VARIANTS.items():
        root = tmp_path_factory.mktemp(name.replace(" ", "-"))
        model = myelin.Instance().load(
            build_causal_lm(root, graph=f'dtype = "{dtype}"' if dtype else "", app=codecs)
        )
        devices[name] = model.manifest["variants"][0]["devices"][0]
        try:
            with Generator(model) as generator:
                prompt = generator.encode(PROMPT)
                tokens = generator.generate(prompt, max_new_tokens=NEW_TOKENS, use_eos=False)
                first = runs["fp32"][1][0] if runs else tokens.tokens[0][0]
                logits = first_decode_logits(generator, prompt, first)
                runs[name] = (logits, tokens.tokens[0], generator.cache_bytes)
                dtypes[name] = generator.cache_dtype
        finally:
            model.close()
    logits32, tokens32, _ = runs["fp32"]
    print(f"fp32 first decode step: max abs logit {float(np.abs(logits32).max()):.3g}")
    return {
        name: (float(np.abs(logits - logits32).max()), first_divergence(tokens, tokens32))
        for name, (logits, tokens, _) in runs.items()
    } | {"cache": {name: (runs[name][2], dtypes[name]) for name in runs}, "devices": devices}


@pytest.mark.parametrize("name", list(TOLERANCES))
def test_agreement_with_fp32_is_within_the_stated_tolerance(measured, name):
    error, divergence = measured[name]
    max_error, earliest = TOLERANCES[name]
    print(f"{name}: max abs logit error {error:.3g}, first divergent token {divergence}")
    assert error <= max_error
    assert divergence >= earliest


def test_the_cache_holds_the_models_dtype(measured):
    cache = measured["cache"]
    fp32_bytes = cache["fp32"][0]
    assert cache["fp32"][1] == "float32"
    assert cache["int8"] == (fp32_bytes, "float32")  # a weight codec leaves the cache float32
    assert cache["dtype float16"] == (fp32_bytes // 2, "float16")
    assert cache["dtype bfloat16"] == (fp32_bytes // 2, "bfloat16")


def test_q4_and_int8_weights_choose_bf16_matmul_inputs_where_the_cpu_has_bf16_dot_products(
    measured,
):
    """Every weight q4 (or every weight int8), coarser than bf16: the build rounds matmul inputs
    to bf16 where the packed kernels have AVX512-BF16 (recorded with its reason); fp16 keeps
    f32 and records no choice."""
    devices = measured["devices"]
    want = compute_choice(data_tiling_choice("host", "").value, True, "host", "")
    assert want is not None
    for name in ("q4", "int8"):
        assert devices[name]["host_chosen"]["compute"] == {
            "value": want.value,
            "reason": want.reason,
        }
        assert devices[name]["options"].get("compute", "f32") == want.value
    for name in ("fp32", "fp16"):
        assert "compute" not in devices[name].get("host_chosen", {})
        assert "compute" not in devices[name]["options"]
