"""Profiling through IREE's own tools: `plex profile` captures one call, prints the hottest
dispatches, writes a new capture file every time and a Chrome trace-event trace.json, which we
read back and check event by event. A driver that cannot record what was asked fails loudly."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import myelin
from myelin.errors import ProfilingUnavailable
from myelin.runtime.profiling import chrome_trace, output_path, tool
from plex.cli import app as cli
from tests.conftest import EXAMPLES, build_app

# Chrome trace-event format: fields every event of each phase must carry.
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "M": {"name", "ph", "pid", "args"},
}


def read_trace(path: Path) -> list[dict]:
    """Parse trace.json the way trace viewers do and check every event's shape."""
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    for e in events:
        missing = REQUIRED[e["ph"]] - set(e)
        assert not missing, f"{e} lacks {missing}"
        if e["ph"] in ("X", "i", "C"):
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    return events


@pytest.fixture(scope="module")
def profiled_mlp(tmp_path_factory):
    """The example MLP with `[runtime.profile] output = "captures/run-{capture}.ireeprof"`."""
    root = tmp_path_factory.mktemp("mlp-profile")
    shutil.copytree(EXAMPLES / "mlp", root / "mlp", ignore=shutil.ignore_patterns("*.mln"))
    app = root / "mlp" / "app.toml"
    app.write_text(
        app.read_text() + '\n[runtime.profile]\noutput = "captures/run-{capture}.ireeprof"\n'
    )
    return build_app(app, root / "mlp.mln")


def test_plex_profile_summarizes_and_exports_a_trace(mlp_mln, tmp_path):
    out = tmp_path / "prof"
    result = CliRunner().invoke(
        cli,
        ["profile", str(mlp_mln), "-f", "forward", "--dim", "*=64", "-o", str(out)],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    assert "hottest dispatches" in result.output
    assert "hidden_dispatch_0_matmul" in result.output  # the hottest dispatch of the MLP
    assert "forward_dispatch_1_matmul" in result.output
    (capture,) = out.glob("capture-*.ireeprof")
    events = read_trace(out / "trace.json")
    dispatches = [e for e in events if e["ph"] == "X" and "_dispatch_" in e["name"]]
    assert {e["name"].split("_dispatch")[0] for e in dispatches} == {"hidden", "forward"}
    assert any(e["ph"] == "C" and e["name"] == "pool bytes reserved" for e in events)
    # the bundle itself is valid for IREE's reader
    done = subprocess.run(
        [str(tool("iree-profile")), "summary", str(capture)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_capture_gets_its_own_file(profiled_mlp, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((8, 16), np.float32))
    for _ in range(2):
        result = CliRunner().invoke(
            cli,
            [
                "profile",
                str(profiled_mlp),
                "-f",
                "hidden",
                "--input",
                f"@{x}",
                "-o",
                str(tmp_path / "p"),
            ],
        )
        assert result.exit_code == 0, result.output
    captures = sorted((tmp_path / "p" / "captures").glob("run-*.ireeprof"))
    assert len(captures) == 2  # the [runtime.profile] template, with unique {capture} ids
    read_trace(tmp_path / "p" / "trace.json")


def test_device_timing_on_a_cpu_driver_fails_loudly(mlp_mln, tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            "profile",
            str(mlp_mln),
            "-f",
            "forward",
            "--input",
            "2x16xf32=1",
            "-o",
            str(tmp_path),
            "--device-timing",
        ],
    )
    assert result.exit_code == 1
    assert (
        "error: device_timing: driver 'local-task' runs on the host and records no device "
        "timestamps" in result.output
    )
    assert not list(tmp_path.glob("*.ireeprof"))


def test_in_process_sessions_cannot_profile(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    with pytest.raises(ProfilingUnavailable, match="plex profile"):
        model.session(profile=True)


def test_output_paths_are_unique_even_without_a_capture_placeholder(tmp_path):
    folder = tmp_path.resolve()
    assert output_path("a/{capture}.ireeprof", tmp_path, "id1") == folder / "a/id1.ireeprof"
    assert output_path("run.ireeprof", tmp_path, "id2") == folder / "run-id2.ireeprof"


def test_chrome_trace_of_hand_made_records():
    records = [
        {
            "record_type": "host_execution_event",
            "physical_device_ordinal": 0,
            "queue_ordinal": 0,
            "key": "d0",
            "op": "dispatch",
            "start_host_time_ns": 2_000,
            "end_host_time_ns": 5_000,
        },
        {
            "record_type": "queue_event",
            "physical_device_ordinal": 0,
            "queue_ordinal": 0,
            "op": "execute",
            "host_time_ns": 1_000,
        },
    ]
    events = chrome_trace(records)["traceEvents"]
    (span,) = [e for e in events if e["ph"] == "X"]
    assert (span["name"], span["ts"], span["dur"]) == ("d0", 1.0, 3.0)
    assert [e["ts"] for e in events if e["ph"] == "i"] == [0.0]
