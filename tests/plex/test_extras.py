"""Optional dependencies: a verb that needs a missing extra says so in one line before it does
any work, with the install command the README uses; the README names every extra."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

from plex.extras import EXTRAS, install_hint

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def plex_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real `plex` entry point in a Python where `module` cannot be imported, as on a
    machine without the extra that brings it."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from plex.cli import main; sys.argv[0] = 'plex'; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_tune_without_nevergrad_fails_before_building(tmp_path):
    start = time.perf_counter()
    result = plex_without(
        "nevergrad",
        "tune",
        str(EXAMPLES / "mlp" / "app.toml"),
        "--device",
        "cpu",
        "-o",
        str(tmp_path / "tuned"),
    )
    seconds = time.perf_counter() - start
    line = one_line_error(result)
    assert line == (
        "error: plex tune needs the 'nevergrad' package; install PLeX with the 'tune' extra: "
        "pip install -e '.[tune]'"
    )
    assert not (tmp_path / "tuned").exists()  # nothing was built or written
    assert seconds < 30, f"the check came after work: {seconds:.1f} s"


def test_build_of_a_torch_graph_without_torch_names_the_extra(tmp_path):
    result = plex_without(
        "torch", "build", str(EXAMPLES / "llama" / "app.toml"), "-o", str(tmp_path / "l.mln")
    )
    assert one_line_error(result) == (
        "error: PyTorch models (frontend = \"torch\") needs the 'torch' package; install PLeX "
        "with the 'torch' extra: pip install -e '.[torch]'"
    )
    assert not (tmp_path / "l.mln").exists()


def test_every_extra_is_in_pyproject_and_the_readme():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(EXTRAS) <= set(declared), set(EXTRAS) - set(declared)
    readme = (REPO / "README.md").read_text()
    missing = [name for name in declared if f"`{name}`" not in readme]
    assert not missing, f"README does not name these extras: {missing}"
    assert install_hint("tune") == "pip install -e '.[tune]'"
