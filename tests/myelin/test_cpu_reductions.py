"""Row reductions on llvm-cpu (`reductions`, myelin.compiler.cpu_reductions): "vector"
(reassociated f32 sums, 2 x 64 vector tiles) chosen for an AVX-512 host, recorded in the .mln
and shown by `plex inspect`; a pinned value is honoured; both compute what torch computes (a
real IREE compile of a layer norm and a softmax over rows of 128)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import myelin
from myelin.compiler.cpu_reductions import ROWS, WIDTH
from myelin.compiler.targets import REASSOCIATE_FLAG, reductions_choice
from plex.builder import build
from plex.cli import app as plex_app
from tests.models import runs_like_torch, write_torch_package

MODEL = """
import torch


class Rows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(128)

    def forward(self, x):
        return torch.softmax(self.norm(x) * 4.0, dim=-1)


def build():
    torch.manual_seed(0)
    return Rows().eval(), (torch.randn(32, 128),)
"""

# without data tiling: no pack follows a reduction here (such a dispatch keeps IREE's tiles)
APP = (
    '[app]\nname = "rows"\npackages = ["{package}"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
    "data_tiling = false\n"
)
VECTOR = f"vector_common_parallel = [{ROWS}, 0], vector_reduction = [0, {WIDTH}]"
# the row reductions' vector tiles, as the executable configurations record them
REDUCTION_TILES = re.compile(r"vector_common_parallel = \[\d+, 0\], vector_reduction = \[0, \d+\]")
AVX512_HOST = reductions_choice("host", "").value == "vector"
needs_avx512 = pytest.mark.skipif(not AVX512_HOST, reason="'vector' is chosen on AVX-512 hosts")


@pytest.mark.parametrize(
    ("cpu", "features", "chosen"),
    [
        ("generic", "+avx512f", "vector"),
        ("generic", "+avx2,+fma", "iree"),  # unmeasured without AVX-512's 32 registers
        ("znver5", "", "iree"),  # a named CPU is not looked up
    ],
)
def test_vector_reductions_are_chosen_on_avx512(cpu, features, chosen):
    choice = reductions_choice(cpu, features)
    assert choice.value == chosen
    assert choice.reason


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_torch_package(tmp_path_factory.mktemp("rows_pkg"), "rows", MODEL)


def _build(package: Path, folder: Path, pinned: str = "") -> tuple[Path, list[str], list[str]]:
    """The .mln, the row reductions' vector tiles (from the dumped configurations) and the
    compile's flags."""
    app = folder / "app.toml"
    app.write_text(APP.format(package=package) + pinned)
    phases = folder / "phases"
    mln = build(app, folder / "rows.mln", dump_phases=phases).output
    (text,) = [p.read_text() for p in phases.rglob("*executable-configurations.mlir")]
    model = myelin.Instance().load(mln)
    flags = list(model.manifest["variants"][0]["flags"])
    model.close()
    return mln, REDUCTION_TILES.findall(text), flags


@needs_avx512
def test_an_unpinned_app_gets_vector_reductions_records_them_and_computes_like_torch(
    package, tmp_path
):
    mln, tiles, flags = _build(package, tmp_path)
    assert tiles and set(tiles) == {VECTOR}  # the layer norm's and the softmax's reductions
    assert REASSOCIATE_FLAG in flags
    device = runs_like_torch(mln, MODEL, 1e-6)[1]["variants"][0]["devices"][0]
    choice = reductions_choice("host", "")
    assert device["host_chosen"]["reductions"] == {"value": "vector", "reason": choice.reason}
    assert device["options"]["reductions"] == "vector"
    shown = " ".join(CliRunner().invoke(plex_app, ["inspect", str(mln)]).output.split())
    assert "host-chosen [default/cpu]: reductions = vector" in shown


def test_pinned_iree_reductions_are_honoured_and_not_host_chosen(package, tmp_path):
    mln, tiles, flags = _build(package, tmp_path, 'reductions = "iree"\n')
    assert tiles and VECTOR not in tiles  # IREE's own tiles
    assert REASSOCIATE_FLAG not in flags
    device = runs_like_torch(mln, MODEL, 1e-6)[1]["variants"][0]["devices"][0]
    assert "reductions" not in device.get("host_chosen", {})
    assert "reductions" not in device.get("options", {})


def test_pinned_vector_reductions_are_honoured_on_any_host(package, tmp_path):
    mln, tiles, flags = _build(package, tmp_path, 'reductions = "vector"\n')
    assert tiles and set(tiles) == {VECTOR}
    assert REASSOCIATE_FLAG in flags
    device = runs_like_torch(mln, MODEL, 1e-6)[1]["variants"][0]["devices"][0]
    assert "reductions" not in device.get("host_chosen", {})
