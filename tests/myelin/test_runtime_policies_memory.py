"""Memory admission: the need of a call is known before it runs (derived from the compiled
module's Stream IR at build time), matches what IREE really allocates (iree-profile memory
events), and a call that cannot fit the budget is refused with MemoryBudgetExceeded."""

from __future__ import annotations

import numpy as np
import pytest

import myelin
from myelin.errors import MemoryBudgetExceeded, MemoryNeedUnknown
from myelin.mln import MlnReader, MlnWriter
from myelin.runtime.profiling import capture
from myelin.size_formulas import evaluate_size
from tests.conftest import EXAMPLES, build_app
from tests.models import mlp_reference
from tests.myelin.runtime_policies_models import build_chain, chain_reference

POOL_ALIGNMENT = 64  # IREE's pool rounds each reservation up to this


@pytest.fixture(scope="module")
def chain_mln(tmp_path_factory):
    return build_chain(tmp_path_factory.mktemp("chain-memory"))


@pytest.fixture(scope="module")
def budgeted_mlp(tmp_path_factory):
    """The example MLP built with `[runtime] memory = "256KiB"`."""
    import shutil

    root = tmp_path_factory.mktemp("mlp-budget")
    shutil.copytree(EXAMPLES / "mlp", root / "mlp", ignore=shutil.ignore_patterns("*.mln"))
    app = root / "mlp" / "app.toml"
    app.write_text(app.read_text() + '\n[runtime]\nmemory = "256KiB"\n')
    return build_app(app, root / "mlp.mln")


def aligned(n: int) -> int:
    return -(-n // POOL_ALIGNMENT) * POOL_ALIGNMENT


def test_the_artifact_records_size_formulas_of_the_input_dims(mlp_mln):
    with MlnReader(mlp_mln) as r:
        entries = {e["name"]: e for e in r.manifest["variants"][0]["entrypoints"]}
    forward = entries["forward"]["memory"]
    # forward(x: ?x16): the hidden ?x32 f32 activations are transient, the ?x8 result external
    assert forward["transient"] == ["mul", ["dim", 0, 0], 128]
    assert forward["results"] == ["mul", ["dim", 0, 0], 32]
    assert sorted(map(tuple, forward["parameters"])) == [
        ("mlp", "b1"),
        ("mlp", "b2"),
        ("mlp", "w1"),
        ("mlp", "w2"),
    ]
    assert evaluate_size(forward["transient"], [(1000, 16)]) == 1000 * 32 * 4


@pytest.mark.parametrize(("which", "batch"), [("mlp", 64), ("mlp", 1000), ("chain", 512)])
def test_predicted_need_equals_what_iree_allocates(mlp_mln, chain_mln, tmp_path, which, batch):
    """iree-profile's pool high water covers the parameters (the tool loads them into the pool)
    and the call's queue-ordered transients and results: the latter are what we predict."""
    path, width = (mlp_mln, 16) if which == "mlp" else (chain_mln, 256)
    model = myelin.Instance().load(path)
    x = np.random.default_rng(batch).standard_normal((batch, width)).astype(np.float32)
    need = model.call_need("forward", [x])
    params = sum(aligned(p["length"]) for p in model.manifest["parameters"])
    model.close()
    measured = capture(path, "forward", [x], tmp_path).memory_high_water
    predicted = aligned(need.transient) + aligned(need.results)
    print(
        f"{which} batch {batch}: predicted {predicted} B, measured {measured - params} B "
        f"(+ {params} B of parameters)"
    )
    assert measured - params == predicted


def test_a_call_over_the_budget_is_refused_before_it_runs(budgeted_mlp, mlp_weights):
    model = myelin.Instance().load(budgeted_mlp)
    assert model.policies["memory_budget"] == 256 * 1024
    assert model.budget.limit == 256 * 1024
    big = np.ones((2000, 16), np.float32)
    with model.session() as s:
        with pytest.raises(MemoryBudgetExceeded) as info:
            s.call("forward", big)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(
            "forward: needs 437.5 KiB (inputs 125.0 KiB + transient 250.0 KiB + results "
            "62.5 KiB) but the memory budget leaves 252.8 KiB after 3.2 KiB of parameters "
            "(budget 256.0 KiB)"
        )
        assert model.budget.peak_in_flight == 0  # nothing was reserved, nothing ran
        x = np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32)
        np.testing.assert_allclose(
            s.call("forward", x), mlp_reference(mlp_weights, x)[1], rtol=1e-5, atol=1e-6
        )
    assert model.budget.in_flight == 0


def test_parameters_larger_than_the_budget_fail_at_load(chain_mln):
    with pytest.raises(
        MemoryBudgetExceeded,
        match=r"its parameters need 256\.0 KiB but the memory budget is 100\.0 KiB",
    ):
        myelin.Instance().load(chain_mln, memory_budget="100KiB")


def test_a_load_argument_overrides_the_artifact_budget(budgeted_mlp):
    model = myelin.Instance().load(budgeted_mlp, memory_budget=None)
    assert model.budget is None
    with model.session() as s:
        assert s.call("forward", np.ones((2000, 16), np.float32)).shape == (2000, 8)


def test_an_artifact_without_a_memory_plan_refuses_budgeted_calls(chain_mln, tmp_path):
    """A budget is never enforced by guessing: no recorded plan, no budgeted call."""
    old = tmp_path / "no-plan.mln"
    with MlnReader(chain_mln) as reader:
        manifest = {k: v for k, v in reader.manifest.items() if k not in ("format", "sections")}
        for variant in manifest["variants"]:
            for entry in variant["entrypoints"]:
                del entry["memory"]
        writer = MlnWriter(manifest)
        for name, section in reader.sections.items():
            writer.add_section(
                name, section.kind, np.frombuffer(bytes(reader.section_view(name)), np.uint8)
            )
        writer.write(old)
    x = np.ones((4, 256), np.float32)
    model = myelin.Instance().load(old, memory_budget="64MiB")
    with model.session() as s, pytest.raises(MemoryNeedUnknown, match="rebuild it"):
        s.call("forward", x)
    unbudgeted = myelin.Instance().load(old)
    with unbudgeted.session() as s:
        assert np.abs(s.call("forward", x) - chain_reference(x)).max() < 1e-5
