"""A tuning package's kernel configs through plex build (no GPU: the sm_90a kernels compile
here): the kernels node builds the recorded config for its shape, says so in the report, and a
changed database rebuilds exactly the kernels node and what follows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from myelin.kernels._space import kernel_entry
from myelin.kernels._triton import MatmulConfig
from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import PlexError
from plex.manifest import load_app
from tests.plex.test_kernels_build import GRAPH, PACKAGE

APP = """
[app]
name = "kernels"
packages = [".", "tuned"]

[devices.hopper]
target = "cuda"
kernels = "triton"

[[variant]]
name = "hopper"
devices = ["hopper"]

[myelin]
tuning = "lin_tuning:hopper"
"""
TUNING = """
[package]
name = "lin_tuning"

[tuning.hopper]
target = "cuda"
kernels = "tuning.json"
"""
# the graph's one matmul: x[?, 128] @ w[64, 128]^T
SHAPE = ("matmul_transpose_b", "f16", "f16", None, 64, 128)


def _write_database(path: Path, config: MatmulConfig) -> None:
    entry = kernel_entry(*SHAPE, config, arch="sm_90a", triton="3.9.0", iree="3.13.0")
    path.write_text(json.dumps({"schema": 1, "entries": {"k": entry}}))


def _site(mln: Path) -> dict:
    with MlnReader(mln) as reader:  # read, not loaded: this machine has no sm_90a GPU
        [site] = reader.artifact_manifest.variants[0].devices[0].kernels
    return site


def _rebuilt(result) -> set[str]:
    return {i for i, r in result.results.items() if r.status == "built"}


@pytest.fixture
def app(tmp_path) -> Path:
    (tmp_path / "lin.mlir").write_text(GRAPH)
    (tmp_path / "plex.toml").write_text(PACKAGE)
    (tmp_path / "app.toml").write_text(APP)
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "plex.toml").write_text(TUNING)
    return tmp_path / "app.toml"


def test_the_build_uses_the_recorded_config_and_a_new_one_rebuilds_only_the_kernels(app, tmp_path):
    database = app.parent / "tuned" / "tuning.json"
    first = MatmulConfig("f16", "f16", True, 64, 64, 64, 4, 4, 2)
    _write_database(database, first)
    cache = tmp_path / "cache"
    built = build(app, tmp_path / "a.mln", cache_dir=cache)
    site = _site(built.output)
    assert site["kernel"] == "plex_matmul_abt_f16_f16_64x64x64_w4s2g4" == first.name
    assert site["reason"].endswith("; tuned config")

    again = build(app, tmp_path / "b.mln", cache_dir=cache)
    assert _rebuilt(again) <= {"link", "compose"}  # the same database: all cached

    second = MatmulConfig("f16", "f16", True, 64, 64, 128, 8, 4, 3)
    _write_database(database, second)
    changed = build(app, tmp_path / "c.mln", cache_dir=cache)
    rebuilt = _rebuilt(changed)
    assert "kernels:lin:lin:triton" in rebuilt and "compile:lin:lin:hopper" in rebuilt
    assert not any(node.startswith("import:") for node in rebuilt)
    assert changed.results["kernels:lin:lin:triton"].reason == "input 'tuned' changed"
    assert _site(changed.output)["kernel"] == second.name


def test_a_database_without_a_config_for_the_shape_keeps_the_librarys(app, tmp_path):
    database = app.parent / "tuned" / "tuning.json"
    entry = kernel_entry(
        "matmul",
        "f16",
        "f16",
        None,
        64,
        128,
        MatmulConfig("f16", "f16", False, 64, 64, 64, 4),
        arch="sm_90a",
        triton="3.9.0",
        iree="3.13.0",
    )  # fmt: skip  (the other layout: A x B)
    database.write_text(json.dumps({"schema": 1, "entries": {"k": entry}}))
    site = _site(build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache").output)
    assert site["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"
    assert "tuned" not in site["reason"]


def test_a_broken_database_is_one_error_naming_the_table(app, tmp_path):
    (app.parent / "tuned" / "tuning.json").write_text("{not json")
    with pytest.raises(PlexError, match=r"kernel configs of lin_tuning:hopper: .*run plex tune"):
        build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache")


def test_kernel_configs_are_for_cuda_tables_only(app):
    tuned = app.parent / "tuned"
    (tuned / "tuning.json").write_text("{}")
    (tuned / "plex.toml").write_text(TUNING.replace('target = "cuda"', 'target = "llvm-cpu"'))
    with pytest.raises(PlexError, match=r'kernel configs choose CUDA .*use target = "cuda"'):
        load_app(app)
