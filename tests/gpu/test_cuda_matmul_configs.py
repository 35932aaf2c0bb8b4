"""The matmul kernel configs and the tuned GEMV configs through IREE on the GPU, against torch.

Builds (here, on the build machine): `python benchmarks/gpu/matmul_configs.py -o ART` (one
`mm_<config>.mln` per 8192^3 candidate, `mm_configs.json` listing them), `plex build
benchmarks/gpu/tunekern_tuned/app.toml -o ART/tunekern_tuned.mln` and `python
benchmarks/gpu/gemv_configs.py -o ART` (one `gemv_<config>.mln` per GEMV candidate). Each
config's `matmul` (dynamic M; run at M = 1000, a partial last row block), the tuned GEMVs and
every GEMV candidate in both stored layouts, against torch's float32 product of the same float16 inputs. Tolerance: error norm at
most 1e-3 of the reference's (f32 accumulation, a float16 result: cuBLAS's is 2.1e-4 at 8192^3).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpu_helpers import artifact

pytestmark = pytest.mark.gpu
TOLERANCE = 1e-3
CONFIGS_BUILD = "python benchmarks/gpu/matmul_configs.py -o ART"
GEMV_BUILD = "plex build benchmarks/gpu/tunekern_tuned/app.toml -o ART/tunekern_tuned.mln"
GEMV_CONFIGS_BUILD = "python benchmarks/gpu/gemv_configs.py -o ART"


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float32)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _configs(artifacts) -> list[dict]:
    listing = artifact(artifacts, "mm_configs.json", CONFIGS_BUILD)
    return json.loads(listing.read_text())


def test_matmul_configs_match_fp32(artifacts):
    import myelin

    rng = np.random.default_rng(0)
    a = (rng.standard_normal((1000, 8192)) * 0.05).astype(np.float16)
    b = (rng.standard_normal((8192, 8192)) * 0.05).astype(np.float16)
    want = a.astype(np.float32) @ b.astype(np.float32)
    instance = myelin.Instance()
    for c in _configs(artifacts):
        model = instance.load(artifact(artifacts, c["mln"], CONFIGS_BUILD))
        assert model.variant_name == "hopper", c["name"]
        with model.session() as s:
            error = _relative(s.call("matmul", a, b), want)
        assert error <= TOLERANCE, f"{c['name']}: relative error {error:.2e}"


@pytest.mark.parametrize("name", ["gemv_nk", "gemv_kn"])
def test_tuned_gemv_matches_fp32(artifacts, name):
    import myelin

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((1, 8192)) * 0.1).astype(np.float16)
    w = (rng.standard_normal((28672, 8192)) * 0.1).astype(np.float16)
    weight = w if name == "gemv_nk" else np.ascontiguousarray(w.T)
    want = x.astype(np.float32) @ w.astype(np.float32).T
    model = myelin.Instance().load(artifact(artifacts, "tunekern_tuned.mln", GEMV_BUILD))
    with model.session() as s:
        error = _relative(s.call(name, x, weight), want)
    assert error <= TOLERANCE, f"{name}: relative error {error:.2e}"


def test_gemv_configs_match_fp32(artifacts):
    """Every GEMV candidate of gemv_configs.py (tl.dot, persistent TMA over 448 / 896 column
    tiles, the CUDA-core block_m = 1 kernel), both layouts."""
    import myelin

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 8192)) * 0.1).astype(np.float16)
    w = (rng.standard_normal((28672, 8192)) * 0.1).astype(np.float16)
    w_kn = np.ascontiguousarray(w.T)
    want = x.astype(np.float32) @ w.astype(np.float32).T
    listing = artifact(artifacts, "gemv_configs.json", GEMV_CONFIGS_BUILD)
    instance = myelin.Instance()
    for c in json.loads(listing.read_text()):
        model = instance.load(artifact(artifacts, c["mln"], GEMV_CONFIGS_BUILD))
        with model.session() as s:
            for name, weight in (("gemv_nk", w), ("gemv_kn", w_kn)):
                error = _relative(s.call(name, x, weight), want)
                assert error <= TOLERANCE, f"{c['name']} {name}: relative error {error:.2e}"
