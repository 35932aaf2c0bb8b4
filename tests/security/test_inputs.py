"""Budgets and inputs that cannot lie: a crafted memory formula is refused instead of bypassing
or sinking `memory_budget`; Python lists follow numpy's rules exactly as numpy arrays do; the CLI
checks memory before allocating random inputs. Real IREE builds, real calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import myelin
from myelin.errors import ArtifactError, InputError
from plex.cli import app
from tests.conftest import build_app
from tests.models import mlp_reference
from tests.myelin.test_mln_format import manifest_of, replace_manifest

TWICE_MLIR = """
func.func @twice(%x: tensor<?xi32>) -> tensor<?xi32> {
  %0 = arith.addi %x, %x : tensor<?xi32>
  return %0 : tensor<?xi32>
}
"""


def plex(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output + (getattr(result, "stderr", "") or "")


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> myelin.runtime.model.Model:
    """An entrypoint with an integer input: y = 2 * x (i32)."""
    root = tmp_path_factory.mktemp("twice")
    (root / "twice").mkdir()
    (root / "twice" / "twice.mlir").write_text(TWICE_MLIR)
    (root / "twice" / "plex.toml").write_text(
        '[package]\nname = "twice"\n\n[graph.twice]\nsource = "twice.mlir"\n'
    )
    (root / "app.toml").write_text('[app]\nname = "twice"\npackages = ["twice"]\n')
    model = myelin.Instance().load(build_app(root / "app.toml", root / "twice.mln"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def mlp(mlp_mln):
    model = myelin.Instance().load(mlp_mln)
    yield model
    model.close()


# --- Python lists: numpy's rules, as for arrays ------------------------------------------------


def test_an_integer_list_runs_exactly(twice):
    with twice.session() as s:
        y = s.call("twice", [1, -2, 2**30 - 1])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [2, -4, 2**31 - 2])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1.7, 1], "is a list of float64 values (1.7), expected int32"),
        ([-0.5], "is a list of float64 values (-0.5), expected int32"),
        (["3"], "is a list of strings ('3'), expected int32"),
        ([2**40], "value 1099511627776 is out of range for int32"),
    ],
    ids=["float", "negative-fraction", "string", "out-of-range"],
)
def test_a_list_numpy_would_not_cast_is_refused(twice, value, message):
    with twice.session() as s, pytest.raises(InputError) as caught:
        s.call("twice", value)
    assert message in str(caught.value)


def test_a_float_list_is_refused_as_a_float_array_is(twice):
    with twice.session() as s:
        for value in ([1.7, 1.0], np.array([1.7, 1.0])):
            with pytest.raises(InputError, match="float64"):
                s.call("twice", value)


def test_a_float_list_for_f32_overflows_only_past_f32s_max(mlp, mlp_weights):
    with mlp.session() as s:
        with pytest.raises(InputError, match="value 1e\\+40 overflows float32"):
            s.call("forward", [[1e40] * 16])
        s.call("forward", [[3.4028235e38] * 16])  # f32's max as written: accepted
        x = [[0.25 * i for i in range(16)]]
        expected = mlp_reference(mlp_weights, np.array(x, np.float32))[1]
        np.testing.assert_allclose(s.call("forward", x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_np_matrix_is_taken_as_an_ndarray_and_a_masked_array_refused(mlp, mlp_weights):
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 32
    with mlp.session() as s:
        y = s.call("forward", np.matrix(x))
        with pytest.raises(InputError, match="masked array"):
            s.call("forward", np.ma.masked_array(x, mask=x > 0.5))
    assert type(y) is np.ndarray
    np.testing.assert_allclose(y, mlp_reference(mlp_weights, x)[1], rtol=1e-5, atol=1e-5)


def test_cli_accepts_f32_max_and_refuses_past_it(mlp_mln):
    code, text = plex("run", mlp_mln, "-f", "forward", "--input", "1x16xf32=3.4028235e38")
    assert code == 0, text
    code, text = plex("run", mlp_mln, "-f", "forward", "--input", "1x16xf32=3.5e38")
    assert code == 1 and "value 3.5e38 overflows f32" in text, text


# --- memory formulas from the file ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("formula", "problem"),
    [
        (["sub", 0, ["mul", ["dim", 0, 0], 1 << 40]], "is negative"),
        (["mul", ["mul", ["mul", ["dim", 0, 0], 2**62], 2**62], 2**62], "exceeds 2^63 - 1"),
    ],
    ids=["negative", "overflow"],
)
def test_a_crafted_memory_formula_is_refused_not_a_bypass(mlp_mln, tmp_path, formula, problem):
    crafted = tmp_path / "crafted.mln"
    shutil.copy(mlp_mln, crafted)
    manifest = manifest_of(crafted)
    manifest["variants"][0]["entrypoints"][0]["memory"]["transient"] = formula
    replace_manifest(crafted, manifest)
    model = myelin.Instance().load(crafted, memory_budget=10_000)
    try:
        with model.session() as s, pytest.raises(ArtifactError) as caught:
            s.call("forward", np.ones((2, 16), np.float32))
    finally:
        model.close()
    assert f"forward: the artifact's memory plan gives transient bytes that {problem}" in str(
        caught.value
    )
    assert "inputs 2x16" in str(caught.value)


@pytest.mark.parametrize("verb", ["bench", "profile"])
def test_dim_sizes_past_memory_are_refused_before_allocating(mlp_mln, tmp_path, verb):
    extra = ["-o", str(tmp_path / "prof")] if verb == "profile" else []
    code, text = plex(verb, mlp_mln, "-f", "forward", "--dim", "*=5000000000000", *extra)
    assert code == 1, text
    assert "error: --dim: the random inputs of forward (x=5000000000000x16xf32)" in text, text
    assert "more than this machine's memory" in text
