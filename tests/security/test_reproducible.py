"""An artifact does not depend on where the checkout lives.

The cache key leaves paths out (a moved checkout stays cached), so the bytes must leave them out
too: otherwise a warm cache gives another artifact than a cold build. Frontends record absolute
paths of the model file (torch.export's stack frames) in debug locations, which reach the
compiled module; the import step rewrites them to package-relative names
(`myelin.compiler.pipeline.portable_locations`). Real `plex build` processes, each checkout
built cold with a cache of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

TORCH_MODEL_PY = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.proj(x)) * 2


def build():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.zeros(2, 4),)
"""


def _mlp_checkout(root: Path) -> Path:
    shutil.copytree(EXAMPLES / "mlp", root, ignore=shutil.ignore_patterns("plex.lock", "*.mln"))
    return root / "app.toml"


def _torch_checkout(root: Path) -> Path:
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "model.py").write_text(TORCH_MODEL_PY)
    (root / "tiny" / "plex.toml").write_text(
        textwrap.dedent("""\
        [package]
        name = "tiny"

        [graph.tiny]
        source = "model.py:build"
        frontend = "torch"
        """)
    )
    (root / "app.toml").write_text('[app]\nname = "tiny"\npackages = ["tiny"]\n')
    return root / "app.toml"


def _build(app: Path, output: Path, cache: Path) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(output)],
        capture_output=True,
        text=True,
        cwd=app.parent,
        env={**os.environ, "PLEX_CACHE_DIR": str(cache)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return output.read_bytes()


@pytest.mark.parametrize("checkout", [_mlp_checkout, _torch_checkout], ids=["mlir", "torch"])
def test_two_checkouts_at_different_paths_build_byte_identical_artifacts(tmp_path, checkout):
    app_a = checkout(tmp_path / "a")
    app_b = checkout(tmp_path / "elsewhere" / "much-longer-path-to-the-checkout")
    cold_a = _build(app_a, tmp_path / "a.mln", tmp_path / "cache-a")
    cold_b = _build(app_b, tmp_path / "b.mln", tmp_path / "cache-b")
    assert str(app_a.parent).encode() not in cold_a
    assert cold_a == cold_b
    # Checkout b served from a's cache: the same bytes as its own cold build.
    assert _build(app_b, tmp_path / "b-warm.mln", tmp_path / "cache-a") == cold_b
