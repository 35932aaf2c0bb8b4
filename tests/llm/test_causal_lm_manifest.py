"""The manifest side of a causal-lm graph: the source is a model folder, whose files key the
build, and max_seq / max_batch / dtype belong to causal-lm graphs only. No build, no torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from plex.errors import ManifestError
from plex.manifest import load_package

GRAPH = """
[package]
name = "lm"

[graph.lm]
source = "model"
frontend = "{frontend}"
max_seq = 64
"""


def package(tmp_path: Path, frontend: str = "causal-lm") -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights v1")
    (tmp_path / "plex.toml").write_text(GRAPH.format(frontend=frontend))
    return tmp_path


def test_a_model_folder_is_the_source_and_all_its_files_key_the_package(tmp_path):
    folder = package(tmp_path)
    manifest = load_package(folder)
    graph = manifest.graphs["lm"]
    assert graph.source == (folder / "model" / "config.json").resolve()
    assert (graph.frontend, graph.max_seq, graph.max_batch) == ("causal-lm", 64, None)
    before = manifest.spec.fingerprint
    (folder / "model" / "model.safetensors").write_bytes(b"weights v2")
    assert load_package(folder).spec.fingerprint != before


def test_max_seq_on_another_frontend_is_refused_with_the_fix(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    (tmp_path / "plex.toml").write_text(
        GRAPH.format(frontend="onnx").replace('"model"', '"model.onnx"')
    )
    with pytest.raises(ManifestError, match=r"max_seq sizes a causal-lm graph") as raised:
        load_package(tmp_path)
    assert 'set frontend = "causal-lm" or remove it' in str(raised.value)


def test_a_causal_lm_source_must_be_a_folder(tmp_path):
    folder = package(tmp_path)
    (folder / "plex.toml").write_text(
        GRAPH.format(frontend="causal-lm").replace('"model"', '"model/config.json"')
    )
    with pytest.raises(ManifestError, match="is not a folder"):
        load_package(folder)


def test_dtype_is_read_and_only_float_dtypes_are_accepted(tmp_path):
    folder = package(tmp_path)
    text = (folder / "plex.toml").read_text()
    (folder / "plex.toml").write_text(text + 'dtype = "float16"\n')
    assert load_package(folder).graphs["lm"].dtype == "float16"
    (folder / "plex.toml").write_text(text + 'dtype = "int8"\n')
    with pytest.raises(ManifestError, match="dtype"):
        load_package(folder)


def test_dtype_on_another_frontend_is_refused_with_the_fix(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    text = GRAPH.format(frontend="onnx").replace('"model"', '"model.onnx"')
    (tmp_path / "plex.toml").write_text(text.replace("max_seq = 64", 'dtype = "float16"'))
    with pytest.raises(ManifestError, match=r"dtype sets a causal-lm graph") as raised:
        load_package(tmp_path)
    assert 'set frontend = "causal-lm" or remove it' in str(raised.value)


def test_prefill_lengths_are_read_sorted_and_checked_against_max_seq(tmp_path):
    folder = package(tmp_path)
    text = (folder / "plex.toml").read_text()
    (folder / "plex.toml").write_text(text + "prefill_lengths = [32, 16]\n")
    assert load_package(folder).graphs["lm"].prefill_lengths == (16, 32)
    (folder / "plex.toml").write_text(text + "prefill_lengths = [16, 128]\n")
    with pytest.raises(ManifestError, match=r"128 is longer than max_seq \(64\)"):
        load_package(folder)
    (folder / "plex.toml").write_text(text + "prefill_lengths = [16, 16]\n")
    with pytest.raises(ManifestError, match="listed twice"):
        load_package(folder)


def test_prefill_lengths_on_another_frontend_are_refused_with_the_fix(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    text = GRAPH.format(frontend="onnx").replace('"model"', '"model.onnx"')
    (tmp_path / "plex.toml").write_text(text.replace("max_seq = 64", "prefill_lengths = [16]"))
    with pytest.raises(ManifestError, match=r"prefill_lengths adds a causal-lm graph") as raised:
        load_package(tmp_path)
    assert 'set frontend = "causal-lm" or remove it' in str(raised.value)
