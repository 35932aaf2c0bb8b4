"""Shared fixtures: small real models compiled once per test session through real IREE.

Artifacts are built into a session temp folder with a session-private SYNaPSe cache, so tests
never touch the user's cache and every test reuses the same compiled modules.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.models import write_stablehlo_package

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported: set before any
# test imports Ray, every test cluster binds 127.0.0.1 (docs/cluster.md), whichever test runs
# first (a module fixture setting it later is too late once another module imported Ray).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("plex-cache")
    os.environ["PLEX_CACHE_DIR"] = str(cache)
    return cache


def build_app(app_toml: Path, output: Path) -> Path:
    from plex.builder import build

    build(app_toml, output)
    return output


@pytest.fixture(scope="session")
def mlp_mln(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example MLP: two dynamic-batch entrypoints, weights from safetensors."""
    return build_app(EXAMPLES / "mlp" / "app.toml", tmp_path_factory.mktemp("mlp") / "mlp.mln")


@pytest.fixture(scope="session")
def mlp_weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(EXAMPLES / "mlp" / "params.safetensors"))


@pytest.fixture(scope="session")
def shlo_mln(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shlo")
    write_stablehlo_package(root / "shlo")
    (root / "app.toml").write_text('[app]\nname = "shlo"\npackages = ["shlo"]\n')
    return build_app(root / "app.toml", root / "shlo.mln")
