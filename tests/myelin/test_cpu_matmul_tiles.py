"""The workgroup tiles of data-tiled f32 matmuls on llvm-cpu (`matmul_tiles`,
myelin.compiler.cpu_matmul_tiles): "rows" (all activation rows, two weight tiles) chosen for an
AVX-512 host under data tiling, recorded in the .mln and shown by `plex inspect`; a pinned value
is honoured; both compute what torch computes (a real IREE compile of a small MLP)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from myelin.compiler.cpu_matmul_tiles import ROWS_BUDGET, rows_distribution
from myelin.compiler.targets import data_tiling_choice, matmul_tiles_choice
from plex.builder import build
from plex.cli import app as plex_app
from tests.models import runs_like_torch, write_torch_package

MODEL = """
import torch


def build():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(384, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)
    )
    return mlp.eval(), (torch.randn(64, 384),)
"""

APP = '[app]\nname = "mlp"\npackages = ["{package}"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
# the mmt4d ops' workgroup tiles, as IREE's executable configurations record them
MMT4D_TILES = re.compile(
    r"linalg\.mmt4d \{lowering_config = (#config\d+)\}|"
    r"^(#config\d+) = #iree_cpu\.lowering_config<distribution = (\[[\d, ]*\])",
    re.MULTILINE,
)

ROWS = "[4, 2, 0, 0, 0, 0]"  # the MLP's products with "rows"
AVX512_HOST = (
    data_tiling_choice("host", "").value and matmul_tiles_choice(True, "host", "").value == "rows"
)
needs_avx512 = pytest.mark.skipif(not AVX512_HOST, reason="'rows' is chosen on AVX-512 hosts")


@pytest.mark.parametrize(
    ("data_tiling", "cpu", "features", "chosen"),
    [
        (True, "generic", "+avx512f", "rows"),
        (True, "generic", "+avx2,+fma", "iree"),  # unmeasured without IREE's AVX-512 kernels
        (False, "generic", "+avx512f", "iree"),  # no packed matmuls to tile
        (True, "znver5", "", "iree"),  # a named CPU is not looked up
    ],
)
def test_rows_are_chosen_for_packed_matmuls_on_avx512(data_tiling, cpu, features, chosen):
    choice = matmul_tiles_choice(data_tiling, cpu, features)
    assert choice.value == chosen
    assert choice.reason


def test_rows_take_the_whole_m_where_it_fits_and_leave_iree_tiles_elsewhere():
    assert rows_distribution([8, 768, 16, 1], [192, 768, 16, 1]) == [8, 2, 0, 0, 0, 0]
    assert rows_distribution([8, 3072, 16, 1], [47, 3072, 16, 1]) == [8, 1, 0, 0, 0, 0]
    rows = ROWS_BUDGET // (16 * 768 * 4) + 1  # one 16-row tile more than the budget holds
    assert rows_distribution([rows, 768, 16, 1], [48, 768, 16, 1]) is None


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_torch_package(tmp_path_factory.mktemp("mlp_pkg"), "mlp", MODEL)


def _build(package: Path, folder: Path, pinned: str = "") -> tuple[Path, list[str]]:
    """The .mln and the workgroup tiles of its mmt4d ops (from the dumped configurations)."""
    app = folder / "app.toml"
    app.write_text(APP.format(package=package) + "data_tiling = true\n" + pinned)
    phases = folder / "phases"
    mln = build(app, folder / "mlp.mln", dump_phases=phases).output
    (text,) = [p.read_text() for p in phases.rglob("*executable-configurations.mlir")]
    configs, used = {}, []
    for op_config, name, distribution in MMT4D_TILES.findall(text):
        if name:
            configs[name] = distribution
        else:
            used.append(op_config)
    return mln, [configs[name] for name in used]


@needs_avx512
def test_an_unpinned_app_gets_rows_records_them_and_computes_like_torch(package, tmp_path):
    mln, tiles = _build(package, tmp_path)
    # 64 rows = 4 tiles of 16; 512 and 128 columns = 32 and 8 weight tiles, taken 2 at a time
    assert tiles == [ROWS, ROWS]
    device = runs_like_torch(mln, MODEL, 1e-5)[1]["variants"][0]["devices"][0]
    choice = matmul_tiles_choice(True, "host", "")
    assert device["host_chosen"]["matmul_tiles"] == {"value": "rows", "reason": choice.reason}
    shown = " ".join(CliRunner().invoke(plex_app, ["inspect", str(mln)]).output.split())
    assert "host-chosen [default/cpu]: matmul_tiles = rows" in shown


def test_pinned_iree_tiles_are_honoured_and_not_host_chosen(package, tmp_path):
    mln, tiles = _build(package, tmp_path, 'matmul_tiles = "iree"\n')
    assert tiles and ROWS not in tiles  # IREE's own choice
    device = runs_like_torch(mln, MODEL, 1e-5)[1]["variants"][0]["devices"][0]
    assert "matmul_tiles" not in device.get("host_chosen", {})


def test_pinned_rows_are_honoured_on_any_host(package, tmp_path):
    mln, tiles = _build(package, tmp_path, 'matmul_tiles = "rows"\n')
    if tiles:  # a host without IREE's packed f32 kernels may pack no matmul
        assert set(tiles) == {ROWS}
    device = runs_like_torch(mln, MODEL, 1e-5)[1]["variants"][0]["devices"][0]
    assert "matmul_tiles" not in device.get("host_chosen", {})
