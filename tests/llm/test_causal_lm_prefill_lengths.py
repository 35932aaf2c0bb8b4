"""Static-length prefills (`prefill_lengths`): the build exports `prefill_<n>` beside the dynamic
`prefill`, the Generator pads a batch on the right to the smallest length that holds it and
falls back to `prefill` otherwise. Greedy tokens equal transformers' own `generate` either way
(fp32, CPU, llvm-cpu: token ids compared exactly, a tie would show as a mismatch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("iree.turbine")

import myelin  # noqa: E402
from myelin.runtime.generation import Generator  # noqa: E402
from tests.llm.builds import MAX_SEQ, PROMPT, build_causal_lm, transformers_greedy  # noqa: E402

pytestmark = pytest.mark.slow

LENGTHS = (16, 64)
NEW_TOKENS = 32
BATCH = ["the quick brown fox jumps over the lazy dog", "a model"]


# Llama (rotary positions, grouped-query attention) and GPT-2 (learned positions, its own
# attention module): the right padding's positions and the causal mask reach both.
@pytest.fixture(scope="module", params=["llama", "gpt2"])
def bucketed(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = myelin.Instance().load(
        build_causal_lm(
            root, request.param, max_batch=2, graph=f"prefill_lengths = {list(LENGTHS)}"
        )
    )
    yield model, root / "lm" / "model"
    model.close()


def test_greedy_tokens_equal_transformers_with_the_static_and_the_dynamic_prefill(bucketed):
    model, folder = bucketed
    with Generator(model) as generator:
        assert generator.prefill_lengths == LENGTHS
        prompt = generator.encode(PROMPT)
        assert len(prompt) < LENGTHS[0]  # padded: the static prefill holds 12 padding slots
        static = generator.generate(prompt, max_new_tokens=NEW_TOKENS, use_eos=False)
    with Generator(model, static_prefill=False) as generator:
        dynamic = generator.generate(prompt, max_new_tokens=NEW_TOKENS, use_eos=False)
    assert (static.prefill_entrypoint, dynamic.prefill_entrypoint) == ("prefill_16", "prefill")
    expected = transformers_greedy(folder, prompt, NEW_TOKENS)
    assert static.tokens[0] == expected
    assert dynamic.tokens[0] == expected


def test_a_right_padded_batch_equals_the_left_padded_one_and_each_prompt_alone(bucketed):
    model, _ = bucketed
    with Generator(model) as generator:
        static = generator.generate(BATCH, max_new_tokens=24, use_eos=False)
        alone = [generator.generate(p, max_new_tokens=24, use_eos=False) for p in BATCH]
    with Generator(model, static_prefill=False) as generator:
        dynamic = generator.generate(BATCH, max_new_tokens=24, use_eos=False)
    assert static.prefill_entrypoint == "prefill_16"
    assert static.tokens == dynamic.tokens == [a.tokens[0] for a in alone]


def test_the_dynamic_prefill_runs_when_no_length_fits_or_one_would_cut_the_generation(bucketed):
    model, folder = bucketed
    with Generator(model) as generator:
        longer = list(range(3, 3 + LENGTHS[-1] + 6))  # longer than every static length
        result = generator.generate(longer, max_new_tokens=8, use_eos=False)
        assert result.prefill_entrypoint == "prefill"
        assert result.tokens[0] == transformers_greedy(folder, longer, 8)
        # 10 tokens could go to prefill_16, but its 6 padding slots would leave room for 112
        # decode steps where the dynamic prefill leaves 118, and 119 are asked for
        ten = list(range(3, 13))
        full = generator.generate(ten, max_new_tokens=MAX_SEQ, use_eos=False)
        assert full.prefill_entrypoint == "prefill"
        assert full.stop_reasons == ["max_seq"] and len(full.tokens[0]) == MAX_SEQ - 10 + 1
        short = generator.generate(ten, max_new_tokens=16, use_eos=False)
        assert short.prefill_entrypoint == "prefill_16"
        assert short.tokens[0] == full.tokens[0][:16]
