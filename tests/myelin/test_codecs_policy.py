"""Which codec a parameter gets: package default, app globs (last match wins), and the rule that
keeps precise parameters in fp32 unless an app rule names them exactly."""

from __future__ import annotations

import pytest

from myelin.codecs import CodecPolicy, CodecRule, choose

MATRIX = (384, 384)


def pick(key, shape=MATRIX, *, default="fp32", rules=(), dtype="float32"):
    policy = CodecPolicy(
        default, "[weights.params] of package m", tuple(CodecRule(*r) for r in rules)
    )
    return choose("m.enc", key, dtype, shape, policy)


def test_default_is_fp32_and_the_package_default_applies_to_big_matrices():
    assert pick("layer.0.query.weight").codec == "fp32"
    chosen = pick("layer.0.query.weight", default="int8")
    assert (chosen.codec, chosen.reason) == ("int8", "default of [weights.params] of package m")


@pytest.mark.parametrize(
    ("key", "shape", "why"),
    [
        ("layer.0.query.bias", (384,), "rank 1"),
        ("layer.0.LayerNorm.weight", (384,), "rank 1"),
        ("token_type_embeddings.weight", (2, 384), "small (768 elements < 4096)"),
        ("final_norm.weight", (64, 128), "a norm or bias by name"),
        ("blocks.0.ln_1.weight", (64, 128), "a norm or bias by name"),
    ],
)
def test_precise_parameters_stay_fp32_under_defaults_and_wildcards(key, shape, why):
    for chosen in (pick(key, shape, default="q4"), pick(key, shape, rules=[("*", "int8")])):
        assert chosen.codec == "fp32"
        assert why in chosen.reason and "name it exactly in [weights.codec]" in chosen.reason


def test_an_exact_name_overrides_the_precision_rule():
    for name in ("layer.0.LayerNorm.weight", "m.enc::layer.0.LayerNorm.weight"):
        chosen = pick("layer.0.LayerNorm.weight", (384,), rules=[("*", "int8"), (name, "fp16")])
        assert (chosen.codec, chosen.reason) == ("fp16", f'[weights.codec] "{name}" (exact name)')


def test_globs_match_key_or_scope_and_key_and_the_last_match_wins():
    rules = [("*", "int8"), ("*.intermediate.*", "q4"), ("m.enc::*embeddings*", "fp16")]
    assert pick("layer.0.query.weight", rules=rules).codec == "int8"
    assert pick("layer.0.intermediate.dense.weight", rules=rules).codec == "q4"
    chosen = pick("word_embeddings.weight", (30522, 384), rules=rules)
    assert (chosen.codec, chosen.reason) == ("fp16", '[weights.codec] "m.enc::*embeddings*"')
    assert pick("other.weight", rules=[("x*", "int8")], default="bf16").codec == "bf16"


def test_integer_parameters_are_never_encoded_by_wildcards():
    chosen = pick("position_ids", (1, 8192), rules=[("*", "int8")], dtype="int64")
    assert chosen.codec == "fp32" and "int64, not floating point" in chosen.reason


def test_trivial_policy_means_no_encode_step():
    assert CodecPolicy().trivial
    assert CodecPolicy(rules=(CodecRule("*", "fp32"),)).trivial
    assert not CodecPolicy(rules=(CodecRule("*", "int8"),)).trivial
    assert not CodecPolicy(default="q4").trivial
