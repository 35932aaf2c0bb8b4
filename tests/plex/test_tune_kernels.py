"""Kernel configs as `plex tune` candidates through the split flow, without a GPU: the bundle
(one generated function per shape, candidate builds holding the drawn configs), the collect
step writing the winner into tuning.json and the package, and the app built with that package
using the winner. The timing half's results are written here as `time_bundle` writes them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from myelin.kernels._space import KERNEL_ENTRY_KIND, violations
from myelin.mln import MlnReader
from plex.builder import build
from plex.tune._kernels import (
    BUNDLE_KIND,
    DYNAMIC_M,
    Shape,
    collect_kernel_results,
    make_kernel_bundle,
    shapes_of,
)
from tests.plex.test_kernels_build import GRAPH, PACKAGE

APP = """
[app]
name = "kernels"
packages = ["."]

[devices.hopper]
target = "cuda"
kernels = "triton"

[[variant]]
name = "hopper"
devices = ["hopper"]
"""


def _kernel_sites(mln: Path) -> list[dict]:
    with MlnReader(mln) as reader:  # read, not loaded: this machine has no sm_90a GPU
        return list(reader.artifact_manifest.variants[0].devices[0].kernels)


def test_shapes_are_the_distinct_kernel_sites():
    site = {"op": "matmul", "dtype": "f16", "out_dtype": "f16", "m": 8, "n": 64, "k": 128}
    sites = [
        {**site, "kernel": "plex_matmul_ab_f16_f16_16x32x256_w4s4"},
        {**site, "kernel": "plex_matmul_ab_f16_f16_16x32x256_w4s4"},  # the same shape again
        {**site, "k": 100, "kernel": None},  # stayed IREE codegen
        {**site, "m": None, "kernel": "plex_matmul_tma_ab_f16_f16_128x256x64_w8s3"},
    ]
    assert shapes_of(sites) == [
        Shape("matmul", "f16", "f16", 8, 64, 128),
        Shape("matmul", "f16", "f16", None, 64, 128),
    ]


def test_bundle_collect_and_build_with_the_winner(tmp_path):
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "lin.mlir").write_text(GRAPH)
    (app_dir / "plex.toml").write_text(PACKAGE)
    (app_dir / "app.toml").write_text(APP)
    cache, out, bundle = tmp_path / "cache", tmp_path / "tuned", tmp_path / "bundle"
    lines: list[str] = []
    make_kernel_bundle(
        app_dir / "app.toml", "hopper", out, bundle, trials=2, cache_dir=cache, log=lines.append
    )
    state = json.loads((bundle / "bundle.json").read_text())
    assert state["kind"] == BUNDLE_KIND and state["resident"] is True
    [case] = state["cases"]
    # the app's M is dynamic: the shape is timed at DYNAMIC_M, recorded as dynamic
    assert case["shape"]["m"] is None and case["inputs"][0]["shape"] == [DYNAMIC_M, 128]
    assert case["inputs"][1]["shape"] == [64, 128]  # the weight as the app stores it: N x K
    assert [c["file"] for c in case["candidates"]] == ["c000.mln", "c001.mln"]
    for cand, built in zip(case["candidates"], ("c000.mln", "c001.mln"), strict=True):
        [site] = _kernel_sites(bundle / built)
        assert site["kernel"] == cand["config"] and site["reason"].endswith("tuned config")
    [site] = _kernel_sites(bundle / "reference.mln")
    assert site["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"

    # what time_bundle writes: the second candidate ran right and faster, the first did not
    first, second = case["candidates"]
    results = {
        "references": {case["dispatch"]: {"median_s": 1e-3, "spread": 0.01, "rounds": 5}},
        "candidates": {
            first["name"]: {"status": "mismatch"},
            second["name"]: {"status": "ok", "median_s": 8e-4, "spread": 0.02, "relative": 0.8},
        },
        "bundle": state,
    }
    collect_kernel_results(results, "hopper", out, log=lines.append)
    entries = json.loads((out / "tuning.json").read_text())["entries"]
    [entry] = entries.values()
    assert entry["kind"] == KERNEL_ENTRY_KIND and entry["kept"] is True
    assert (entry["op"], entry["m"], entry["n"], entry["k"]) == (
        "matmul_transpose_b",
        None,
        64,
        128,
    )
    assert entry["config"] == second["choice"] and entry["relative"] == 0.8
    assert entry["arch"] == "sm_90a" and entry["triton"] and entry["iree"]
    assert [t["status"] for t in entry["trials"]] == ["mismatch", "ok"]
    package = tomllib.loads((out / "plex.toml").read_text())
    assert package["tuning"]["hopper"] == {"target": "cuda", "kernels": "tuning.json"}

    # the app selecting the package builds the winner
    text = APP.replace('packages = ["."]', f'packages = [".", "{out}"]')
    name = package["package"]["name"]
    (app_dir / "app.toml").write_text(text + f'\n[myelin]\ntuning = "{name}:hopper"\n')
    [site] = _kernel_sites(build(app_dir / "app.toml", tmp_path / "t.mln", cache_dir=cache).output)
    assert site["kernel"] == second["config"]
    assert not violations(_config_of(entry), None, 64, 128)


def _config_of(entry: dict):
    from myelin.kernels._space import config_from_json

    return config_from_json(entry["config"], "f16", "f16", True)


def _state(candidates: list[dict]) -> dict:
    default = {"block_m": 16, "block_n": 32, "block_k": 256, "group_m": 1}
    default |= {"num_warps": 4, "num_stages": 4}
    shape = {"op": "matmul_transpose_b", "dtype": "f16", "out_dtype": "f16"}
    shape |= {"m": 8, "n": 4096, "k": 4096}
    return {
        "kind": BUNDLE_KIND, "app": "block-bench", "device": "hopper", "arch": "sm_90a",
        "iree": "3.13.0", "triton": "3.9.0",
        "cases": [{"dispatch": "d", "shape": shape, "default": default, "candidates": candidates}],
    }  # fmt: skip


def _candidate(name: str, block_n: int) -> dict:
    choice = {"block_m": 16, "block_n": block_n, "block_k": 256, "group_m": 1}
    choice |= {"num_warps": 4, "num_stages": 3}
    return {"name": name, "config": f"k{block_n}", "choice": choice}


def test_kernel_times_rank_the_trials_when_the_timing_half_measured_them(tmp_path):
    """On the H200 a decode projection's kernel is 0.01 ms of a 0.4 ms call: the wall-time
    winner (b) is noise; the kernel-time winner (a) is kept."""
    state = _state([_candidate("a", 64), _candidate("b", 128)])
    results = {
        "references": {"d": {"median_s": 4e-4, "spread": 0.4, "kernel_s": 1.0e-5}},
        "candidates": {
            "a": {"status": "ok", "relative": 1.05, "kernel_relative": 0.90},
            "b": {"status": "ok", "relative": 0.85, "kernel_relative": 1.60},
        },
        "bundle": state,
    }
    collect_kernel_results(results, "hopper", tmp_path, log=lambda _: None)
    [entry] = json.loads((tmp_path / "tuning.json").read_text())["entries"].values()
    assert entry["ranked_by"] == "kernel_relative" and entry["config"]["block_n"] == 64

    # a gain below MIN_GAIN is noise: the library's config stays
    results["candidates"]["a"]["kernel_relative"] = 0.99
    collect_kernel_results(results, "hopper", tmp_path, log=lambda _: None)
    [entry] = json.loads((tmp_path / "tuning.json").read_text())["entries"].values()
    assert entry["kept"] is False and entry["config"]["block_n"] == 32
