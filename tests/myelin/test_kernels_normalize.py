"""The IR-level normal forms the kernels step makes before matching (no GPU needed): linears
lowered as batched contractions become one 2-D matmul between a collapse and an expand
(myelin.kernels._normalize), in every form the frontends write them: a `linalg.batch_matmul`
whose weight is broadcast by `linalg.broadcast` or by a `linalg.generic`, a `linalg.generic`
contraction, the weight stored [k, n] or [n, k], f16 and bf16, static and dynamic row counts,
with and without the narrowing `truncf` and a bias add. The matmul kernels then take them, and
the normal form computes what the written form does (both compiled for llvm-cpu and run here).

Attention written by hand (myelin.kernels._attention_ir) is checked on real exports in
tests/plex/test_kernels_zoo_forms.py; here, the reasons given where it is not rewritten.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("triton")

from myelin.compiler.pipeline import compile_module
from myelin.compiler.targets import TargetDevice
from myelin.kernels import apply_kernels, normalize_contractions
from tests.myelin.kernels_helpers import import_mlir

_FILL = """
  %z = arith.constant 0.0 : f32
  %oe = tensor.empty({dyn}) : {out}
  %of = linalg.fill ins(%z : f32) outs(%oe : {out}) -> {out}"""
GRAPH = f"""
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#bias = affine_map<(d0, d1, d2) -> (d2)>
#bnk = affine_map<(d0, d1, d2) -> (d2, d1)>
#a4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>
#wnk = affine_map<(d0, d1, d2, d3) -> (d2, d3)>
#o4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
func.func @broadcast_kn(%x: tensor<?x?x64xf16>, %w: tensor<64x32xf16>, %bias: tensor<32xf16>)
    -> tensor<?x?x32xf16> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %b = tensor.dim %x, %c0 : tensor<?x?x64xf16>
  %s = tensor.dim %x, %c1 : tensor<?x?x64xf16>
  %we = tensor.empty(%b) : tensor<?x64x32xf16>
  %wb = linalg.broadcast ins(%w : tensor<64x32xf16>) outs(%we : tensor<?x64x32xf16>) dimensions = [0]
  {_FILL.format(dyn="%b, %s", out="tensor<?x?x32xf32>")}
  %mm = linalg.batch_matmul ins(%x, %wb : tensor<?x?x64xf16>, tensor<?x64x32xf16>)
      outs(%of : tensor<?x?x32xf32>) -> tensor<?x?x32xf32>
  %te = tensor.empty(%b, %s) : tensor<?x?x32xf16>
  %t = linalg.generic {{indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%mm : tensor<?x?x32xf32>) outs(%te : tensor<?x?x32xf16>) {{
  ^bb0(%i: f32, %o: f16):
    %v = arith.truncf %i : f32 to f16
    linalg.yield %v : f16
  }} -> tensor<?x?x32xf16>
  %r = linalg.generic {{indexing_maps = [#id3, #bias, #id3], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%t, %bias : tensor<?x?x32xf16>, tensor<32xf16>) outs(%te : tensor<?x?x32xf16>) {{
  ^bb0(%i: f16, %j: f16, %o: f16):
    %v = arith.addf %i, %j : f16
    linalg.yield %v : f16
  }} -> tensor<?x?x32xf16>
  return %r : tensor<?x?x32xf16>
}}
func.func @generic_nk(%x: tensor<2x?x64xf16>, %w: tensor<32x64xf16>) -> tensor<2x?x32xf32> {{
  %c1 = arith.constant 1 : index
  %s = tensor.dim %x, %c1 : tensor<2x?x64xf16>
  {_FILL.format(dyn="%s", out="tensor<2x?x32xf32>")}
  %r = linalg.generic {{indexing_maps = [#a4, #wnk, #o4], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
      ins(%x, %w : tensor<2x?x64xf16>, tensor<32x64xf16>) outs(%of : tensor<2x?x32xf32>) {{
  ^bb0(%a: f16, %b: f16, %o: f32):
    %ea = arith.extf %a : f16 to f32
    %eb = arith.extf %b : f16 to f32
    %p = arith.mulf %ea, %eb : f32
    %s2 = arith.addf %o, %p : f32
    linalg.yield %s2 : f32
  }} -> tensor<2x?x32xf32>
  return %r : tensor<2x?x32xf32>
}}
func.func @bf16_broadcast_nk(%x: tensor<2x64x128xbf16>, %w: tensor<64x128xbf16>) -> tensor<2x64x64xf32> {{
  %we = tensor.empty() : tensor<2x128x64xbf16>
  %wb = linalg.generic {{indexing_maps = [#bnk, #id3], iterator_types = ["parallel", "parallel", "parallel"]}}
      ins(%w : tensor<64x128xbf16>) outs(%we : tensor<2x128x64xbf16>) {{
  ^bb0(%i: bf16, %o: bf16):
    linalg.yield %i : bf16
  }} -> tensor<2x128x64xbf16>
  {_FILL.format(dyn="", out="tensor<2x64x64xf32>")}
  %mm = linalg.batch_matmul ins(%x, %wb : tensor<2x64x128xbf16>, tensor<2x128x64xbf16>)
      outs(%of : tensor<2x64x64xf32>) -> tensor<2x64x64xf32>
  return %mm : tensor<2x64x64xf32>
}}
func.func @batched(%a: tensor<2x64x64xf16>, %b: tensor<2x64x32xf16>) -> tensor<2x64x32xf32> {{
  {_FILL.format(dyn="", out="tensor<2x64x32xf32>")}
  %mm = linalg.batch_matmul ins(%a, %b : tensor<2x64x64xf16>, tensor<2x64x32xf16>)
      outs(%of : tensor<2x64x32xf32>) -> tensor<2x64x32xf32>
  return %mm : tensor<2x64x32xf32>
}}
"""
FUNCTIONS = ["broadcast_kn", "generic_nk", "bf16_broadcast_nk", "batched"]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    imported = import_mlir(tmp_path_factory.mktemp("normalize"), GRAPH)
    return imported, apply_kernels(imported.module_bytecode, library="triton")


def test_every_written_form_of_a_linear_becomes_one_2d_matmul(graphs):
    imported, _ = graphs
    text, counts = normalize_contractions(imported.module_bytecode)
    assert counts == {"linears": 3, "convolutions": 0, "attention": 0}
    # what stays batched: a product of two activations (no weight broadcast to it)
    assert text.count("linalg.batch_matmul") == 1
    assert text.count("linalg.matmul") == 3
    assert "linalg.broadcast" not in text


def test_the_kernels_take_the_normal_forms_and_report_the_rest(graphs):
    _, kernelized = graphs
    sites = {(s["function"], s["op"]): s for s in kernelized.sites}
    assert set(sites) == {
        ("broadcast_kn", "matmul"),
        ("generic_nk", "matmul_transpose_b"),
        ("bf16_broadcast_nk", "matmul_transpose_b"),
        ("batched", "batch_matmul"),
    }
    kn = sites[("broadcast_kn", "matmul")]
    nk = sites[("generic_nk", "matmul_transpose_b")]
    bf16 = sites[("bf16_broadcast_nk", "matmul_transpose_b")]
    # rows are batch x tokens: dynamic where the tokens are
    assert (kn["m"], kn["n"], kn["k"], kn["out_dtype"]) == (None, 32, 64, "f16")
    assert kn["reason"] == "matched, with its truncf" and kn["kernel"]
    assert (nk["m"], nk["n"], nk["k"], nk["out_dtype"]) == (None, 32, 64, "f32")
    assert (bf16["m"], bf16["dtype"], bf16["kernel"] is not None) == (128, "bf16", True)
    assert sites[("batched", "batch_matmul")]["kernel"] is None


def _run(module_bytecode: bytes, function: str, args: list[np.ndarray]) -> np.ndarray:
    import iree.runtime as rt

    compiled = compile_module(
        module_bytecode,
        phase="input",
        devices=[TargetDevice("cpu", target="llvm-cpu")],
        functions=[function],
    )
    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, compiled.vmfb))
    return np.asarray(ctx.modules.g[function](*args)).astype(np.float32)


def test_the_normal_forms_compute_what_the_written_forms_do(graphs, tmp_path):
    """On llvm-cpu, at a row count the dynamic dims take only at run time: the 2-D matmul sums
    the same products over k as the batched one (f32 accumulation in both), so the results agree
    to the f16 rounding of the output."""
    imported, _ = graphs
    text, _ = normalize_contractions(imported.module_bytecode)
    normal = import_mlir(tmp_path, text)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 64)).astype(np.float16)
    w = (rng.standard_normal((64, 32)) / 8).astype(np.float16)
    bias = rng.standard_normal(32).astype(np.float16)
    xn = rng.standard_normal((2, 7, 64)).astype(np.float16)
    wn = (rng.standard_normal((32, 64)) / 8).astype(np.float16)
    cases = {"broadcast_kn": [x, w, bias], "generic_nk": [xn, wn]}
    refs = {
        "broadcast_kn": x.astype(np.float32) @ w.astype(np.float32) + bias.astype(np.float32),
        "generic_nk": xn.astype(np.float32) @ wn.astype(np.float32).T,
    }
    for function, args in cases.items():
        before = _run(imported.module_bytecode, function, args)
        after = _run(normal.module_bytecode, function, args)
        assert after.shape == refs[function].shape
        scale = np.abs(refs[function]).max()
        assert np.abs(after - before).max() <= 2e-3 * scale, function
        assert np.abs(after - refs[function]).max() <= 2e-3 * scale, function


def test_hand_written_attention_that_is_not_taken_says_why(tmp_path):
    """An f32 attention from ONNX keeps its two batched matmuls, each with the reason."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from myelin.compiler.pipeline import import_graph
    from myelin.frontends import FrontendRequest, frontend

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) @ v

    q = torch.randn(2, 4, 16, 64)
    path = tmp_path / "attention.onnx"
    torch.onnx.export(Attention(), (q, q, q), str(path), dynamo=False, opset_version=17)
    request = FrontendRequest(source=path, symbol=None, module_name="g", scope="g")
    result = frontend("onnx")(request)
    imported = import_graph(result.mlir, input_type=result.input_type, module_name="g", scope="g")
    sites = apply_kernels(imported.module_bytecode, library="triton-attention").sites
    assert [s["op"] for s in sites] == ["batch_matmul", "batch_matmul"]
    for s in sites:
        assert s["reason"] == (
            "attention written as batched matmuls, not taken as one attention op: "
            "q, k, v are f32 x f32 x f32: the attention kernels take f16 or bf16"
        )
    text, counts = normalize_contractions(imported.module_bytecode)
    assert counts["attention"] == 0 and "kernels_why" not in text
