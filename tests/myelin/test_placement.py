"""Placement on two local-task CPU devices: dispatches land where the placement says (checked in
the compiled IR), results are right, and a dispatch with mixed affinities is refused."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.compiler.pipeline import ImportedGraph, compile_module, import_graph
from myelin.compiler.placement import PlacementRule, resolve_placement
from myelin.compiler.targets import TargetDevice
from myelin.errors import CompileError
from plex.builder import build
from plex.errors import BuildError, ManifestError
from tests.models import mlp_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TWO_CPUS = [TargetDevice("cpu0"), TargetDevice("cpu1")]

# x on cpu0, w on cpu1, one matmul reading both: IREE would silently pick a device.
MIXED_ARGUMENTS = """\
module @mixed {
  func.func @f(%x: tensor<8x8xf32> {iree.abi.affinity = #hal.device.promise<@cpu0>},
               %w: tensor<8x8xf32> {iree.abi.affinity = #hal.device.promise<@cpu1>}) -> tensor<8x8xf32> {
    %c0 = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<8x8xf32>
    %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<8x8xf32>) -> tensor<8x8xf32>
    %m = linalg.matmul ins(%x, %w : tensor<8x8xf32>, tensor<8x8xf32>) outs(%f : tensor<8x8xf32>) -> tensor<8x8xf32>
    return %m : tensor<8x8xf32>
  }
}
"""

# A two-device chain: explicit transfers make every dispatch's sources agree.
TRANSFERS = """\
module @chain {
  func.func @f(%x: tensor<16x16xf32> {iree.abi.affinity = #hal.device.promise<@cpu0>},
               %w: tensor<16x16xf32> {iree.abi.affinity = #hal.device.promise<@cpu1>})
      -> (tensor<16x16xf32> {iree.abi.affinity = #hal.device.promise<@cpu0>}) {
    %c0 = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<16x16xf32>
    %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<16x16xf32>) -> tensor<16x16xf32>
    %sq = linalg.matmul ins(%x, %x : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
    %t = flow.tensor.transfer %sq : tensor<16x16xf32> to #hal.device.promise<@cpu1>
    %m = linalg.matmul ins(%t, %w : tensor<16x16xf32>, tensor<16x16xf32>) outs(%f : tensor<16x16xf32>) -> tensor<16x16xf32>
    %back = flow.tensor.transfer %m : tensor<16x16xf32> to #hal.device.promise<@cpu0>
    return %back : tensor<16x16xf32>
  }
}
"""

_EXECUTE = re.compile(r"stream\.cmd\.execute on\(#hal\.device\.affinity<@(\w+)>\)")
_DISPATCH = re.compile(r"stream\.cmd\.dispatch @(\w+)::")
_FUNCTION = re.compile(r"util\.func public @(\w+)\(")


def dispatch_devices(stream_ir: str) -> dict[str, set[tuple[str, str]]]:
    """public function -> {(dispatch executable, device of the stream.cmd.execute holding it)}."""
    out: dict[str, set[tuple[str, str]]] = {}
    function = device = None
    for line in stream_ir.splitlines():
        if m := _FUNCTION.search(line):
            function, device = m.group(1), None
            out[function] = set()
        elif m := _EXECUTE.search(line):
            device = m.group(1)
        elif (m := _DISPATCH.search(line)) and function is not None:
            out[function].add((m.group(1), device))
    return out


def phases(imported: ImportedGraph, placement: list[PlacementRule], stop_at: str) -> dict[str, str]:
    texts: dict[str, str] = {}
    compile_module(
        imported.module_bytecode,
        phase="input",
        devices=TWO_CPUS,
        placement=placement,
        stop_at=stop_at,
        on_phase=lambda phase, text: texts.__setitem__(phase, text),
    )
    return texts


@pytest.fixture(scope="module")
def imported_mlp() -> ImportedGraph:
    return import_graph(
        EXAMPLES / "mlp" / "mlp.mlir", input_type="auto", module_name="mlp", scope="mlp.mlp"
    )


def imported(text: str, name: str) -> ImportedGraph:
    return import_graph(
        text.encode(),
        input_type="auto",
        module_name=name,
        scope=name,
        source_name=f"{name}.mlir",
    )


def test_dispatches_land_on_the_placed_devices(imported_mlp):
    placement = [("hidden", "cpu0"), ("forward", "cpu1")]
    texts = phases(imported_mlp, placement, stop_at="stream")
    # PLeX's pass copied each dispatch's one resolved affinity onto it.
    dispatch_ir = texts["dispatch-creation"]
    assert dispatch_ir.count("flow.dispatch.workgroups") == 2
    assert "stream.affinity = #hal.device.affinity<@cpu0>" in dispatch_ir
    assert "stream.affinity = #hal.device.affinity<@cpu1>" in dispatch_ir
    # In the Stream IR each dispatch runs on the device its function is placed on: forward's own
    # matmul on cpu1, the hidden layer it calls on cpu0 (Stream copies between them).
    stream_ir = texts["stream"]
    assert dispatch_devices(stream_ir) == {
        "hidden": {("_hidden_dispatch_0", "cpu0")},
        "forward": {("_hidden_dispatch_0", "cpu0"), ("_forward_dispatch_0", "cpu1")},
    }
    assert "stream.cmd.copy" in stream_ir.split("util.func public @forward")[1]
    # Arguments and results of a placed function live on its device.
    forward = stream_ir.split("util.func public @forward")[1]
    assert "stream.tensor.import on(#hal.device.affinity<@cpu1>)" in forward
    assert "stream.tensor.export on(#hal.device.affinity<@cpu1>)" in forward


def test_a_whole_graph_placed_on_the_second_device(imported_mlp):
    stream_ir = phases(imported_mlp, [(None, "cpu1")], stop_at="stream")["stream"]
    assert {d for pairs in dispatch_devices(stream_ir).values() for _, d in pairs} == {"cpu1"}
    assert "on(#hal.device.affinity<@cpu0>)" not in stream_ir


def test_mixed_argument_affinities_are_refused_naming_the_ops():
    with pytest.raises(CompileError) as error:
        compile_module(
            imported(MIXED_ARGUMENTS, "mixed").module_bytecode,
            phase="input",
            devices=TWO_CPUS,
            what="graph mixed",
        )
    message = str(error.value)
    assert "dispatch 0 of @f (linalg.matmul at mixed.mlir:7:10)" in message
    assert "argument 'input0' on @cpu0 at mixed.mlir:2:3; argument 'input1' on @cpu1" in message
    assert "\n" not in message


def test_a_transfer_against_the_function_placement_is_refused():
    # f is placed on cpu1 but moves x to cpu0 before its matmul: IREE would run the matmul on
    # cpu1 and ignore the transfer's intent.
    source = (
        MIXED_ARGUMENTS.replace(" {iree.abi.affinity = #hal.device.promise<@cpu0>}", "")
        .replace(" {iree.abi.affinity = #hal.device.promise<@cpu1>}", "")
        .replace(
            "    %c0 = arith.constant",
            "    %xt = flow.tensor.transfer %x : tensor<8x8xf32> to #hal.device.promise<@cpu0>\n"
            "    %c0 = arith.constant",
        )
        .replace("ins(%x, %w", "ins(%xt, %w")
    )
    with pytest.raises(
        CompileError,
        match=r"function @f on @cpu1 .*; flow.tensor.transfer on "
        r"@cpu0 at transfer.mlir:4:11",
    ):
        compile_module(
            imported(source, "transfer").module_bytecode,
            phase="input",
            devices=TWO_CPUS,
            placement=[("f", "cpu1")],
        )


def test_transfers_that_agree_compile_and_run_on_two_devices(tmp_path):
    stream_ir = phases(imported(TRANSFERS, "chain"), [], stop_at="stream")["stream"]
    assert dispatch_devices(stream_ir)["f"] == {("f_dispatch_0", "cpu0"), ("f_dispatch_1", "cpu1")}
    app = write_app(tmp_path, "chain", TRANSFERS)
    model = myelin.Instance().load(build(app, tmp_path / "chain.mln").output)
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    with model.session() as s:
        np.testing.assert_allclose(s.call("f", x, w), (x @ x) @ w, rtol=1e-5, atol=1e-4)


def test_resolve_placement_rules():
    rules = [(None, "cpu0"), ("for*", "cpu1"), ("forward", "cpu0"), ("hidden", "gpu")]
    placed = resolve_placement(rules, ["hidden", "forward"], ["cpu0", "cpu1"])
    # function rules beat the module rule, the first matching rule wins, rules for devices the
    # variant lacks are skipped
    assert placed.module_device == "cpu0"
    assert dict(placed.function_devices) == {"forward": "cpu1"}
    assert placed.device_of("hidden", "cpu1") == "cpu0"
    with pytest.raises(CompileError, match=r"'backward' matches none; .* hidden, forward"):
        resolve_placement([("backward", "cpu0")], ["hidden", "forward"], ["cpu0"])


# -- through plex build -----------------------------------------------------------------------------

APP = """\
[app]
name = "placed"
packages = ["{pkg}"]

[devices.cpu0]
target = "llvm-cpu"
data_tiling = false

[devices.cpu1]
target = "llvm-cpu"
data_tiling = false

[[variant]]
name = "two"
devices = ["cpu0", "cpu1"]

[[variant]]
name = "one"
devices = ["cpu1"]

[placement]
"mlp.hidden" = "cpu0"
mlp = "cpu1"
"""


@pytest.fixture(scope="module")
def placed_mln(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("placed")
    (root / "app.toml").write_text(APP.format(pkg=EXAMPLES / "mlp"))
    return build(root / "app.toml", root / "placed.mln").output


def test_placed_build_records_devices_and_computes_right(placed_mln, mlp_weights):
    model = myelin.Instance().load(placed_mln)
    assert model.variant_name == "two"
    devices = {e["name"]: e["device"] for e in model.variant["entrypoints"]}
    assert devices == {"hidden": "cpu0", "forward": "cpu1"}
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    h, y = mlp_reference(mlp_weights, x)
    with model.session() as s:
        np.testing.assert_allclose(s.call("forward", x), y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s.call("hidden", x), h, rtol=1e-5, atol=1e-5)
        hidden = s.call("hidden", x, output="device")
        assert hidden._device is model.hal_device("cpu0") is not model.hal_device("cpu1")
        del hidden
    # In a variant without cpu0, its rule is skipped and everything runs on the one device.
    one = myelin.Instance().load(placed_mln, variant="one")
    assert {e["device"] for e in one.variant["entrypoints"]} == {"cpu1"}


def test_two_local_task_devices_are_distinct(placed_mln):
    model = myelin.Instance().load(placed_mln)
    assert [d["driver"] for d in model.variant["devices"]] == ["local-task", "local-task"]
    assert len(model.devices) == 2 and model.devices[0] is not model.devices[1]


def write_app(root: Path, name: str, source: str) -> Path:
    """An app of one MLIR graph on two local-task devices (cpu0 first, the default)."""
    package = root / name
    package.mkdir()
    (package / f"{name}.mlir").write_text(source)
    (package / "plex.toml").write_text(
        f'[package]\nname = "{name}"\n\n[graph.{name}]\nsource = "{name}.mlir"\n'
    )
    (root / "app.toml").write_text(
        textwrap.dedent(f"""\
        [app]
        name = "{name}"
        packages = ["{name}"]

        [devices.cpu0]
        target = "llvm-cpu"
        data_tiling = false

        [devices.cpu1]
        target = "llvm-cpu"
        data_tiling = false
        """)
    )
    return root / "app.toml"


def test_plex_build_refuses_mixed_affinities(tmp_path):
    app = write_app(tmp_path, "mixed", MIXED_ARGUMENTS)
    with pytest.raises(
        BuildError, match=r"mixed/mixed.mlir:7:10\) reads from sources on different"
    ):
        build(app, tmp_path / "mixed.mln")


def test_placement_naming_no_graph_is_a_manifest_error(tmp_path):
    (tmp_path / "app.toml").write_text(
        APP.format(pkg=EXAMPLES / "mlp") + '"mpl.forward" = "cpu0"\n'
    )
    with pytest.raises(
        ManifestError,
        match=r"app.toml:24: \[placement\] \"mpl.forward\": 'mpl' "
        "matches no graph or shard module",
    ):
        build(tmp_path / "app.toml", tmp_path / "x.mln")


def test_placement_naming_no_function_is_a_build_error(tmp_path):
    (tmp_path / "app.toml").write_text(APP.format(pkg=EXAMPLES / "mlp") + '"mlp.forwad" = "cpu0"\n')
    with pytest.raises(BuildError, match="placement of functions 'forwad' matches none"):
        build(tmp_path / "app.toml", tmp_path / "x.mln")
