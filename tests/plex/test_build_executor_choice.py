"""Choosing an executor: `--executor` and `[build] executor`, without a cluster. The builds on a
Ray cluster are in test_build_ray_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.plex.build_helpers import EXAMPLES


def test_a_local_build_never_imports_ray(tmp_path):
    code = (
        "import sys\nfrom pathlib import Path\nfrom plex.builder import build\n"
        f"build(Path({str(EXAMPLES / 'mlp' / 'app.toml')!r}), Path({str(tmp_path / 'x.mln')!r}), "
        f"cache_dir=Path({str(tmp_path / 'cache')!r}))\n"
        "print('ray' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"


def test_executor_names_are_checked_in_the_manifest(tmp_path):
    from plex.errors import ManifestError
    from plex.manifest import load_app, parse_executor

    app = EXAMPLES / "mlp" / "app.toml"
    assert load_app(app).build.executor == "local"
    assert parse_executor("ray=127.0.0.2:6390").address == "127.0.0.2:6390"
    assert parse_executor("ray://127.0.0.2:10001").address == "ray://127.0.0.2:10001"
    bad = tmp_path / "app.toml"
    text = app.read_text().replace('packages = ["."]', f'packages = ["{app.parent.as_posix()}"]')
    bad.write_text(text + '\n[build]\nexecutor = "dask"\n')
    with pytest.raises(ManifestError, match="unknown executor 'dask'"):
        load_app(bad)


def test_ray_without_a_cluster_is_one_error_line(tmp_path):
    """plex never starts a cluster: with none to find, the build stops with what to do."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        sys.executable, "-m", "plex", "build", str(EXAMPLES / "mlp"), "-o", str(tmp_path / "x.mln"),
        "--cache", str(tmp_path / "cache"), "--executor", "ray",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "error: cannot reach the Ray cluster at 'auto'" in done.stderr
    assert "ray start --head" in done.stderr
    assert not (tmp_path / "x.mln").exists()


def test_unknown_executor_on_the_command_line(tmp_path):
    command = [
        sys.executable, "-m", "plex", "build", str(EXAMPLES / "mlp"), "-o", str(tmp_path / "x.mln"),
        "--executor", "dask",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "error: unknown executor 'dask'; expected local | ray | ray=ADDRESS" in done.stderr
