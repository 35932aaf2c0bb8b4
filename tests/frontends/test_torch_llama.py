"""The Llama-style decoder of examples/llama (a small config), built through PLeX: prefill + 16
greedy decode steps with the KV cache passed in and out, against torch eager."""

from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("iree.turbine")

import myelin  # noqa: E402
from tests.conftest import EXAMPLES, build_app  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = [5, 17, 42, 7, 99, 3, 250, 11, 64, 8]
STEPS = 16  # decode calls after the prefill
LOGITS_RTOL = 1e-4

# The example's model file, unchanged, with a smaller config so the test stays quick.
TINY_PY = """
from model import Config, entrypoints

TINY = Config(vocab=1000, dim=128, layers=2, heads=4, kv_heads=2, ffn=256, max_len=64)


def build():
    return entrypoints(TINY)
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    pkg = root / "llama"
    pkg.mkdir()
    shutil.copy(EXAMPLES / "llama" / "model.py", pkg / "model.py")
    (pkg / "tiny.py").write_text(textwrap.dedent(TINY_PY))
    toml = (EXAMPLES / "llama" / "plex.toml").read_text()
    assert 'source = "model.py:build"' in toml
    (pkg / "plex.toml").write_text(toml.replace("model.py:build", "tiny.py:build"))
    (root / "app.toml").write_text('[app]\nname = "llama"\npackages = ["llama"]\n')
    return root


@pytest.fixture(scope="module")
def reference(package):
    import importlib.util
    import sys

    sys.path.insert(0, str(package / "llama"))
    try:
        spec = importlib.util.spec_from_file_location("tiny_ref", package / "llama" / "tiny.py")
        tiny = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiny)
        model_module = sys.modules["model"]
    finally:
        sys.path.remove(str(package / "llama"))
        sys.modules.pop("model", None)
    return model_module, model_module.make_model(tiny.TINY)


@pytest.fixture(scope="module")
def decoder(package):
    model = myelin.Instance().load(build_app(package / "app.toml", package / "llama.mln"))
    yield model
    model.close()


def test_greedy_decoding_gives_the_same_tokens_and_logits_as_torch(decoder, reference):
    module, torch_model = reference
    with decoder.session() as s:
        ids, logits = module.generate(
            lambda *a: s.call("prefill", *a), lambda *a: s.call("decode", *a), PROMPT, STEPS + 1
        )
    want_ids, want_logits = module.generate(*module.eager(torch_model), PROMPT, STEPS + 1)
    assert ids == want_ids
    assert len(logits) == STEPS + 1
    for got, want in zip(logits, want_logits, strict=True):
        assert np.abs(got - want).max() / np.abs(want).max() < LOGITS_RTOL


def test_prefill_and_decode_share_one_set_of_parameters(decoder, reference):
    _, torch_model = reference
    keys = {p["key"] for p in decoder.manifest["parameters"]}
    assert keys == {name for name, _ in torch_model.named_parameters()} | {"inv_freq"}
    entrypoints = {e["name"]: e for e in decoder.manifest["variants"][0]["entrypoints"]}
    assert set(entrypoints) == {"prefill", "decode"}
    assert entrypoints["prefill"]["inputs"][0]["shape"] == [1, None]  # dynamic prompt length
    cache = [2, 1, 2, 64, 32]  # layers, batch, kv heads, max_len, head dim
    assert [i["shape"] for i in entrypoints["decode"]["inputs"]] == [[1, 1], [1], cache, cache]
    assert [o["shape"] for o in entrypoints["decode"]["outputs"]] == [[1, 1000], cache, cache]
