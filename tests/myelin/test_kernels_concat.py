"""The rotary embedding's concat as one elementwise op (myelin.kernels._concat), without a GPU:
IREE forms one dispatch for it where it formed two plus two copies, and the results are the
unrewritten graph's within one f16 rounding (both compiled for llvm-cpu and run here)."""

from __future__ import annotations

import numpy as np
import pytest

from myelin.compiler.pipeline import compile_module
from myelin.compiler.targets import TargetDevice
from myelin.kernels import apply_kernels
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir

T, H, D = 64, 4, 128
HALF = D // 2
_MUL = """
  %{r} = linalg.generic {{indexing_maps = [#id, #bc, #id], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%{a}, %{b} : tensor<64x4x64xf16>, tensor<64x64xf16>) outs(%e : tensor<64x4x64xf16>) {{
  ^bb0(%p: f16, %q: f16, %o: f16):
    %v = arith.mulf %p, %q : f16
    linalg.yield %v : f16
  }} -> tensor<64x4x64xf16>"""
_BIN = """
  %{r} = linalg.generic {{indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%{a}, %{b} : tensor<64x4x64xf16>, tensor<64x4x64xf16>) outs(%e : tensor<64x4x64xf16>) {{
  ^bb0(%p: f16, %q: f16, %o: f16):
    %v = arith.{op} %p, %q : f16
    linalg.yield %v : f16
  }} -> tensor<64x4x64xf16>"""
# rope: torch's rotate-half as the torch frontend lowers it (chunk, four products, a sum and a
# difference, concat); twice: also a concat of arguments and one whose operand has another use.
GRAPH = f"""
#id = affine_map<(t, h, d) -> (t, h, d)>
#bc = affine_map<(t, h, d) -> (t, d)>
func.func @rope(%x: tensor<64x4x128xf16>, %cos: tensor<64x64xf16>, %sin: tensor<64x64xf16>)
    -> tensor<64x4x128xf16> {{
  %x1 = tensor.extract_slice %x[0, 0, 0] [64, 4, 64] [1, 1, 1] : tensor<64x4x128xf16> to tensor<64x4x64xf16>
  %x2 = tensor.extract_slice %x[0, 0, 64] [64, 4, 64] [1, 1, 1] : tensor<64x4x128xf16> to tensor<64x4x64xf16>
  %e = tensor.empty() : tensor<64x4x64xf16>
  {_MUL.format(r="m1", a="x1", b="cos")}
  {_MUL.format(r="m2", a="x2", b="sin")}
  {_BIN.format(r="lo", a="m1", b="m2", op="subf")}
  {_MUL.format(r="m3", a="x1", b="sin")}
  {_MUL.format(r="m4", a="x2", b="cos")}
  {_BIN.format(r="hi", a="m3", b="m4", op="addf")}
  %c = tensor.concat dim(2) %lo, %hi : (tensor<64x4x64xf16>, tensor<64x4x64xf16>) -> tensor<64x4x128xf16>
  return %c : tensor<64x4x128xf16>
}}
func.func @args(%a: tensor<64x4x64xf16>, %b: tensor<64x4x64xf16>) -> tensor<64x4x128xf16> {{
  %c = tensor.concat dim(2) %a, %b : (tensor<64x4x64xf16>, tensor<64x4x64xf16>) -> tensor<64x4x128xf16>
  return %c : tensor<64x4x128xf16>
}}
func.func @shared(%a: tensor<64x4x64xf16>, %b: tensor<64x4x64xf16>)
    -> (tensor<64x4x128xf16>, tensor<64x4x64xf16>) {{
  %e = tensor.empty() : tensor<64x4x64xf16>
  {_BIN.format(r="s", a="a", b="b", op="addf")}
  {_BIN.format(r="d", a="a", b="b", op="subf")}
  %c = tensor.concat dim(2) %s, %d : (tensor<64x4x64xf16>, tensor<64x4x64xf16>) -> tensor<64x4x128xf16>
  return %c, %s : tensor<64x4x128xf16>, tensor<64x4x64xf16>
}}
"""
FUNCTIONS = ["rope", "args", "shared"]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    imported = import_mlir(tmp_path_factory.mktemp("concat"), GRAPH)
    return imported, apply_kernels(imported.module_bytecode, library="triton")


def test_only_concats_of_elementwise_results_are_rewritten(graphs):
    from myelin.compiler.session import CompilerSession
    from myelin.kernels._concat import fuse_concats

    imported, kernelized = graphs
    sites = [s for s in kernelized.sites if s["op"] == "concat"]
    assert [(s["function"], s["kernel"], s["operands"]) for s in sites] == [
        ("rope", "elementwise", 2)
    ]
    # the others stay IREE's, and say why
    with CompilerSession(["--iree-hal-target-device=cuda"]) as session:
        module = session.parse(imported.module_bytecode, what="g")
        with session.context:
            why = {c.function: c.reason for c in fuse_concats(module) if not c.fused}
    assert "not the result of a linalg.generic" in why["args"]
    assert "another use" in why["shared"]


def test_the_rope_concat_is_one_dispatch_and_no_copies(graphs):
    imported, kernelized = graphs
    before = [n for _, n in flow_dispatches(imported.module_bytecode, FUNCTIONS)[1] if "rope" in n]
    after = [n for _, n in flow_dispatches(kernelized.module_bytecode, FUNCTIONS)[1] if "rope" in n]
    # IREE's own: the two halves computed apart, then copied into the concat
    assert sum("elementwise_64x4x64" in name for name in before) == 2, before
    assert len({name for name in before if "slow_memcpy" in name}) == 2, before
    assert after == ["rope_dispatch_0_elementwise_broadcast_64x4x2x64_f16"]


def _run(module_bytecode: bytes, args: list[np.ndarray]) -> np.ndarray:
    import iree.runtime as rt

    compiled = compile_module(
        module_bytecode,
        phase="input",
        devices=[TargetDevice("cpu", target="llvm-cpu")],
        functions=["rope"],
    )
    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, compiled.vmfb))
    return np.asarray(ctx.modules.g["rope"](*args))


def test_the_results_equal_the_unrewritten_graphs_within_one_rounding(graphs):
    imported, kernelized = graphs
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, H, D)).astype(np.float16)
    angle = rng.uniform(0, 6.3, (T, HALF))
    cos, sin = np.cos(angle).astype(np.float16), np.sin(angle).astype(np.float16)
    before = _run(imported.module_bytecode, [x, cos, sin]).astype(np.float32)
    after = _run(kernelized.module_bytecode, [x, cos, sin]).astype(np.float32)
    assert after.shape == (T, H, D)
    x1, x2 = x[..., :HALF].astype(np.float32), x[..., HALF:].astype(np.float32)
    c, s = cos[:, None, :].astype(np.float32), sin[:, None, :].astype(np.float32)
    ref = np.concatenate((x1 * c - x2 * s, x1 * s + x2 * c), axis=-1)
    # the same ops per element; IREE's CPU codegen contracts a product and a sum into an fma in
    # one form and not the other in some lanes: apart by the rounding of the products (one f16
    # ulp of their magnitude each) at most
    size = np.concatenate((abs(x1 * c) + abs(x2 * s), abs(x1 * s) + abs(x2 * c)), axis=-1)
    ulp = np.spacing(size.astype(np.float16)).astype(np.float32)
    assert (np.abs(after - before) <= 2 * ulp).all()
    assert np.mean(after == before) > 0.75  # most lanes to the bit
    # both are the rotation: fp32 reference, f16 rounding of the products and the sum
    for got in (before, after):
        assert np.abs(got - ref).max() <= 4e-3 * np.abs(ref).max()
