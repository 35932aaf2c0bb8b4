"""`plex build` and `plex accuracy` as a newcomer meets them: where the output goes, what a
package manifest is, what Ctrl-C does, and comparisons refused before they cost a second build.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plex.build_helpers import write_chain_app
from tests.plex.test_cli import EXAMPLES, one_line_error, plex
from tests.plex.test_codec_build import write_app as write_codec_app


@pytest.fixture
def newpkg(tmp_path) -> Path:
    """A copy of examples/mlp as `newpkg/`, with `cwd/` as a separate working directory."""
    shutil.copytree(EXAMPLES / "mlp", tmp_path / "newpkg", ignore=shutil.ignore_patterns("*.mln"))
    (tmp_path / "cwd").mkdir()
    return tmp_path / "newpkg"


def test_a_folder_and_its_app_toml_build_the_same_output_beside_the_app(newpkg):
    """One rule: the default output is <app name>.mln beside the app manifest; a folder stands
    for its app.toml (README, "The path")."""
    cwd = newpkg.parent / "cwd"
    for target in ("../newpkg", "../newpkg/app.toml"):
        result = plex("build", target, "--progress", "plain", cwd=cwd)
        assert result.returncode == 0, result.stderr
        out = newpkg / "mlp-demo.mln"
        assert f"built {out} (" in result.stderr
        assert out.is_file() and list(cwd.iterdir()) == []
        out.unlink()


def test_a_package_manifest_is_refused_with_a_pointer_to_the_app(newpkg, tmp_path):
    line = one_line_error(plex("build", str(newpkg / "plex.toml")))
    assert line == (
        f"error: {newpkg / 'plex.toml'} is a package manifest ([package]), not an app; "
        f"build the app beside it: plex build {newpkg / 'app.toml'}"
    )
    (newpkg / "app.toml").unlink()
    line = one_line_error(plex("build", str(newpkg / "plex.toml")))
    assert line.endswith("build an app that lists it in [app] packages (plex init writes one)")
    line = one_line_error(plex("build", str(newpkg)))
    assert line.startswith(f"error: {newpkg} is a folder without an app.toml; it has a package")
    line = one_line_error(plex("build", str(tmp_path / "missing")))
    assert line.endswith("missing does not exist; give an app manifest (app.toml) or its folder")


def test_ctrl_c_says_at_once_what_the_build_waits_for(tmp_path):
    app_toml = write_chain_app(tmp_path / "app", functions=6, graphs=2)
    process = subprocess.Popen(
        [sys.executable, "-m", "plex", "build", str(app_toml), "--progress", "plain", "-j", "1"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PLEX_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert process.stderr is not None
    for line in process.stderr:
        if " start " in line and "compile:" in line:
            node = line.split()[-1]
            time.sleep(0.3)  # inside the IREE compile
            process.send_signal(signal.SIGINT)
            sent = time.monotonic()
            break
    stopping = process.stderr.readline()
    answered = time.monotonic() - sent
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 130
    assert stopping.startswith(f"plex: stopping the build; stopping 1 running step(s): {node} ("), (
        stopping
    )
    assert stopping.rstrip().endswith("s in); nothing unfinished is kept")
    assert answered < 1.0  # at once, not when the step ends
    assert rest.rstrip().endswith("plex: interrupted")


def test_accuracy_refuses_a_codec_that_encodes_nothing():
    # The MLP's four parameters are all below the size a codec encodes (they stay fp32).
    result = plex("accuracy", str(EXAMPLES / "mlp"), "--codec", "int8")
    assert result.returncode == 1, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: --codec int8 encoded no parameter: all 4 parameters stay as they are (kept fp32"
    ), last
    assert last.endswith("; there is nothing to compare")
    assert result.stderr.count("plan: ") == 1  # the fp32 build never started


def test_accuracy_draws_integer_inputs_from_their_recorded_range(tmp_path):
    """An index input (a table lookup) needs no --input: the artifact records its valid range,
    and accuracy draws ids inside it."""
    app = write_codec_app(tmp_path)
    result = plex("accuracy", str(app), "-f", "embed")
    assert result.returncode == 0, result.stderr
    assert "rel err" in result.stdout, result.stdout
