"""Vector tiles of data tiling's relayouts on llvm-cpu (`relayout_tiles`,
myelin.compiler.cpu_relayout_tiles): "whole" (whole 16 x 16 tiles) chosen for an AVX-512 host
under data tiling, recorded in the .mln and shown by `plex inspect`; a pinned value is honoured;
both compute what torch computes, bit for bit the same (a real IREE compile of a per-head split
between two packed products, as attention's is)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from myelin.compiler.cpu_relayout_tiles import whole_tiles
from myelin.compiler.targets import data_tiling_choice, relayout_tiles_choice
from plex.builder import build
from plex.cli import app as plex_app
from tests.models import runs_like_torch, write_torch_package

MODEL = """
import torch


class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(128, 128)
        self.k = torch.nn.Linear(128, 128)

    def forward(self, x):
        q = self.q(x).view(64, 4, 32).transpose(0, 1)
        k = self.k(x).view(64, 4, 32).transpose(0, 1)
        return q @ k.transpose(1, 2)


def build():
    torch.manual_seed(0)
    return Heads().eval(), (torch.randn(64, 128),)
"""

APP = (
    '[app]\nname = "heads"\npackages = ["{package}"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
    "data_tiling = true\n"
)
# a relayout's vector tile over [rows, heads, head width] with "whole": 16 rows x 16 columns
WHOLE = re.compile(r"vector_common_parallel = \[16, 1, 16\]")
AVX512_HOST = data_tiling_choice("host", "").value
needs_avx512 = pytest.mark.skipif(not AVX512_HOST, reason="'whole' is chosen on AVX-512 hosts")


@pytest.mark.parametrize(
    ("data_tiling", "cpu", "features", "chosen"),
    [
        (True, "generic", "+avx512f", "whole"),
        (True, "generic", "+avx2,+fma", "iree"),  # unmeasured
        (False, "generic", "+avx512f", "iree"),  # no packed relayouts
        (True, "znver5", "", "iree"),  # a named CPU is not looked up
    ],
)
def test_whole_tiles_are_chosen_for_packed_relayouts_on_avx512(data_tiling, cpu, features, chosen):
    choice = relayout_tiles_choice(data_tiling, cpu, features)
    assert choice.value == chosen
    assert choice.reason


def test_the_whole_tile_covers_the_unpacked_tile_in_the_packs_outer_dims():
    # BERT's keys: [128, 12, 64] unpacked from 16 x 16 tiles on (rows, width), packed per head
    # with 16 x 1 tiles, outer dims (heads, rows, width)
    assert whole_tiles(3, [0, 2], [16, 16], [0, 2], [16, 1], [1, 0, 2]) == (
        [16, 1, 16],
        [1, 1, 16],
    )
    # its queries: packed with 16 x 1 tiles on (width, rows), outer dims (heads, width, rows)
    assert whole_tiles(3, [0, 2], [16, 16], [2, 0], [16, 1], [1, 2, 0]) == (
        [16, 1, 16],
        [1, 1, 16],
    )
    assert whole_tiles(2, [0, 1], [16, 16], [0, 1], [16, 32], None) is None  # 32 does not divide


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_torch_package(tmp_path_factory.mktemp("heads_pkg"), "heads", MODEL)


def _build(package: Path, folder: Path, pinned: str = "") -> tuple[Path, str]:
    """The .mln and its executable configurations (as dumped after PLeX's edits)."""
    folder.mkdir(parents=True, exist_ok=True)
    app = folder / "app.toml"
    app.write_text(APP.format(package=package) + pinned)
    phases = folder / "phases"
    mln = build(app, folder / "heads.mln", dump_phases=phases).output
    (text,) = [p.read_text() for p in phases.rglob("*executable-configurations.mlir")]
    return mln, text


@needs_avx512
def test_an_unpinned_app_gets_whole_tiles_records_them_and_computes_like_iree_tiles(
    package, tmp_path
):
    mln, text = _build(package, tmp_path / "whole")
    assert WHOLE.search(text)
    got, manifest = runs_like_torch(mln, MODEL, 1e-5)
    device = manifest["variants"][0]["devices"][0]
    choice = relayout_tiles_choice(True, "host", "")
    assert device["host_chosen"]["relayout_tiles"] == {"value": "whole", "reason": choice.reason}
    assert device["options"]["relayout_tiles"] == "whole"
    shown = " ".join(CliRunner().invoke(plex_app, ["inspect", str(mln)]).output.split())
    assert "host-chosen [default/cpu]: relayout_tiles = whole" in shown

    iree_mln, iree_text = _build(package, tmp_path / "iree", 'relayout_tiles = "iree"\n')
    assert not WHOLE.search(iree_text)  # IREE's own tiles
    iree_got, iree_manifest = runs_like_torch(iree_mln, MODEL, 1e-5)
    np.testing.assert_array_equal(got, iree_got)  # the same arithmetic, element by element
    iree_device = iree_manifest["variants"][0]["devices"][0]
    assert "relayout_tiles" not in iree_device.get("host_chosen", {})
    assert "relayout_tiles" not in iree_device.get("options", {})


def test_pinned_whole_tiles_are_honoured_on_any_host(package, tmp_path):
    mln, text = _build(package, tmp_path, 'relayout_tiles = "whole"\n')
    if "linalg.unpack" in text:  # a host without IREE's packed f32 kernels may pack nothing
        assert WHOLE.search(text)
    _, manifest = runs_like_torch(mln, MODEL, 1e-5)
    assert "relayout_tiles" not in manifest["variants"][0]["devices"][0].get("host_chosen", {})
