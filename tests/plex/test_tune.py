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


def untiled_mlp(folder):
    """examples/mlp, which pins data tiling off: plex tune searches tile configs, which IREE's
    packed (data-tiled) matmuls do not take, and an AVX-512 host would choose data tiling."""
    app = copy_example("mlp", folder)
    assert "data_tiling = false" in app.read_text()
    return app


def test_a_data_tiled_device_has_nothing_to_tune_and_is_told_why(tmp_path):
    """Under data tiling every matmul is IREE's packed microkernel, which takes no tile config:
    the run stops after the reference build with why, and what pinning it off would cost."""
    from plex.tune import TuneError

    app = copy_example("mlp", tmp_path / "mlp")
    app.write_text(app.read_text().replace("data_tiling = false", "data_tiling = true"))
    with pytest.raises(TuneError) as raised:
        tune(app, "cpu", tmp_path / "tuned", trials=1, dims=["*=8"], log=lambda line: None)
    message = str(raised.value)
    assert "no contraction dispatch to tune on device 'cpu'" in message
    assert "data tiling is on (pinned in the app)" in message
    assert "mmt4d microkernels" in message and "[devices.cpu]" in message
    assert not (tmp_path / "tuned" / "plex.toml").exists()


def forward(path):
    with myelin.Instance().load(path) as model, model.session() as session:
        return session.call("forward", X)


def test_bounded_tune_writes_a_package_that_builds_the_same_outputs_and_is_reused(tmp_path):
    app = untiled_mlp(tmp_path / "mlp")
    out, cache = tmp_path / "tuned", tmp_path / "cache"
    # required_gain -1: any tuned build applies (this test is about what an applied package
    # does; the decision itself is test_no_headroom_applies_nothing_and_says_why)
    kwargs = dict(
        trials=2, batch=2, max_dispatches=1, rounds=2, dims=["*=32"], cache_dir=cache,
        required_gain=-1.0,
    )  # fmt: skip
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
    build(untiled_mlp(tmp_path / "plain"), tmp_path / "plain.mln", cache_dir=cache)
    np.testing.assert_allclose(
        forward(tmp_path / "tuned.mln"), forward(tmp_path / "plain.mln"), rtol=1e-5, atol=1e-6
    )

    # A second run finds the tuned dispatch in tuning.json and searches it no more. It ranks
    # both of the MLP's matmuls: which one the first run found hottest is timing, so the
    # second run must cover both to be sure to meet it again.
    lines: list[str] = []
    again_kwargs = {**kwargs, "max_dispatches": 2}
    again = tune(untiled_mlp(tmp_path / "mlp2"), "cpu", out, log=lines.append, **again_kwargs)
    [tuned] = [d for d in again.dispatches if d.key in database["entries"]]
    assert tuned.reused
    assert len(tuned.trials) == len(entry["trials"])
    assert any(f"{tuned.dispatch}: reusing tuning.json" in line for line in lines)


def test_at_batch_one_the_weight_layout_is_searched_and_the_package_builds_the_same(tmp_path):
    """examples/mlp at batch 1 is a chain of GEMVs: its weights' other stored layout is one
    candidate each, timed against the default; a kept layout goes into the package."""
    app = untiled_mlp(tmp_path / "mlp")
    out, cache = tmp_path / "tuned", tmp_path / "cache"
    kwargs = dict(
        trials=1, batch=1, max_dispatches=2, rounds=2, dims=["*=1"], cache_dir=cache,
        required_gain=-1.0,  # applied whatever it measures: the package's contents are tested
    )  # fmt: skip
    result = tune(app, "cpu", out, log=lambda line: None, **kwargs)

    tried = {(t.keys, t.layout) for t in result.layouts}
    assert (("mlp::w1",), "nk") in tried and (("mlp::w2",), "nk") in tried  # both stored K x N
    assert all(t.status == "ok" and t.relative > 0 for t in result.layouts)
    assert result.outputs_equal
    package = tomllib.loads((out / "plex.toml").read_text())
    kept = {k: "nk" for t in result.layouts if t.kept for k in t.keys}
    assert package["tuning"]["cpu"].get("layouts", {}) == kept
    database = json.loads((out / "tuning.json").read_text())
    assert sum(e.get("kind") == "weight-layout" for e in database["entries"].values()) == 2
    assert "| weight layout tried |" in (out / "summary.md").read_text()

    # the package's build (spec and kept layouts) computes what the untuned build computes
    name = package["package"]["name"]
    text = app.read_text().replace('packages = ["."]', f'packages = [".", "{out}"]')
    app.write_text(text + f'\n[myelin]\ntuning = "{name}:cpu"\n')
    build(app, tmp_path / "tuned.mln", cache_dir=cache)
    build(untiled_mlp(tmp_path / "plain"), tmp_path / "plain.mln", cache_dir=cache)
    x = X[:1]
    with myelin.Instance().load(tmp_path / "tuned.mln") as m, m.session() as s:
        tuned = np.asarray(s.call("forward", x))
    with myelin.Instance().load(tmp_path / "plain.mln") as m, m.session() as s:
        plain = np.asarray(s.call("forward", x))
    np.testing.assert_allclose(tuned, plain, rtol=1e-5, atol=1e-6)


def test_a_kept_layout_is_built_into_the_tile_search_and_the_package(tmp_path, monkeypatch):
    """With every layout kept (the threshold raised: this machine's timing noise must not
    decide which path is tested), the tile search runs on the re-laid-out build, whose
    dispatches read the stored layout, and the package records the layouts."""
    from plex.tune import _layouts

    monkeypatch.setattr(_layouts, "KEEP_BELOW", 1e9)
    app = untiled_mlp(tmp_path / "mlp")
    out, cache = tmp_path / "tuned", tmp_path / "cache"
    kwargs = dict(
        trials=1, batch=1, max_dispatches=2, rounds=2, dims=["*=1"], cache_dir=cache,
        required_gain=-1.0,  # applied whatever it measures: the package's contents are tested
    )  # fmt: skip
    result = tune(app, "cpu", out, log=lambda line: None, **kwargs)
    assert {k for t in result.layouts if t.kept for k in t.keys} == {"mlp::w1", "mlp::w2"}
    package = tomllib.loads((out / "plex.toml").read_text())
    assert package["tuning"]["cpu"]["layouts"] == {"mlp::w1": "nk", "mlp::w2": "nk"}
    # the spec was written against the re-laid-out matmul: B read N x K, (d1, d2)
    assert "affine_map<(d0, d1, d2) -> (d1, d2)>" in (out / "cpu.mlir").read_text()
    assert result.outputs_equal
    name = package["package"]["name"]
    text = app.read_text().replace('packages = ["."]', f'packages = [".", "{out}"]')
    app.write_text(text + f'\n[myelin]\ntuning = "{name}:cpu"\n')
    build(app, tmp_path / "tuned.mln", cache_dir=cache)
    with myelin.Instance().load(tmp_path / "tuned.mln") as m, m.session() as s:
        tuned = np.asarray(s.call("forward", X[:1]))
    build(untiled_mlp(tmp_path / "plain"), tmp_path / "plain.mln", cache_dir=cache)
    with myelin.Instance().load(tmp_path / "plain.mln") as m, m.session() as s:
        np.testing.assert_allclose(
            tuned, np.asarray(s.call("forward", X[:1])), rtol=1e-5, atol=1e-6
        )


def test_no_headroom_applies_nothing_and_says_why(tmp_path):
    """The decision on real measurements: the untuned build is timed on both sides of the tuned
    one; with a gain no build can show (10x), the package applies nothing (no [tuning] table,
    no spec) and the summary says why; with the measured noise as the bar, the decision is the
    one the measured numbers give."""
    from plex.tune._headroom import Headroom

    app = untiled_mlp(tmp_path / "mlp")
    out, cache = tmp_path / "tuned", tmp_path / "cache"
    kwargs = dict(trials=1, batch=1, max_dispatches=1, rounds=3, dims=["*=32"], cache_dir=cache)
    lines: list[str] = []
    result = tune(app, "cpu", out, log=lines.append, required_gain=9.0, **kwargs)

    h = result.headroom
    before, after = h.untuned
    assert before.median_s > 0 and after.median_s > 0 and h.tuned.median_s > 0
    assert h.noise == pytest.approx(abs(before.median_s - after.median_s) / h.untuned_s)
    assert not result.applied and h.threshold == 9.0
    package = tomllib.loads((out / "plex.toml").read_text())
    assert "tuning" not in package and not (out / "cpu.mlir").exists()
    summary = (out / "summary.md").read_text()
    assert "applies nothing: no headroom" in summary and "nothing to select" in summary
    assert any("applies nothing: no headroom" in line for line in lines)
    # an app selecting it is told there is no such table
    name = package["package"]["name"]
    text = app.read_text().replace('packages = ["."]', f'packages = [".", "{out}"]')
    app.write_text(text + f'\n[myelin]\ntuning = "{name}:cpu"\n')
    with pytest.raises(Exception, match="cpu"):
        load_app(app)

    # the default bar is the measured noise: the same rule, on the same kind of numbers
    again = tune(untiled_mlp(tmp_path / "mlp2"), "cpu", tmp_path / "t2", log=lines.append, **kwargs)
    g = again.headroom
    assert g.required is None and g.threshold == g.noise
    assert again.applied == (g.outputs_equal and g.speedup - 1 > g.noise)
    assert ("tuning" in tomllib.loads((tmp_path / "t2" / "plex.toml").read_text())) == again.applied
    # and the rule itself, on numbers this machine measured: a tuned time just beyond the noise
    # applies, one within it does not
    faster = type(h.tuned)(g.untuned_s / (1 + g.noise) * 0.99, 0.0, 1)
    slower = type(h.tuned)(g.untuned_s / (1 + g.noise) * 1.01, 0.0, 1)
    assert Headroom(g.untuned, faster, True).applies
    assert not Headroom(g.untuned, slower, True).applies
    assert not Headroom(g.untuned, faster, False).applies  # other outputs: never


def test_the_blas_backend_is_one_more_candidate(tmp_path):
    """--backend: every matmul on the BLAS backend (OpenBLAS sgemm), one candidate checked
    against the reference's outputs and timed; reported and recorded, not put in the package."""
    pytest.importorskip("scipy_openblas32", reason="the BLAS backend needs pip install '.[blas]'")
    from pathlib import Path

    blas = Path(__file__).resolve().parents[2] / "examples" / "backends" / "blas"
    app = untiled_mlp(tmp_path / "mlp")
    out = tmp_path / "tuned"
    kwargs = dict(trials=1, batch=1, max_dispatches=1, rounds=2, dims=["*=32"])
    result = tune(
        app, "cpu", out, log=lambda line: None, cache_dir=tmp_path / "cache", backend=blas, **kwargs
    )
    assert result.backend.backend == "blas:blas"
    assert result.backend.status == "ok" and result.backend.relative > 0  # outputs equal
    summary = (out / "summary.md").read_text()
    assert "backend blas:blas, every matmul, attention, gelu on it:" in summary
    database = json.loads((out / "tuning.json").read_text())
    assert [e["status"] for e in database["entries"].values() if e.get("kind") == "backend"] == [
        "ok"
    ]
    assert "blas" not in (out / "plex.toml").read_text()  # placement is the app's decision
