"""The plex command line as a user runs it: real subprocesses, real builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.models import mlp_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def plex(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plex", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_every_verb_has_help():
    for verb in ("init", "build", "inspect", "run", "bench", "cache"):
        result = plex(verb, "--help")
        assert result.returncode == 0, result.stderr
        assert "Usage" in result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "mlp.mln"
    result = plex(
        "build", str(EXAMPLES / "mlp" / "app.toml"), "-o", str(out), "--progress", "plain"
    )
    assert result.returncode == 0, result.stderr
    assert "built" in result.stderr and out.exists()
    return out


def test_run_reads_npy_and_writes_npy(built, tmp_path, mlp_weights):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = plex(
        "run",
        str(built),
        "-f",
        "forward",
        "--input",
        f"@{tmp_path / 'x.npy'}",
        "--output",
        str(tmp_path / "y.npy"),
    )
    assert result.returncode == 0, result.stderr
    y = np.load(tmp_path / "y.npy")
    _, want = mlp_reference(mlp_weights, x)
    assert np.abs(y - want).max() / np.abs(want).max() < 1e-5


def test_run_takes_iree_style_literals(built, mlp_weights):
    result = plex("run", str(built), "-f", "hidden", "--input", "1x16xf32=0.5")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("result 0: 1x32xf32=")


def test_inspect_lists_variants_entrypoints_and_parameters(built):
    result = plex("inspect", str(built))
    assert result.returncode == 0, result.stderr
    for text in ("default", "forward", "hidden", "float32[x.0, 16]", "w1", "provenance"):
        assert text in result.stdout
    manifest = json.loads(plex("inspect", str(built), "--json").stdout)
    assert [v["name"] for v in manifest["variants"]] == ["default"]


def test_bench_reports_percentiles(built):
    result = plex("bench", str(built), "-f", "forward", "--dim", "x.0=4", "-n", "20")
    assert result.returncode == 0, result.stderr
    assert "p50 ms" in result.stdout and "calls/s" in result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_wrong_input_shape_is_one_line(built):
    line = one_line_error(plex("run", str(built), "-f", "forward", "--input", "2x15xf32=1"))
    assert "argument 'x' has size 15 in dimension 1, expected 16" in line


def test_corrupt_artifact_is_one_line(built, tmp_path):
    bad = tmp_path / "bad.mln"
    data = bytearray(built.read_bytes())
    data[-20] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert "corrupt" in one_line_error(plex("run", str(bad), "--input", "1x16xf32=1"))


def test_missing_device_names_what_the_machine_has(tmp_path):
    (tmp_path / "app.toml").write_text(
        f'[app]\nname = "gpu"\npackages = ["{EXAMPLES / "mlp"}"]\n\n'
        '[devices.gpu]\ntarget = "cuda"\n'
    )
    out = tmp_path / "gpu.mln"
    assert plex("build", str(tmp_path / "app.toml"), "-o", str(out)).returncode == 0
    line = one_line_error(plex("run", str(out), "--input", "1x16xf32=1"))
    assert "cuda" in line and "local-task" in line


@pytest.mark.parametrize(
    ("app_text", "expected"),
    [
        (
            '[app]\nname = "x"\npackages = ["PKG"]\n[build]\njobz = 2\n',
            ["app.toml:5:", "jobz", "did you mean 'jobs'"],
        ),
        ('[app]\nname = "x"\npackages = ["PKG"]\n[build]\njobs = "two"\n', ["app.toml:5:", "jobs"]),
        (
            '[app]\nname = "x"\npackages = ["PKG"]\ngraphs = ["mlp:mpl"]\n',
            ["app.toml:4:", "mlp:mpl", "did you mean"],
        ),
        ('[app]\nname = "x"\npackages = ["missing-folder"]\n', ["app.toml:3:", "missing-folder"]),
    ],
)
def test_bad_manifest_is_one_line_with_file_and_line(tmp_path, app_text, expected):
    (tmp_path / "app.toml").write_text(app_text.replace("PKG", str(EXAMPLES / "mlp")))
    line = one_line_error(plex("build", str(tmp_path / "app.toml"), "-o", str(tmp_path / "o.mln")))
    for text in expected:
        assert text in line, line
    assert not (tmp_path / "o.mln").exists()


def test_missing_graph_source_names_the_file(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "plex.toml").write_text('[package]\nname = "pkg"\n\n[graph.g]\nsource = "gone.mlir"\n')
    (tmp_path / "app.toml").write_text('[app]\nname = "x"\npackages = ["pkg"]\n')
    line = one_line_error(plex("build", str(tmp_path / "app.toml")))
    assert "plex.toml:5:" in line and "gone.mlir" in line


def test_init_scaffolds_a_package_that_builds_and_runs(tmp_path):
    assert plex("init", str(tmp_path / "demo")).returncode == 0
    out = tmp_path / "demo.mln"
    result = plex("build", str(tmp_path / "demo" / "app.toml"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    result = plex("run", str(out), "--input", "2x8xf32=1")
    assert result.returncode == 0 and result.stdout.startswith("result 0: 2x4xf32="), result
    assert plex("init", str(tmp_path / "demo")).returncode == 1  # refuses a non-empty folder
