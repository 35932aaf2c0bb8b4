"""scheduling.favor reaches IREE's Stream partitioning: on a wide model (4 independent matmul
chains) the three settings give different Stream IR (concurrent regions, transient size), the
runtime peak measured by iree-profile follows, and every setting computes the same result."""

from __future__ import annotations

import numpy as np
import pytest

import myelin
from myelin.compiler.options import variant_flags
from myelin.compiler.pipeline import import_graph
from myelin.compiler.stream_analysis import stream_footprints
from myelin.compiler.targets import TargetDevice
from myelin.mln import MlnReader
from myelin.runtime.profiling import capture
from tests.conftest import build_app
from tests.myelin.runtime_policies_models import WIDE_N, wide_reference, write_wide_app

FAVORS = ("min-memory", "max-concurrency", "debug")
X = np.random.default_rng(0).standard_normal((WIDE_N, WIDE_N)).astype(np.float32) / 16
W = np.random.default_rng(1).standard_normal((WIDE_N, WIDE_N)).astype(np.float32) / 16


@pytest.fixture(scope="module")
def wide_mlns(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("wide")
    return {f: build_app(write_wide_app(root / f, f), root / f"{f}.mln") for f in FAVORS}


@pytest.fixture(scope="module")
def stream_ir(tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """Each setting's Stream IR and plans, compiled the way `plex build` compiles."""
    folder = tmp_path_factory.mktemp("wide-ir")
    write_wide_app(folder, "min-memory")
    imported = import_graph(
        folder / "wide.mlir", input_type="auto", module_name="wide", scope="wide.wide"
    )
    flags = variant_flags([TargetDevice("cpu")])
    return {
        f: stream_footprints(imported.module_bytecode, phase=imported.phase, flags=flags, favor=f)
        for f in FAVORS
    }


def test_the_settings_produce_different_stream_ir(stream_ir):
    texts = {f: text for f, (_, text) in stream_ir.items()}
    assert len(set(texts.values())) == 3
    assert texts["max-concurrency"].count("stream.cmd.concurrent") >= 3
    assert texts["debug"].count("stream.cmd.concurrent") == 0
    plans = {f: plans["forward"] for f, (plans, _) in stream_ir.items()}
    for f, p in plans.items():
        print(
            f"{f:16s} concurrent regions {list(p.concurrent)}, transient {p.transient} B, "
            f"results {p.results} B, {p.dispatches} dispatches"
        )
    assert plans["debug"].concurrent == ()
    assert max(plans["max-concurrency"].concurrent) > max(plans["min-memory"].concurrent)
    # more work in flight needs more transient memory at once
    assert plans["max-concurrency"].transient > plans["min-memory"].transient
    assert plans["debug"].transient <= plans["min-memory"].transient


def test_each_artifact_records_its_favor_and_schedule(wide_mlns, stream_ir):
    for favor, path in wide_mlns.items():
        with MlnReader(path) as r:
            assert r.manifest["policies"]["favor"] == favor
            (entry,) = r.manifest["variants"][0]["entrypoints"]
        plan = stream_ir[favor][0]["forward"]
        assert entry["memory"]["schedule"]["concurrent"] == list(plan.concurrent)
        assert entry["memory"]["transient"] == plan.transient


def test_every_setting_computes_the_same_result(wide_mlns):
    want = wide_reference(X, W)
    outputs = {}
    for favor, path in wide_mlns.items():
        with myelin.Instance().load(path).session() as s:
            outputs[favor] = s.call("forward", X, W)
        assert np.abs(outputs[favor] - want).max() / np.abs(want).max() < 1e-5
    assert np.array_equal(outputs["min-memory"], outputs["debug"])


def test_measured_peak_memory_follows_the_setting(wide_mlns, stream_ir, tmp_path):
    """iree-profile's pool high water per setting equals the plan's transient + result bytes."""
    peaks = {}
    for favor, path in wide_mlns.items():
        peaks[favor] = capture(path, "forward", [X, W], tmp_path / favor).memory_high_water
        plan = stream_ir[favor][0]["forward"]
        print(f"{favor:16s} measured peak {peaks[favor]:,} B")
        assert peaks[favor] == plan.transient + plan.results
    assert peaks["max-concurrency"] > peaks["min-memory"] >= peaks["debug"]
