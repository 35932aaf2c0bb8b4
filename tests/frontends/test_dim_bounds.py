"""Dynamic sizes past a table: where the graph indexes a fixed-size table at positions along a
dynamic dim (an iota/arange over it, GPT-2's position embeddings), the build records the
largest size it supports, `plex inspect` shows it, and a larger call is refused before IREE
would read past the table (torch raises IndexError there; IREE returns garbage)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import myelin
from myelin.errors import InputError
from plex.cli import app as plex_app
from tests.conftest import build_app

ROWS = 16  # the table's rows

# Three ways to read `table` at the positions 0..n-1 of x's dynamic dim: plain (n <= 16), two
# rows further on (n <= 14), and clamped to the last row (any n: no limit).
POSITIONS_MLIR = """\
#iota = affine_map<(d0) -> (d0)>
#row = affine_map<(d0, d1) -> (d0)>
#all = affine_map<(d0, d1) -> (d0, d1)>
module {
  func.func private @iota(%n: index) -> tensor<?xi64> {
    %e = tensor.empty(%n) : tensor<?xi64>
    %iota = linalg.generic {indexing_maps = [#iota], iterator_types = ["parallel"]}
        outs(%e : tensor<?xi64>) {
    ^bb0(%o: i64):
      %i = linalg.index 0 : index
      %v = arith.index_cast %i : index to i64
      linalg.yield %v : i64
    } -> tensor<?xi64>
    return %iota : tensor<?xi64>
  }
  func.func @{name}(%x: tensor<?x4xf32>, %table: tensor<{rows}x4xf32>) -> tensor<?x4xf32> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x4xf32>
    %e = tensor.empty(%n) : tensor<?xi64>
    %positions = linalg.generic {indexing_maps = [#iota], iterator_types = ["parallel"]}
        outs(%e : tensor<?xi64>) {
    ^bb0(%o: i64):
      %i = linalg.index 0 : index
      %v = arith.index_cast %i : index to i64
      {position}
      linalg.yield %p : i64
    } -> tensor<?xi64>
    %out = tensor.empty(%n) : tensor<?x4xf32>
    %rows = linalg.generic {indexing_maps = [#row, #all, #all],
                            iterator_types = ["parallel", "parallel"]}
        ins(%positions, %x : tensor<?xi64>, tensor<?x4xf32>) outs(%out : tensor<?x4xf32>) {
    ^bb0(%p: i64, %xv: f32, %o: f32):
      %r = arith.index_cast %p : i64 to index
      %j = linalg.index 1 : index
      %w = tensor.extract %table[%r, %j] : tensor<{rows}x4xf32>
      %s = arith.addf %w, %xv : f32
      linalg.yield %s : f32
    } -> tensor<?x4xf32>
    return %rows : tensor<?x4xf32>
  }
}
"""
POSITIONS = {
    "plain": "%p = arith.addi %v, %v0 : i64",
    "shifted": "%p = arith.addi %v, %v2 : i64",
    "clamped": "%p = arith.minsi %v, %v15 : i64",
}


def positions_mlir(name: str) -> str:
    constants = (
        "%v0 = arith.constant 0 : i64\n      %v2 = arith.constant 2 : i64\n"
        "      %v15 = arith.constant 15 : i64\n      "
    )
    text = POSITIONS_MLIR.replace("{name}", name).replace("{rows}", str(ROWS))
    text = text.replace("{position}", constants + POSITIONS[name])
    # one function per module: drop the unused helper
    return text[: text.index("  func.func private")] + text[text.index("  func.func @") :]


@pytest.fixture(scope="module")
def positions_mln(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("positions")
    package = root / "positions"
    package.mkdir()
    graphs = []
    for name in POSITIONS:
        (package / f"{name}.mlir").write_text(positions_mlir(name))
        graphs.append(f'[graph.{name}]\nsource = "{name}.mlir"\n')
    (package / "plex.toml").write_text('[package]\nname = "positions"\n' + "\n".join(graphs))
    (root / "app.toml").write_text('[app]\nname = "positions"\npackages = ["positions"]\n')
    return build_app(root / "app.toml", root / "positions.mln")


@pytest.fixture(scope="module")
def positions(positions_mln: Path):
    model = myelin.Instance().load(positions_mln)
    yield model
    model.close()


def call(model, entry: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    table = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    with model.session() as s:
        return s.call(entry, x, table), x, table


@pytest.mark.parametrize(("entry", "largest"), [("plain", ROWS), ("shifted", ROWS - 2)])
def test_positions_into_a_table_bound_the_dim(positions, entry, largest):
    spec = next(e for e in positions.manifest["variants"][0]["entrypoints"] if e["name"] == entry)
    limit = spec["inputs"][0]["limits"][0]
    assert limit[0] == largest
    assert "dimension 0 of tensor<16x4xf32>, which has 16 entries" in limit[1]
    got, x, table = call(positions, entry, largest)
    offset = ROWS - largest
    np.testing.assert_array_equal(got, x + table[offset : offset + largest])
    with pytest.raises(
        InputError,
        match=rf"argument 'input0' has size {largest + 1} in dimension 0 \('input0.0'\), but the model "
        rf"supports at most {largest} there",
    ):
        call(positions, entry, largest + 1)


def test_clamped_positions_have_no_limit(positions):
    spec = next(
        e for e in positions.manifest["variants"][0]["entrypoints"] if e["name"] == "clamped"
    )
    assert "limits" not in spec["inputs"][0]
    got, x, table = call(positions, "clamped", ROWS + 4)
    want = table[np.minimum(np.arange(ROWS + 4), ROWS - 1)]
    np.testing.assert_array_equal(got, x + want)


# -- GPT-2 (n_positions = 128), from the library-model zoo --------------------------------------


@pytest.mark.slow
def test_gpt2_refuses_more_positions_than_it_has(zoo_model, zoo_source):
    import torch

    with zoo_model.session() as s:
        forward = s.resolve("gpt2.forward")
        ids, mask = forward.signature.inputs
        assert ids.limits[1][0] == mask.limits[1][0] == 128
        assert "transformer.wpe.weight, which has 128 entries" in ids.limits[1][1]
        tokens = np.random.default_rng(0).integers(3, 100, (1, 128), dtype=np.int64)
        got = forward(tokens, np.ones_like(tokens))
        for shape in ((1, 129), (3, 200)):
            too_long = np.full(shape, 5, dtype=np.int64)
            with pytest.raises(InputError, match=r"size \d+ in dimension 1 \('seq'\).*at most 128"):
                forward(too_long, np.ones_like(too_long))
    model, _ = zoo_source.gpt2()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(tokens)).logits.numpy()
        with pytest.raises(IndexError):  # what torch says for the sizes refused above
            model(input_ids=torch.full((1, 129), 5))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.slow
def test_inspect_shows_the_limit_and_run_refuses_in_one_line(zoo):
    runner = CliRunner()
    shown = runner.invoke(plex_app, ["inspect", str(zoo.mln)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert "input_ids: int64[batch, seq<=128]" in shown.output
    run = runner.invoke(
        plex_app,
        [
            "run",
            str(zoo.mln),
            "-f",
            "gpt2.forward",
            "--input",
            "1x129xi64=5",
            "--input",
            "1x129xi64=1",
        ],
    )
    assert run.exit_code == 1
    assert (
        run.output.strip().splitlines()[-1].startswith("error: gpt2.forward: argument 'input_ids'")
    )
    assert "at most 128" in run.output


@pytest.mark.slow
def test_a_range_torch_export_derives_is_a_limit_too(zoo_model, zoo_source):
    """BERT slices its position ids from a 64-row buffer: torch.export bounds seq <= 64 while
    tracing (no table lookup at an iota in the IR shows it); torch fails past it."""
    import torch

    with zoo_model.session() as s:
        forward = s.resolve("bert.forward")
        assert [i.limits[1][0] for i in forward.signature.inputs] == [64, 64]
        ids = np.full((2, 64), 7, dtype=np.int64)
        got = forward(ids, np.ones_like(ids))
        with pytest.raises(InputError, match=r"size 65 in dimension 1 \('seq'\).*at most 64"):
            forward(np.full((2, 65), 7, dtype=np.int64), np.ones((2, 65), dtype=np.int64))
    model, _ = zoo_source.bert()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
        with pytest.raises(RuntimeError):
            model(input_ids=torch.full((2, 65), 7))
    assert np.abs(got[0] - want).max() / np.abs(want).max() < 1e-4
