"""What a new user meets on the command line: each message says what happened and what to do,
in one line, and each verb does exactly what it says. Every test runs the installed `plex`
entry point in a subprocess, as a user would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def plex(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plex", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
        timeout=600,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_run_refuses_an_output_name_it_would_not_write(mlp_mln, tmp_path):
    line = one_line_error(
        plex("run", str(mlp_mln), "--input", "1x16xf32=1", "-o", str(tmp_path / "a.txt"))
    )
    assert "results are saved as .npy files" in line and "a.npy" in line
    assert list(tmp_path.iterdir()) == []  # neither a.txt nor a.txt.npy


def test_run_writes_the_npy_it_names(mlp_mln, tmp_path):
    result = plex("run", str(mlp_mln), "--input", "1x16xf32=1", "-o", str(tmp_path / "y.npy"))
    assert result.returncode == 0, result.stderr
    assert f"saved {tmp_path / 'y.npy'}" in result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["y.npy"]


def test_build_of_a_model_file_says_it_is_not_an_app_manifest():
    line = one_line_error(plex("build", str(EXAMPLES / "mlp" / "mlp.mlir")))
    assert "mlp.mlir is not an app manifest" in line and "app.toml" in line
    assert "TOML" not in line


PLACEMENT_CPU_APP = """\
[app]
name = "embed"
packages = ["placement"]

[devices.cpu]
target = "llvm-cpu"
"""


def test_accuracy_draws_token_ids_from_the_recorded_range_and_defines_its_errors(tmp_path):
    """examples/placement's `embed` takes int64 ids that index a 256-row table: the report needs
    no --input, and its mean relative error is defined on screen and never above the max."""
    package = tmp_path / "placement"
    package.mkdir()
    for name in ("plex.toml", "embed.mlir", "blocks.mlir", "head.mlir", "params.safetensors"):
        shutil.copy(EXAMPLES / "placement" / name, package / name)
    (tmp_path / "app.toml").write_text(PLACEMENT_CPU_APP)
    result = plex("accuracy", str(tmp_path / "app.toml"), "--codec", "int8", "-f", "embed")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("entrypoint"))
    assert "max rel err" in header and "mean rel err" in header
    row = next(line for line in lines if line.startswith("embed "))
    max_rel, mean_rel, cosine = (float(v) for v in row.split()[2:5])
    assert 0 < mean_rel <= max_rel < 0.02  # int8 rows of a gathered table
    assert 0.999 < cosine <= 1.0
    assert "rel err = |codec - fp32| / max |fp32|, per element of an output" in result.stdout


def test_a_build_warning_is_one_clean_line(tmp_path):
    """A build note (here: a weight layout that matches no parameter) reads like an error line:
    `warning: ...`, without Python's `file.py:32: BuildWarning:` prefix or the source line."""
    package = tmp_path / "mlp"
    shutil.copytree(EXAMPLES / "mlp", package)
    with (package / "plex.toml").open("a") as f:
        f.write('\n[tuning.cpu]\ntarget = "llvm-cpu"\nlayouts = { "nothing_here" = "nk" }\n')
    app = package / "app.toml"
    app.write_text(app.read_text() + '\n[myelin]\ntuning = "mlp:cpu"\n')
    result = plex("build", str(app), "-o", str(tmp_path / "m.mln"), "--progress", "plain")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "nothing_here" in line]
    assert warned == [
        'warning: weight layout "nothing_here" matches no parameter of the app\'s graphs'
    ], result.stderr
    assert "BuildWarning" not in result.stderr and "warnings.warn" not in result.stderr


@pytest.mark.parametrize("size", [5, 16, 40, 63])
def test_a_truncated_artifact_says_truncated(mlp_mln, tmp_path, size):
    short = tmp_path / "short.mln"
    short.write_bytes(mlp_mln.read_bytes()[:size])
    line = one_line_error(plex("inspect", str(short)))
    assert f"truncated: the file is {size} bytes, shorter than the 64-byte header" in line


def test_a_short_file_that_is_no_artifact_says_so(tmp_path):
    other = tmp_path / "notes.mln"
    other.write_bytes(b"hello, this is a text file\n")
    assert "not a .mln file (wrong magic bytes)" in one_line_error(plex("inspect", str(other)))


@pytest.mark.parametrize("verb", ["run", "bench"])
def test_a_dtype_error_says_what_to_type(mlp_mln, verb):
    line = one_line_error(plex(verb, str(mlp_mln), "-f", "forward", "--input", "2x16xi64=1"))
    assert line == (
        "error: forward: argument 'x' has element type i64, expected f32 (shape ?x16); give it "
        "as f32, e.g. --input 1x16xf32=1 (a .npy file: saved as float32)"
    )
    assert "astype" not in line


def test_an_mlir_error_names_the_file_that_was_built(tmp_path):
    """A scaffold copied to another folder keeps its package name; the parse error must still
    point at the copy the user built, not at `mymodel/model.mlir`."""
    assert plex("init", "mymodel", cwd=tmp_path).returncode == 0
    shutil.copytree(tmp_path / "mymodel", tmp_path / "other")
    model = tmp_path / "other" / "model.mlir"
    model.write_text(model.read_text().replace("linalg.matmul ", "linalg.matmulx "))
    result = plex("build", "other", "--progress", "plain", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "custom op 'linalg.matmulx' is unknown" in result.stderr
    assert "at other/model.mlir:11:" in result.stderr
    assert "mymodel/model.mlir" not in result.stderr


def test_inspect_of_the_scaffold_says_why_it_has_no_parameters(tmp_path):
    """The README says inline constants become parameters; the scaffold's 8x4 f32 matrix
    (128 bytes) is below the threshold, and inspect says so instead of 'no weights'."""
    assert plex("init", "mymodel", cwd=tmp_path).returncode == 0
    built = plex("build", "mymodel", "--progress", "plain", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    shown = plex("inspect", str(tmp_path / "mymodel" / "mymodel.mln"))
    assert shown.returncode == 0, shown.stderr
    assert (
        "parameters: 0 (no weights file, and inline constants under 256 bytes stay in the code; "
        "larger ones become parameters)"
    ) in shown.stdout


def test_the_readme_python_example_returns_what_its_comments_say(mlp_mln):
    """The README's Python block, run as written on the example MLP: `call` gives numpy, a
    submitted call's `result()` gives DeviceTensors unless it asked for numpy."""
    import numpy as np

    from myelin.runtime.tensors import DeviceTensor

    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("From Python:\n```python\n", 1)[1].split("```", 1)[0]
    x = np.ones((2, 16), np.float32)
    scope = {"x": x, "batches": [x, 2 * x]}
    exec(block.replace('"app.mln"', repr(str(mlp_mln))), scope)
    assert isinstance(scope["y"], np.ndarray)
    assert all(isinstance(v, DeviceTensor) for v in scope["ys"])
    assert all(type(v) is np.ndarray for v in scope["zs"])
    np.testing.assert_allclose(np.asarray(scope["ys"][1]), scope["zs"][1], rtol=0, atol=0)
    scope["model"].close()


def test_the_readme_docs_table_lists_every_page_your_model_first():
    readme = (EXAMPLES.parent / "README.md").read_text()
    table = readme.split("## Documentation\n", 1)[1].strip().split("\n\n", 1)[0]
    linked = re.findall(r"^\| \[(docs/[\w-]+\.md)\]", table, re.M)
    assert linked[0] == "docs/your-model.md"
    pages = sorted(f"docs/{p.name}" for p in (EXAMPLES.parent / "docs").glob("*.md"))
    assert set(pages) <= set(linked), set(pages) - set(linked)
