"""A device needs only iree-base-runtime: a .mln built beforehand runs in a fresh virtual
environment that has no IREE compiler (and none of PLeX's build dependencies)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.models import mlp_reference

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import importlib.util, sys
    import numpy as np
    assert importlib.util.find_spec("iree.compiler") is None, "the compiler is installed"
    for name in ("pydantic", "typer", "rich", "safetensors"):
        assert importlib.util.find_spec(name) is None, name + " is installed"
    import myelin
    x = np.load(sys.argv[2])
    with myelin.Instance().load(sys.argv[1]).session() as s:
        np.save(sys.argv[3], s.call("forward", x))
""")


@pytest.fixture(scope="module")
def runtime_only_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("runtime-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "iree-base-runtime==3.13.0",
            "numpy",
        ],
        check=True,
    )
    return python


@pytest.mark.slow
def test_prebuilt_mln_runs_without_the_compiler(
    runtime_only_python, mlp_mln, mlp_weights, tmp_path
):
    x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    # Only the runtime package travels: src/myelin, not plex or synapse.
    isolated = tmp_path / "site"
    isolated.mkdir()
    os.symlink(REPO / "src" / "myelin", isolated / "myelin")
    env = {**os.environ, "PYTHONPATH": str(isolated)}
    subprocess.run(
        [
            str(runtime_only_python),
            "-c",
            SCRIPT,
            str(mlp_mln),
            str(tmp_path / "x.npy"),
            str(tmp_path / "y.npy"),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    y = np.load(tmp_path / "y.npy")
    _, want = mlp_reference(mlp_weights, x)
    assert np.abs(y - want).max() / np.abs(want).max() < 1e-5
