"""Hugging Face causal LMs through PLeX: a folder saved by `save_pretrained` named in a package
manifest (frontend = "causal-lm"), built with real IREE, generated with MyeLiN's Generator and
`plex generate`, against transformers' own `generate` (fp32, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("iree.turbine")

import myelin  # noqa: E402
from myelin.errors import MemoryBudgetExceeded  # noqa: E402
from myelin.runtime.generation import Generator, Sampling, argmax_rows  # noqa: E402
from tests.llm.builds import MAX_SEQ, PROMPT, build_causal_lm, transformers_greedy  # noqa: E402
from tests.llm.tiny_models import FAMILIES  # noqa: E402

pytestmark = pytest.mark.slow

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path]:
    """The Llama family with max_batch 2 (the batch tests) and the folder it came from."""
    root = tmp_path_factory.mktemp("llama")
    return build_causal_lm(root, "llama", max_batch=2), root / "lm" / "model"


@pytest.fixture(scope="module")
def llama_model(llama):
    model = myelin.Instance().load(llama[0])
    yield model
    model.close()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])
def test_greedy_tokens_equal_transformers_generate(tmp_path, family):
    mln = build_causal_lm(tmp_path, family)
    model = myelin.Instance().load(mln)
    with Generator(model) as generator:
        prompt = generator.encode(PROMPT)
        result = generator.generate(prompt, max_new_tokens=NEW_TOKENS, use_eos=False)
    model.close()
    assert result.tokens[0] == transformers_greedy(tmp_path / "lm" / "model", prompt, NEW_TOKENS)


def test_llama_greedy_tokens_equal_transformers_generate(llama, llama_model):
    with Generator(llama_model) as generator:
        prompt = generator.encode(PROMPT)
        result = generator.generate(prompt, max_new_tokens=NEW_TOKENS, use_eos=False)
    assert result.stop_reasons == ["max_new_tokens"]
    assert result.tokens[0] == transformers_greedy(llama[1], prompt, NEW_TOKENS)
    assert result.decode_steps == NEW_TOKENS - 1


def test_greedy_picks_on_the_device_equal_picks_on_the_host(llama_model):
    """The device's picks, with each decode queued on the last step's tokens before they are
    read, give the host's argmax tokens, batch rows of different lengths and stops included;
    a stop leaves a queued step unused, and the next generation is unchanged by it."""
    prompts = ["the quick brown fox jumps over", "a model"]
    with Generator(llama_model, device_picks=False) as on_host:
        assert not on_host.greedy_tokens
        expected = on_host.generate(prompts, max_new_tokens=24, use_eos=False)
    with Generator(llama_model) as on_device:
        assert on_device.greedy_tokens  # the artifact returns them
        assert on_device.generate(prompts, max_new_tokens=24, use_eos=False).tokens == (
            expected.tokens
        )
        stop = expected.tokens[0][5]
        stopped = on_device.generate(prompts, max_new_tokens=24, stop_tokens=[stop], use_eos=False)
        assert stopped.tokens[0] == expected.tokens[0][: expected.tokens[0].index(stop) + 1]
        assert stopped.stop_reasons[0] == "eos"
        again = on_device.generate(prompts, max_new_tokens=24, use_eos=False)
    assert again.tokens == expected.tokens


def test_the_greedy_pick_of_float16_logits_is_numpys_argmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((8, 32000)) * 4).astype(np.float16)
    logits[1] = -np.abs(logits[1])  # every logit negative
    logits[2, 17] = logits[2, 31999] = 50.0  # a tie: the first index wins
    logits[3] = np.float16(-np.inf)
    logits[3, 5] = -60000.0
    expected = np.argmax(logits.astype(np.float64), axis=1)
    assert argmax_rows(logits).tolist() == expected.tolist()
    assert argmax_rows(logits.astype(np.float32)).tolist() == expected.tolist()


def test_timings_are_the_streams_wall_clock(llama_model):
    with Generator(llama_model) as generator:
        r = generator.generate(PROMPT, max_new_tokens=8, use_eos=False)
    assert r.decode_steps == 7
    # decode time holds the calls and each step's choice and text; the first token follows
    # the prefill call and its own choice
    assert r.timings["decode_s"] >= r.timings["decode_calls_s"] > 0
    assert r.time_to_first_token_s >= r.timings["prefill_s"] > 0
    assert r.decode_tokens_per_s == pytest.approx(7 / r.timings["decode_s"])


def test_a_batch_of_prompts_of_different_lengths_equals_each_prompt_alone(llama_model):
    prompts = ["the quick brown fox jumps over", "a model"]
    with Generator(llama_model) as generator:
        together = generator.generate(prompts, max_new_tokens=24, use_eos=False)
        alone = [generator.generate(p, max_new_tokens=24, use_eos=False) for p in prompts]
    assert together.tokens == [a.tokens[0] for a in alone]


def test_sampling_is_reproducible_with_a_seed(llama_model):
    def sample(seed: int) -> list[int]:
        sampling = Sampling(temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.2, seed=seed)
        with Generator(llama_model) as generator:
            return generator.generate(PROMPT, max_new_tokens=32, sampling=sampling).tokens[0]

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first  # 32 draws from ~40 candidates: equal only by a fluke


def test_stop_strings_cut_the_text_and_end_the_sequence(llama_model):
    with Generator(llama_model) as generator:
        full = generator.generate(PROMPT, max_new_tokens=40, use_eos=False)
        text = full.texts[0]
        stop = text[10:13]  # a string the greedy text contains
        assert len(stop) == 3
        steps = list(
            s := generator.stream(PROMPT, max_new_tokens=40, stop_strings=[stop], use_eos=False)
        )
    result = s.result
    assert result.stop_reasons == ["stop_string"]
    assert result.texts[0] == text[: text.find(stop)]
    assert "".join(step.text for step in steps) == result.texts[0]  # never streamed past it
    assert len(result.tokens[0]) < 40


def test_a_stop_token_ends_the_sequence(llama_model):
    with Generator(llama_model) as generator:
        full = generator.generate(PROMPT, max_new_tokens=20, use_eos=False).tokens[0]
        result = generator.generate(PROMPT, max_new_tokens=20, stop_tokens=[full[5]], use_eos=False)
    assert result.tokens[0] == full[: full.index(full[5]) + 1]
    assert result.stop_reasons == ["eos"]


def test_a_sequence_stops_when_it_fills_max_seq(llama_model):
    prompt = list(range(3, 3 + MAX_SEQ - 3))  # room for 3 decode calls
    with Generator(llama_model) as generator:
        result = generator.generate(prompt, max_new_tokens=10, use_eos=False)
    assert result.stop_reasons == ["max_seq"]
    assert len(result.tokens[0]) == 4  # the prefill's token and one per decode call
    assert result.decode_steps == 3


def test_cancel_ends_the_stream_and_the_generator_stays_usable(llama_model):
    with Generator(llama_model) as generator:
        stream = generator.stream(PROMPT, max_new_tokens=60, use_eos=False)
        for i, _ in enumerate(stream):
            if i == 2:
                threading.Thread(target=generator.cancel).start()
        assert stream.result.stop_reasons == ["cancelled"]
        assert len(stream.result.tokens[0]) < 60
        again = generator.generate(PROMPT, max_new_tokens=8, use_eos=False)
        assert again.stop_reasons == ["max_new_tokens"] and len(again.tokens[0]) == 8


def test_memory_admission_counts_each_generators_kv_cache(llama):
    probe = myelin.Instance().load(llama[0])
    with Generator(probe) as generator:
        cache = generator.cache_bytes
    probe.close()
    parameters = sum(p.length for p in probe.artifact_manifest.parameters)
    model = myelin.Instance().load(llama[0], memory_budget=parameters + cache + cache // 2)
    first = Generator(model)
    assert model.budget.in_flight == cache
    with pytest.raises(MemoryBudgetExceeded, match="KV cache"):
        Generator(model).close()
    first.close()
    assert model.budget.in_flight == 0
    model.close()


def test_plex_generate_streams_text_and_reports_speed(llama):
    def plex(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "plex", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )

    done = plex("generate", str(llama[0]), "--prompt", PROMPT, "-n", "12", "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    import json

    record = json.loads(done.stdout)
    assert len(record["tokens"][0]) == 12 and record["decode_tokens_per_s"] > 0
    streamed = plex("generate", str(llama[0]), "--prompt", PROMPT, "-n", "12", "--ignore-eos")
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout.startswith(PROMPT + record["texts"][0].rstrip())
    assert "decode" in streamed.stderr and "tokens/s" in streamed.stderr
    refused = plex("generate", str(llama[0]), "--prompt", "a", "-p", "b", "-p", "c")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: 3 prompts but the model was built for max_batch = 2")


def test_the_artifact_stores_the_weights_and_no_cache(llama, llama_model):
    """The cache starts as a zero splat: the .mln holds the weights, not max_seq slots."""
    from safetensors.numpy import load_file

    weights = sum(a.nbytes for a in load_file(str(llama[1] / "model.safetensors")).values())
    stored = sum(p.length for p in llama_model.artifact_manifest.parameters)
    with Generator(llama_model) as generator:
        assert generator.cache_bytes > 100_000
    assert weights <= stored < weights + 1024  # + the rotary frequencies, a constant
