"""The split-KV decode attention kernels, without a GPU: their sm_90a compile, their numerics
against torch in Triton's interpreter, and the rewrite of a decode `iree_linalg_ext.attention`
(few query rows, K and V the concat of a cache and the new token, as `torch.cat` then
`scaled_dot_product_attention` lower) into the two external dispatches, with the concat gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from myelin.compiler.pipeline import compile_module, import_graph
from myelin.compiler.targets import TargetDevice
from myelin.kernels import apply_kernels
from myelin.kernels._decode_attention import DecodeAttentionConfig, compile_decode_attention
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir


@pytest.mark.parametrize(
    "dtype, head_dim, masked", [("f16", 128, False), ("bf16", 64, False), ("f16", 128, True)]
)
def test_the_decode_kernels_compile_to_sm_90a_code_without_a_gpu(dtype, head_dim, masked):
    config = DecodeAttentionConfig(dtype, head_dim, scale=head_dim**-0.5, masked=masked)
    kernels = compile_decode_attention(config)
    assert sorted(kernels) == sorted([config.name, config.combine_name])
    split, combine = kernels[config.name], kernels[config.combine_name]
    for kernel in (split, combine):
        assert kernel.cubin[:4] == b"\x7fELF" and ".target sm_90a" in kernel.ptx
        assert kernel.shared_bytes <= 227 * 1024
    params = [
        re.findall(r"\.param \.(u64|u32)", k.ptx[k.ptx.index(".entry") : k.ptx.index(")")])
        for k in (split, combine)
    ]
    # What IREE passes: Q, K1, V1, K2, V2, (the mask,) workspace; M, N1, N2. Then: workspace,
    # O; M, splits. Without a mask the kernel has no mask parameter.
    assert params == [["u64"] * (7 if masked else 6) + ["u32"] * 3, ["u64"] * 2 + ["u32"] * 2]
    assert "mma" in split.ptx  # the scores and P x V on tensor cores
    # Small enough for several programs per SM (the split kernel is memory-bound).
    assert split.shared_bytes <= 80 * 1024


INTERPRET = """
import json
import torch
import triton
from myelin.kernels._decode_attention import (
    DecodeAttentionConfig, _combine_fn, _split_fn, combine_constants, split_constants)
split, combine = _split_fn(), _combine_fn()
out = {}
# (bh, query rows, keys in part 1, keys in part 2, head dim, keys per program, masked from):
# a split that straddles the two parts, one that holds only part 2, 16 rows with no part 2 (no
# concat); then with an additive mask (-inf from that key on, as a cache's empty slots, plus
# scattered -inf): chunks masked whole, a block masked whole inside a chunk, a mask over both
# parts of a concat.
for bh, m, n1, n2, d, chunk, masked_from in (
    (3, 1, 300, 1, 128, 128, None), (2, 5, 200, 7, 64, 64, None),
    (2, 1, 256, 3, 128, 256, None), (2, 16, 130, 0, 64, 64, None),
    (3, 1, 576, 0, 128, 256, 40), (2, 4, 300, 0, 64, 64, 150), (2, 1, 200, 5, 128, 128, 203),
):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(bh, m, d, generator=g).half()
    k1, v1 = (torch.randn(bh, n1, d, generator=g).half() for _ in range(2))
    k2, v2 = (torch.randn(bh, n2, d, generator=g).half() for _ in range(2))
    if n2 == 0:
        k2, v2 = k1, v1  # what the wrapper passes without a concat
    mask = None
    if masked_from is not None:
        hidden = torch.arange(n1 + n2) >= masked_from
        hidden = hidden | (torch.rand(bh, m, n1 + n2, generator=g) < 0.2)
        hidden[..., 0] = False  # every row sees a key
        mask = torch.zeros(bh, m, n1 + n2).masked_fill(hidden, float("-inf")).half()
    config = DecodeAttentionConfig("f16", d, d ** -0.5, split=chunk, masked=mask is not None)
    splits = config.splits(n1 + n2)
    ws = torch.full((config.workspace_elements(bh, m, n1 + n2),), float("nan"))
    o = torch.full((bh, m, d), float("nan")).half()
    split[(splits, bh)](q, k1, v1, k2, v2, mask, ws, m, n1, n2, **split_constants(config))
    combine[(bh,)](ws, o, m, splits, **combine_constants(config))
    keys = torch.cat((k1, k2[:, :n2]), 1).float()
    values = torch.cat((v1, v2[:, :n2]), 1).float()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float()[None], keys[None], values[None],
        attn_mask=None if mask is None else mask.float()[None])[0]
    tag = "" if mask is None else f" masked from {masked_from}"
    out[f"{m}x{n1}+{n2}{tag}"] = float((o.float() - ref).norm() / ref.norm())
print(json.dumps(out))
"""


def test_the_decode_kernels_match_torch_in_tritons_interpreter():
    """Both passes (per-chunk online softmax into the workspace, then the combine) against
    torch's fp32 attention over the concatenated keys, without and with an additive mask (chunks
    whose keys are all masked must add nothing, not NaN). f16 only: Triton 3.9's interpreter
    computes `tl.dot` of bf16 wrongly (a 16x16 bf16 product is off by 1e10 there), so bf16 is
    checked on the H200."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", INTERPRET], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(errors) == 7 and all(e < 2e-3 for e in errors.values()), errors


MAPS = """
#q = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>
#k = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>
#v = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>
#s = affine_map<(d0, d1, d2, d3, d4) -> ()>
#o = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>
"""
ATTENTION = """
  %scale = arith.constant 0.0883883461 : f32
  %oe = tensor.empty() : {q}
  %r = iree_linalg_ext.attention <indexing_maps = [#q, #k, #v, #s, #o]>
      ins(%q3, %k3, %v3, %scale : {q}, {kv}, {kv}, f32) outs(%oe : {q}) {{
  ^bb0(%x: f32):
    iree_linalg_ext.yield %x : f32
  }} -> {q}
"""
# `decode`: what torch lowers `sdpa(q[:, :, None], cat((kc, k[:, :, None]), 2), ...)` to
# (batch 2, 4 heads, a 256-slot cache). `decode_nocat`: 4 query rows, K and V arguments.
# `catmany`: the concat's result is also returned, so the copy is needed: K and V are then read
# as they are (no concat match), still on the decode kernel.
GRAPH = (
    MAPS
    + """
func.func @decode(%q: tensor<2x4x128xf16>, %k: tensor<2x4x128xf16>, %v: tensor<2x4x128xf16>,
                  %kc: tensor<2x4x256x128xf16>, %vc: tensor<2x4x256x128xf16>)
    -> tensor<8x1x128xf16> {
  %ke = tensor.expand_shape %k [[0], [1], [2, 3]] output_shape [2, 4, 1, 128]
      : tensor<2x4x128xf16> into tensor<2x4x1x128xf16>
  %kf = tensor.concat dim(2) %kc, %ke
      : (tensor<2x4x256x128xf16>, tensor<2x4x1x128xf16>) -> tensor<2x4x257x128xf16>
  %ve = tensor.expand_shape %v [[0], [1], [2, 3]] output_shape [2, 4, 1, 128]
      : tensor<2x4x128xf16> into tensor<2x4x1x128xf16>
  %vf = tensor.concat dim(2) %vc, %ve
      : (tensor<2x4x256x128xf16>, tensor<2x4x1x128xf16>) -> tensor<2x4x257x128xf16>
  %qe = tensor.expand_shape %q [[0], [1], [2, 3]] output_shape [2, 4, 1, 128]
      : tensor<2x4x128xf16> into tensor<2x4x1x128xf16>
  %q3 = tensor.collapse_shape %qe [[0, 1], [2], [3]]
      : tensor<2x4x1x128xf16> into tensor<8x1x128xf16>
  %k3 = tensor.collapse_shape %kf [[0, 1], [2], [3]]
      : tensor<2x4x257x128xf16> into tensor<8x257x128xf16>
  %v3 = tensor.collapse_shape %vf [[0, 1], [2], [3]]
      : tensor<2x4x257x128xf16> into tensor<8x257x128xf16>
"""
    + ATTENTION.format(q="tensor<8x1x128xf16>", kv="tensor<8x257x128xf16>")
    + """  return %r : tensor<8x1x128xf16>
}
func.func @decode_nocat(%q3: tensor<8x4x64xf16>, %k3: tensor<8x300x64xf16>,
                        %v3: tensor<8x300x64xf16>) -> tensor<8x4x64xf16> {
"""
    + ATTENTION.format(q="tensor<8x4x64xf16>", kv="tensor<8x300x64xf16>")
    + """  return %r : tensor<8x4x64xf16>
}
func.func @catmany(%q3: tensor<8x1x128xf16>, %kc: tensor<8x256x128xf16>,
                   %kn: tensor<8x1x128xf16>, %v3: tensor<8x257x128xf16>)
    -> (tensor<8x1x128xf16>, tensor<8x257x128xf16>) {
  %k3 = tensor.concat dim(1) %kc, %kn
      : (tensor<8x256x128xf16>, tensor<8x1x128xf16>) -> tensor<8x257x128xf16>
"""
    + ATTENTION.format(q="tensor<8x1x128xf16>", kv="tensor<8x257x128xf16>")
    + """  return %r, %k3 : tensor<8x1x128xf16>, tensor<8x257x128xf16>
}
"""
)
FUNCTIONS = ["decode", "decode_nocat", "catmany"]


@pytest.fixture(scope="module")
def kernelized(tmp_path_factory):
    imported = import_mlir(tmp_path_factory.mktemp("decode"), GRAPH)
    return apply_kernels(imported.module_bytecode, library="triton-attention")


def test_decode_attention_goes_to_the_split_kv_kernels_and_reads_the_cache_in_place(kernelized):
    sites = {s["function"]: s for s in kernelized.sites}
    assert sorted(sites) == sorted(FUNCTIONS)
    for name, m, keys, d in (("decode", 1, 257, 128), ("decode_nocat", 4, 300, 64)):
        site = sites[name]
        assert site["kernel"].startswith(f"plex_decode_attention_f16_d{d}_m16_"), site
        assert (site["m"], site["k"], site["n"]) == (m, keys, d)
    assert "concat's two parts" in sites["decode"]["reason"]
    assert "concat" not in sites["decode_nocat"]["reason"]
    assert sites["catmany"]["kernel"].startswith("plex_decode_attention_f16_d128_")
    assert "concat" not in sites["catmany"]["reason"]  # its concat is returned too: kept
    flow, calls = flow_dispatches(kernelized.module_bytecode, FUNCTIONS)
    externs = [n for exe, n in calls if exe.startswith("extern_dispatch")]
    # Two dispatches per attention (the split pass, then the combine), nothing else.
    assert sorted(n.split("_")[2] for n in externs) == ["attention"] * 3 + ["combine"] * 3, calls
    assert all("catmany" in n for exe, n in calls if not exe.startswith("extern_dispatch")), calls
    # decode's cache is never copied: no concat, no tensor update into a 257-slot K or V.
    funcs = re.split(r"\n\s*util\.func ", flow)
    (decode,) = [f for f in funcs if f.startswith("public @decode(")]
    assert "257x128" not in decode, decode[:3000]


MASKED = """
  %scale = arith.constant 0.0883883461 : f32
  %oe = tensor.empty() : {q}
  %r = iree_linalg_ext.attention <indexing_maps = [#q, #k, #v, #s, #m, #o]>
      ins(%q3, %k3, %v3, %scale, %mask : {q}, {kv}, {kv}, f32, {mask}) outs(%oe : {q}) {{
  ^bb0(%x: f32):
    iree_linalg_ext.yield %x : f32
  }} -> {q}
"""
# What `sdpa(q, k, v, attn_mask=mask)` lowers to over a 576-slot cache: `additive` (a float
# mask: the split-KV kernel reads it), `boolean` (an i1 mask: stays IREE's, with the fix named),
# `rows` (a masked attention of 64 query rows, not causal: no kernel takes it).
MASKED_GRAPH = (
    MAPS
    + "#m = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>\n"
    + "".join(
        f"""
func.func @{name}(%q3: tensor<8x{m}x128xf16>, %k3: tensor<8x576x128xf16>,
    %v3: tensor<8x576x128xf16>, %mask: tensor<8x{m}x576x{t}>) -> tensor<8x{m}x128xf16> {{
"""
        + MASKED.format(
            q=f"tensor<8x{m}x128xf16>", kv="tensor<8x576x128xf16>", mask=f"tensor<8x{m}x576x{t}>"
        )
        + f"""  return %r : tensor<8x{m}x128xf16>
}}
"""
        for name, m, t in (("additive", 1, "f16"), ("boolean", 1, "i1"), ("rows", 64, "f16"))
    )
)


def test_masked_decode_attention_goes_to_the_split_kv_kernel_with_its_mask(tmp_path):
    source = tmp_path / "masked.mlir"
    source.write_text(MASKED_GRAPH)
    imported = import_graph(source, input_type="auto", module_name="g", scope="g")
    kernelized = apply_kernels(imported.module_bytecode, library="triton-attention")
    sites = {s["function"]: s for s in kernelized.sites}
    assert sites["additive"]["kernel"].startswith("plex_decode_attention_mask_f16_d128_"), sites
    assert sites["additive"]["op"] == "attention_masked"
    assert (sites["additive"]["m"], sites["additive"]["k"]) == (1, 576)
    assert sites["boolean"]["kernel"] is None
    assert "i1 mask" in sites["boolean"]["reason"] and "float tensor" in sites["boolean"]["reason"]
    assert sites["rows"]["kernel"] is None and "not the causal mask" in sites["rows"]["reason"]
    phases: dict[str, str] = {}
    compile_module(
        kernelized.module_bytecode,
        phase="input",
        devices=[TargetDevice("gpu", target="cuda")],
        functions=["additive", "boolean", "rows"],
        stop_at="flow",
        on_phase=lambda phase, text: phases.__setitem__(phase, text),
    )
    funcs = re.split(r"\n\s*util\.func ", phases["flow"])
    (additive,) = [f for f in funcs if f.startswith("public @additive(")]
    calls = re.findall(r"flow\.dispatch @(\w+)::(?:@\w+::)?@(\w+)", additive)
    # The split pass reads the mask (a binding of its own), then the combine; nothing else.
    assert [n.split("_")[2] for _, n in calls] == ["attention", "combine"], calls
    assert all(exe.startswith("extern_dispatch") for exe, _ in calls), calls
    assert "tensor<8x1x576xf16>" in additive.split("flow.dispatch")[1], additive[:3000]
