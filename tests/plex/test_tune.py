"""`plex tune` on examples/mlp, bounded (a few trials, one dispatch): it writes a tuning package
that builds, computes what the untuned build computes, and a second run reuses its database.
Real compiles, real timing on this CPU."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

import myelin
from plex.builder import build
from plex.manifest import load_app
from plex.tune import tune
from tests.plex.build_helpers import copy_example

pytest.importorskip("nevergrad")
pytest.importorskip("matplotlib")

X = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)


def forward(path):
    with myelin.Instance().load(path) as model, model.session() as session:
        return session.call("forward", X)


def test_bounded_tune_writes_a_package_that_builds_the_same_outputs_and_is_reused(tmp_path):
    app = copy_example("mlp", tmp_path / "mlp")
    out, cache = tmp_path / "tuned", tmp_path / "cache"
    kwargs = dict(trials=2, batch=2, max_dispatches=1, rounds=2, dims=["*=32"], cache_dir=cache)
    result = tune(app, "cpu", out, log=lambda line: None, **kwargs)

    package = tomllib.loads((out / "plex.toml").read_text())
    name = package["package"]["name"]
    assert package["tuning"]["cpu"] == {"path": "cpu.mlir", "target": "llvm-cpu"}
    assert "transform.iree.match.contraction" in (out / "cpu.mlir").read_text()
    assert (out / "tuning.png").read_bytes()[:4] == b"\x89PNG"
    assert "| dispatch |" in (out / "summary.md").read_text()
    database = json.loads((out / "tuning.json").read_text())
    [entry] = database["entries"].values()
    assert entry["iree"] == "3.13.0" and entry["target"].startswith("llvm-cpu:")
    assert sum(t["status"] == "ok" for t in entry["trials"]) >= 1
    assert result.outputs_equal

    # The app selects the package; its build computes what the untuned build computes.
    text = app.read_text().replace('packages = ["."]', f'packages = [".", "{out}"]')
    app.write_text(text + f'\n[myelin]\ntuning = "{name}:cpu"\n')
    assert [s.ref for s in load_app(app).tuning] == [f"{name}:cpu"]
    build(app, tmp_path / "tuned.mln", cache_dir=cache)
    build(copy_example("mlp", tmp_path / "plain"), tmp_path / "plain.mln", cache_dir=cache)
    np.testing.assert_allclose(forward(tmp_path / "tuned.mln"), forward(tmp_path / "plain.mln"), rtol=1e-5, atol=1e-6)

    # A second run finds the dispatch in tuning.json and searches nothing.
    lines: list[str] = []
    again = tune(copy_example("mlp", tmp_path / "mlp2"), "cpu", out, log=lines.append, **kwargs)
    assert again.dispatches[0].reused
    assert len(again.dispatches[0].trials) == len(entry["trials"])
    assert any("reusing tuning.json" in line for line in lines)
