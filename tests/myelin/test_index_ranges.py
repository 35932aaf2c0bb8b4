"""Out-of-range indices: the build records the valid range of every integer input that indexes a
table (any frontend, and the codecs' quantized gather), and the runtime refuses other values
before the call, where IREE would read out of bounds (garbage) or fault (SIGSEGV)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.errors import InputError
from myelin.mln import MlnReader
from tests.conftest import EXAMPLES, REPO, build_app

PLACEMENT_CPU_APP = """\
[app]
name = "embed-{codec}"
packages = ["placement"]

[devices.cpu]
target = "llvm-cpu"
{codec_table}
"""


def _placement_app(root: Path, codec: str) -> Path:
    """examples/placement on the CPU only, with every weight under `codec`."""
    package = root / "placement"
    package.mkdir(parents=True)
    for name in ("plex.toml", "embed.mlir", "blocks.mlir", "head.mlir", "params.safetensors"):
        shutil.copy(EXAMPLES / "placement" / name, package / name)
    table = f'[weights.codec]\n"*" = "{codec}"\n' if codec != "fp32" else ""
    (root / "app.toml").write_text(PLACEMENT_CPU_APP.format(codec=codec, codec_table=table))
    return root / "app.toml"


@pytest.fixture(scope="module", params=["fp32", "int8", "q4"])
def embed_mln(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"embed-{request.param}")
    return build_app(_placement_app(root, request.param), root / "embed.mln")


def _table() -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(str(EXAMPLES / "placement" / "params.safetensors"))["embed.table"]


def test_the_range_is_recorded_in_the_entrypoint_inputs(embed_mln: Path) -> None:
    with MlnReader(embed_mln) as reader:
        (entry,) = [
            e for e in reader.artifact_manifest.variants[0].entrypoints if e.name == "embed"
        ]
    assert entry.inputs[0].valid_range == (0, 256)
    assert reader.manifest["variants"][0]["entrypoints"][0]["inputs"][0]["range"] == [0, 256]


@pytest.mark.parametrize(
    ("ids", "bad", "at"),
    [([3, 100000000], 100000000, "[1]"), ([1000, 1], 1000, "[0]"), ([0, 256], 256, "[1]"),
     ([-1, 0], -1, "[0]")],
)  # fmt: skip
def test_out_of_range_ids_are_refused_before_the_call(
    embed_mln: Path, ids: list[int], bad: int, at: str
) -> None:
    model = myelin.Instance().load(embed_mln)
    with model.session() as session:
        with pytest.raises(InputError) as caught:
            session.call("embed", np.array(ids, dtype=np.int64))
        assert str(caught.value) == f"embed(ids): value {bad} at {at} is out of range [0, 256)"
        # the session stays usable, and in-range ids give the table's rows
        ok = np.array([0, 255, 7], dtype=np.int64)
        rows = session.call("embed", ok)
        tolerance = {"fp32": 0, "int8": 0.02, "q4": 0.1}[model.name.split("-")[1]]
        np.testing.assert_allclose(rows, _table()[ok], atol=tolerance)


def test_cli_run_gives_one_error_line_not_a_crash(embed_mln: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plex", "run", str(embed_mln), "-f", "embed",
         "--input", "2xi64=100000000"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: embed(ids): value 100000000 at [0] is out of range [0, 256)"
    )


GATHERS_PY = """
import numpy as np
import torch


class Lookups(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(100, 8)
        self.pos = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, ids, pos):
        return self.emb(ids) + self.pos[pos]


def build_torch():
    ids = torch.zeros(2, 5, dtype=torch.int64)
    return Lookups().eval(), (ids, ids)


def take(params, ids):
    import jax.numpy as jnp

    return jnp.take(params["t"], ids, axis=0)


def build_jax():
    t = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    return take, {"t": t}, (np.zeros((3,), np.int32),)
"""


def _onnx_gather(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(120, dtype=np.float32).reshape(30, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[table],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture(scope="module")
def frontends_mln(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    pytest.importorskip("onnx")
    root = tmp_path_factory.mktemp("gathers")
    package = root / "gathers"
    package.mkdir()
    (package / "model.py").write_text(GATHERS_PY)
    _onnx_gather(package / "gather.onnx")
    (package / "plex.toml").write_text(
        textwrap.dedent("""\
        [package]
        name = "gathers"

        [graph.t]
        source = "model.py:build_torch"
        frontend = "torch"

        [graph.j]
        source = "model.py:build_jax"
        frontend = "jax"

        [graph.o]
        source = "gather.onnx"
        """)
    )
    (root / "app.toml").write_text('[app]\nname = "gathers"\npackages = ["gathers"]\n')
    return build_app(root / "app.toml", root / "gathers.mln")


def test_each_frontend_records_the_range_its_lookup_accepts(frontends_mln: Path) -> None:
    """torch's embedding takes [0, n); indexing a tensor (torch), ONNX Gather and jnp.take
    normalize negative indices, so they take [-n, n)."""
    with MlnReader(frontends_mln) as reader:
        entries = {e.module: e for e in reader.artifact_manifest.variants[0].entrypoints}
    assert [i.valid_range for i in entries["t"].inputs] == [(0, 100), (-16, 16)]
    assert [i.valid_range for i in entries["j"].inputs] == [(-40, 40)]
    assert [i.valid_range for i in entries["o"].inputs] == [(-30, 30)]


def test_each_frontend_refuses_out_of_range_and_keeps_negative_indices(
    frontends_mln: Path,
) -> None:
    model = myelin.Instance().load(frontends_mln)
    with model.session() as s:
        ids = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 100]], dtype=np.int64)
        with pytest.raises(InputError, match=r"^t\.forward\(ids\): value 100 at \[1, 4\] is out"):
            s.call("t.forward", ids, np.zeros((2, 5), np.int64))
        with pytest.raises(InputError, match=r"\(pos\): value -17 at \[0, 0\] is out of range"):
            s.call("t.forward", np.zeros((2, 5), np.int64), np.full((2, 5), -17, np.int64))
        table = np.arange(120, dtype=np.float32).reshape(30, 4)
        got = s.call("o.forward", np.array([-30, 29, -1], dtype=np.int64))
        np.testing.assert_array_equal(got, table[[-30, 29, -1]])
        with pytest.raises(InputError, match=r"value 30 at \[1\] is out of range \[-30, 30\)"):
            s.call("o.forward", np.array([0, 30], dtype=np.int64))
        with pytest.raises(InputError, match=r"value -41 at \[2\] is out of range \[-40, 40\)"):
            s.call("j.forward", np.array([0, 1, -41], dtype=np.int32))


def test_indices_the_boundary_cannot_check_are_reported() -> None:
    """An index computed in the graph (here read from a weight) is reported unchecked, and a
    clamped one needs no check."""
    from myelin.compiler.index_ranges import index_ranges

    mlir = textwrap.dedent("""\
        func.func @f(%ids: tensor<4xi64>, %t: tensor<8xf32>) -> tensor<4xf32> {
          %perm = arith.constant dense<[3, 1, 2, 0]> : tensor<4xi64>
          %c0 = arith.constant 0 : i64
          %c7 = arith.constant 7 : i64
          %init = tensor.empty() : tensor<4xf32>
          %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>,
                                                affine_map<(d0) -> (d0)>],
                               iterator_types = ["parallel"]}
              ins(%ids, %perm : tensor<4xi64>, tensor<4xi64>) outs(%init : tensor<4xf32>) {
            ^bb0(%i: i64, %p: i64, %o: f32):
              %lo = arith.maxsi %i, %c0 : i64
              %clamped = arith.minsi %lo, %c7 : i64
              %a = arith.index_cast %clamped : i64 to index
              %b = arith.index_cast %p : i64 to index
              %x = tensor.extract %t[%a] : tensor<8xf32>
              %y = tensor.extract %t[%b] : tensor<8xf32>
              %s = arith.addf %x, %y : f32
              linalg.yield %s : f32
          } -> tensor<4xf32>
          return %r : tensor<4xf32>
        }
        """)
    (found,) = index_ranges(mlir.encode(), ["f"]).values()
    assert found.valid == {0: ((-(2**63), 2**63 - 1),)}  # clamped: every id is fine
    (why,) = found.unchecked
    assert "tensor.extract index 0" in why and "a tensor of constants or weights" in why


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (["0", 256], "must be two integers [lo, hi)"),
        ([0], "must be two integers [lo, hi)"),
        ([5, 5], "must satisfy -9223372036854775808 <= lo < hi <= 9223372036854775808"),
        ([0, 2**64], "must satisfy"),
        ("all", "must be a list"),
    ],
)
def test_a_crafted_range_is_refused_naming_the_field(
    tmp_path: Path, value: object, problem: str
) -> None:
    from myelin.errors import ArtifactError
    from tests.myelin.test_mln_format import manifest_of, replace_manifest

    root = tmp_path / "app"
    path = build_app(_placement_app(root, "fp32"), root / "embed.mln")
    manifest = manifest_of(path)
    entry = next(e for e in manifest["variants"][0]["entrypoints"] if e["name"] == "embed")
    entry["inputs"][0]["range"] = value
    replace_manifest(path, manifest)
    with pytest.raises(ArtifactError) as caught:
        MlnReader(path)
    assert "manifest field variants[0].entrypoints[0].inputs[0].range: " in str(caught.value)
    assert problem in str(caught.value)


def test_an_artifact_without_ranges_still_loads_and_checks_nothing(tmp_path: Path) -> None:
    """Files built before the check have no `range`: they load, and nothing is refused."""
    from tests.myelin.test_mln_format import manifest_of, replace_manifest

    root = tmp_path / "app"
    path = build_app(_placement_app(root, "fp32"), root / "embed.mln")
    manifest = manifest_of(path)
    for entry in manifest["variants"][0]["entrypoints"]:
        for spec in entry["inputs"]:
            spec.pop("range", None)
    replace_manifest(path, manifest)
    model = myelin.Instance().load(path)
    with model.session() as session:
        session.call("embed", np.array([3, 255], dtype=np.int64))  # in range: fine as before
    assert all(i.valid_range is None for e in model.variant_record.entrypoints for i in e.inputs)
