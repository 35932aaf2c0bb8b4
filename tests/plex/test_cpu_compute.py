"""`[devices.<cpu>] compute = "bf16"`: PLeX's reduced-precision mode on llvm-cpu. A small
convolutional and dense model (seeded) built both ways through real IREE and compared with torch
eager in fp32: the f32 build within float rounding, the bf16 build within bf16's tolerance and
measurably not f32 (the rewrite applied); the choice is recorded in the .mln and shown by
`plex inspect`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import myelin
from plex.builder import build
from plex.errors import ManifestError

MODEL_PY = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 8 * 8, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.nn.functional.gelu(self.fc1(h)))


def build():
    return Net().eval(), (torch.randn(4, 3, 8, 8),)
"""

# bf16 keeps 8 significant bits: each input carries up to 2^-9 = 2e-3 relative rounding, and a
# sum over ~1000 products of mixed signs keeps that order relative to the output's scale.
BF16_REL_TOLERANCE = 2e-2
F32_REL_TOLERANCE = 1e-5


def _app(folder: Path, compute: str | None) -> Path:
    pkg = folder / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "model.py").write_text(MODEL_PY)
    (pkg / "plex.toml").write_text(
        '[package]\nname = "net"\n\n[graph.net]\nsource = "model.py:build"\nfrontend = "torch"\n'
    )
    line = f'compute = "{compute}"\n' if compute else ""
    app = folder / "app.toml"
    app.write_text(
        f'[app]\nname = "net"\npackages = ["pkg"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n{line}'
    )
    return app


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compute")
    return {
        mode: build(_app(root / mode, None if mode == "f32" else mode), root / f"{mode}.mln").output
        for mode in ("f32", "bf16")
    }


def _reference() -> tuple[np.ndarray, np.ndarray]:
    sys.path.insert(0, "")
    namespace: dict = {}
    exec(textwrap.dedent(MODEL_PY), namespace)
    module, _ = namespace["build"]()
    x = np.random.default_rng(5).standard_normal((4, 3, 8, 8)).astype(np.float32)
    with torch.inference_mode():
        return x, module(torch.from_numpy(x)).numpy()


def _relative_error(mln: Path) -> float:
    x, want = _reference()
    with myelin.Instance().load(mln) as model, model.session() as session:
        got = np.asarray(session.call("forward", x))
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_bf16_compute_is_within_bf16_tolerance_of_torch_fp32_and_not_f32(builds):
    f32, bf16 = _relative_error(builds["f32"]), _relative_error(builds["bf16"])
    assert f32 <= F32_REL_TOLERANCE
    assert bf16 <= BF16_REL_TOLERANCE
    assert bf16 > 10 * max(f32, 1e-7)  # the contractions did take bf16 inputs


def test_the_choice_is_recorded_and_shown_by_inspect(builds):
    with myelin.Instance().load(builds["bf16"]) as model:
        device = model.manifest["variants"][0]["devices"][0]
    assert device["options"]["compute"] == "bf16"
    with myelin.Instance().load(builds["f32"]) as model:
        assert "compute" not in model.manifest["variants"][0]["devices"][0]["options"]
    shown = subprocess.run(
        [sys.executable, "-m", "plex", "inspect", str(builds["bf16"])],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "compute=bf16" in shown.stdout


def test_compute_is_refused_off_llvm_cpu_and_for_unknown_modes(tmp_path):
    app = _app(tmp_path / "gpu", None)
    app.write_text(
        app.read_text().replace('target = "llvm-cpu"', 'target = "cuda"\ncompute = "bf16"')
    )
    with pytest.raises(ManifestError, match=r"\[devices\.cpu\] compute: does not apply to"):
        build(app, tmp_path / "x.mln")
    app = _app(tmp_path / "fp8", "fp8")
    with pytest.raises(ManifestError, match="compute"):
        build(app, tmp_path / "y.mln")
