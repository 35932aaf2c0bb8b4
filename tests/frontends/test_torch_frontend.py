"""The PyTorch frontend through `plex build` and the MyeLiN runtime: small real models, compared
with torch eager, plus the workarounds it applies and the one-line errors it gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("iree.turbine")

import myelin  # noqa: E402
from myelin.errors import InputError  # noqa: E402
from plex.errors import BuildError, ManifestError  # noqa: E402
from tests.conftest import build_app  # noqa: E402

RTOL = 1e-5  # fp32, same math as torch, different summation order

MLP_PY = """
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def model():
    torch.manual_seed(0)
    return MLP().eval()


def build():
    return model(), (torch.randn(4, 16),)
"""

# Models that hit the known defects between torch, turbine and IREE 3.13: each entrypoint
# returns a wrong answer or fails to build without the frontend's workaround.
GUARDS_PY = """
import torch


class Guards(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 2.0, 8))

    def compare(self, x):
        # float constant vs *int* scalar: IREE folds these to False (see _torch_fixes.py, fix 2)
        c = x.new_full((), 2.0)
        keep = torch.logical_and(c > 1, x > 0.0)
        also = torch.logical_and(c >= 2, x > 0.0)
        return torch.where(keep, x, -x) * self.scale, torch.where(also, 1.0, 0.0)

    def masks(self, x):
        # bool & | and torch.diff: composite ops turbine leaves undecomposed (Hugging Face masks)
        m = ((x > 0.0) & (x < 1.0)) | (x > 1.5)
        return torch.where(m, x, 0.0), torch.diff(x, dim=-1)

    def two_caches(self, k, v):
        # the example passes one tensor for both: torch.export would merge the two inputs
        return k * 2.0 + v


def build():
    g = Guards()
    x = torch.linspace(-2.0, 2.0, 16).reshape(2, 8)
    cache = torch.zeros(2, 8)
    return {
        "compare": (g.compare, (x,)),
        "masks": (g.masks, (x,)),
        "two_caches": (g.two_caches, (cache, cache)),
    }
"""


def write_package(folder: Path, files: dict[str, str], toml: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    (folder / "plex.toml").write_text(textwrap.dedent(toml))
    return folder


def write_app(root: Path, packages: list[str]) -> Path:
    app = root / "app.toml"
    app.write_text(f'[app]\nname = "t"\npackages = {packages!r}\n'.replace("'", '"'))
    return app


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    """One app, two torch graphs: the MLP (one function, dynamic batch) and the guards (a dict
    of three entrypoints of one module)."""
    root = tmp_path_factory.mktemp("torch-small")
    pkg = write_package(
        root / "tsmall",
        {"mlp.py": MLP_PY, "guards.py": GUARDS_PY},
        """\
        [package]
        name = "tsmall"

        [graph.mlp]
        source = "mlp.py:build"
        frontend = "torch"
        dynamic = { x = { 0 = "batch" } }

        [graph.guards]
        source = "guards.py:build"
        frontend = "torch"
        dynamic = { k = { 0 = "rows" }, v = { 0 = "rows" } }
        """,
    )
    mln = build_app(write_app(root, ["tsmall"]), root / "small.mln")
    return mln, pkg


@pytest.fixture(scope="module")
def small_model(small):
    model = myelin.Instance().load(small[0])
    yield model
    model.close()


def load_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"ref_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def entrypoint(model, name: str) -> dict:
    return next(e for e in model.manifest["variants"][0]["entrypoints"] if e["name"] == name)


@pytest.mark.parametrize("batch", [1, 3, 17, 64])
def test_mlp_with_dynamic_batch_matches_torch_eager(small, small_model, batch):
    reference = load_module(small[1] / "mlp.py").model()
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    with small_model.session() as s:
        y = s.call("forward", x)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    assert y.shape == (batch, 8)
    assert rel_err(y, want) < RTOL


def test_one_function_is_named_forward_and_its_batch_is_dynamic(small_model):
    forward = entrypoint(small_model, "forward")
    (x,) = forward["inputs"]
    assert (x["name"], x["dtype"], x["shape"]) == ("x", "float32", [None, 16])
    assert forward["outputs"][0]["shape"] == [None, 8]


def test_dynamic_dims_carry_their_manifest_names_and_equal_names_must_match(small_model):
    (x,) = entrypoint(small_model, "forward")["inputs"]
    assert x["dims"] == ["batch", 16]
    k, v = entrypoint(small_model, "two_caches")["inputs"]
    assert (k["dims"], v["dims"]) == (["rows", 8], ["rows", 8])
    with small_model.session() as s:
        call = s.resolve("two_caches")
        assert "k: float32[rows, 8]" in call.signature.describe()
        a = np.ones((3, 8), np.float32)
        np.testing.assert_allclose(call(a, a), 3.0 * a)
        with pytest.raises(
            InputError,
            match=r"'v' has size 5 in dimension 0 \('rows'\), but 'k' "
            r"has 3 .*dimensions named 'rows' must be equal",
        ):
            call(a, np.ones((5, 8), np.float32))


def test_weights_are_named_parameters_in_the_graph_scope(small, small_model):
    reference = load_module(small[1] / "mlp.py").model()
    params = {p["key"]: p for p in small_model.manifest["parameters"] if p["scope"] == "tsmall.mlp"}
    assert set(params) == set(reference.state_dict())
    assert params["fc1.weight"]["shape"] == [64, 16]

    from myelin.mln import MlnReader

    weight = reference.fc1.weight.detach().numpy().tobytes()
    with MlnReader(small[0]) as r:
        stored = bytes(r.section_view(params["fc1.weight"]["section"]))
        modules = [bytes(r.section_view(s.name)) for s in r.sections.values() if s.kind == "module"]
    assert stored == weight
    assert not any(weight[:256] in m for m in modules)  # never inlined


def test_a_dict_gives_several_entrypoints_sharing_parameters(small_model):
    names = {e["name"] for e in small_model.manifest["variants"][0]["entrypoints"]}
    assert {"compare", "masks", "two_caches"} <= names
    guards = [p["key"] for p in small_model.manifest["parameters"] if p["scope"] == "tsmall.guards"]
    assert guards == ["scale"]


def test_float_vs_int_scalar_comparison_is_not_miscompiled(small, small_model):
    guards = load_module(small[1] / "guards.py").Guards()
    x = np.linspace(-2.0, 2.0, 16, dtype=np.float32).reshape(2, 8)
    with small_model.session() as s:
        got = s.call("compare", x)
    with torch.no_grad():
        want = [t.numpy() for t in guards.compare(torch.from_numpy(x))]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    assert want[1].sum() == 8  # the comparisons are true for x > 0: a folded False shows


def test_bool_masks_and_diff_compile_and_match(small, small_model):
    guards = load_module(small[1] / "guards.py").Guards()
    x = np.random.default_rng(0).uniform(-2, 2, (2, 8)).astype(np.float32)
    with small_model.session() as s:
        got = s.call("masks", x)
    with torch.no_grad():
        want = [t.numpy() for t in guards.masks(torch.from_numpy(x))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_aliased_example_inputs_stay_two_inputs(small_model):
    k = np.arange(16, dtype=np.float32).reshape(2, 8)
    v = np.full((2, 8), 100.0, dtype=np.float32)
    with small_model.session() as s:
        np.testing.assert_array_equal(s.call("two_caches", k, v), k * 2.0 + v)


# -- errors: one line, naming the problem and where ----------------------------------------------

BAD_PY = """
import torch


class Inverse(torch.nn.Module):
    def forward(self, x):
        y = x * 2.0
        return torch.linalg.inv(y)


class Reshapes(torch.nn.Module):
    def forward(self, x):
        return x.reshape(4, 4) + 1.0


def inverse():
    return Inverse(), (torch.eye(4),)


def reshapes():
    return Reshapes(), (torch.ones(4, 4),)


def not_a_model():
    return "model.onnx"


def broken():
    raise ValueError("checkpoint missing")
"""


@pytest.mark.parametrize(
    ("function", "dynamic", "message"),
    [
        ("inverse", "", "op aten.linalg_inv (bad.py:8) has no lowering in IREE's torch input"),
        ("not_a_model", "", "bad.py:not_a_model returned a builtins.str for entrypoint 'forward'"),
        ("broken", "", "bad.py:broken raised ValueError: checkpoint missing (bad.py:29)"),
        ("missing", "", "bad.py defines no 'missing'"),
        ("reshapes", 'dynamic = { x = { 0 = "n" } }', "but the model fixes it to 4"),
        ("inverse", 'dynamic = { y = { 0 = "n" } }', "dynamic names argument 'y'"),
    ],
)
def test_unsupported_ops_and_sources_are_one_line_build_errors(
    tmp_path, function, dynamic, message
):
    write_package(
        tmp_path / "bad",
        {"bad.py": BAD_PY},
        f"""\
        [package]
        name = "bad"

        [graph.g]
        source = "bad.py:{function}"
        frontend = "torch"
        {dynamic}
        """,
    )
    with pytest.raises(BuildError) as info:
        build_app(write_app(tmp_path, ["bad"]), tmp_path / "bad.mln")
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_dynamic_is_refused_for_an_mlir_source(tmp_path):
    from plex.manifest import load_package

    (tmp_path / "m.mlir").write_text("module {}\n")
    (tmp_path / "plex.toml").write_text(
        '[package]\nname = "m"\n[graph.g]\nsource = "m.mlir"\ndynamic = { x = { 0 = "b" } }\n'
    )
    with pytest.raises(ManifestError, match="declares its dynamic dims in its own types"):
        load_package(tmp_path)


def test_a_linked_module_of_the_package_keys_the_import_and_is_re_read(tmp_path):
    """examples/pipeline builds from examples/llama's layers through a link in its folder: the
    linked file's content is in the import key, and an edit of it is seen by the next import."""
    from myelin.frontends._torch_source import imported_source
    from plex.builder import plan_for

    shared = tmp_path / "shared.py"
    shared.write_text("SCALE = 1\n")
    write_package(
        tmp_path / "p",
        {"mlp.py": "import helpers\n" + MLP_PY},
        '[package]\nname = "p"\n[graph.g]\nsource = "mlp.py:build"\nfrontend = "torch"\n',
    )
    (tmp_path / "p" / "helpers.py").symlink_to(shared)
    app = write_app(tmp_path, ["p"])

    def key_and_scale() -> tuple[str, int]:
        _, plan = plan_for(app, tmp_path / "out.mln")
        with imported_source(tmp_path / "p" / "mlp.py") as module:
            return plan.nodes["import:p:g"].inputs["python_sources"], module.helpers.SCALE

    before = key_and_scale()
    shared.write_text("SCALE = 2\n")
    after = key_and_scale()
    assert before[0] != after[0]
    assert (before[1], after[1]) == (1, 2)


def test_editing_any_python_file_of_the_package_changes_the_import_key(tmp_path):
    from plex.builder import plan_for

    write_package(
        tmp_path / "p",
        {"mlp.py": MLP_PY, "helpers.py": "SCALE = 1\n"},
        '[package]\nname = "p"\n[graph.g]\nsource = "mlp.py:build"\nfrontend = "torch"\n',
    )
    app = write_app(tmp_path, ["p"])

    def import_inputs() -> dict:
        _, plan = plan_for(app, tmp_path / "out.mln")
        return dict(plan.nodes["import:p:g"].inputs)

    before = import_inputs()
    (tmp_path / "p" / "helpers.py").write_text("SCALE = 2\n")
    after = import_inputs()
    assert before["source"] == after["source"]  # the entry file did not change
    assert before["python_sources"] != after["python_sources"]
