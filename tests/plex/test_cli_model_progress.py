"""Progress bars printed by model code (transformers' "Loading weights") stay out of
`plex build`'s output, unless the user turns them on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

MODEL = """\
import torch
from transformers.utils.logging import tqdm


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def build():
    for _ in tqdm(range(3), desc="Loading weights"):  # as from_pretrained does
        pass
    return Double(), (torch.ones(2, 4),)
"""


def test_transformers_progress_bars_do_not_leak_into_plex_output(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "model.py").write_text(MODEL)
    (pkg / "plex.toml").write_text(
        '[package]\nname = "pkg"\n\n[graph.double]\nsource = "model.py:build"\nfrontend = "torch"\n'
    )
    (tmp_path / "app.toml").write_text('[app]\nname = "double"\npackages = ["pkg"]\n')
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    for setting, shown in ((None, False), ("0", True)):  # "0": the user asks for the bars
        run_env = env if setting is None else {**env, "HF_HUB_DISABLE_PROGRESS_BARS": setting}
        (tmp_path / "double.mln").unlink(missing_ok=True)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "plex",
                "build",
                str(tmp_path),
                "--progress",
                "plain",
                "--no-cache",
            ],
            capture_output=True,
            text=True,
            env=run_env,
        )
        assert result.returncode == 0, result.stderr
        assert ("Loading weights" in result.stderr) is shown, result.stderr
        assert (tmp_path / "double.mln").is_file()
