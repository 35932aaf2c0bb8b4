"""The flash-attention kernel, without a GPU: its sm_90a compile, its numerics against torch in
Triton's interpreter, and the rewrite of `iree_linalg_ext.attention` into its external dispatch
(compiled for CUDA to the flow phase). Only `kernels = "triton-attention"` (docs/kernels.md)
rewrites attention."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from myelin.kernels import apply_kernels
from myelin.kernels._attention import AttentionConfig, compile_attention
from tests.myelin.kernels_helpers import flow_dispatches, import_mlir

MAPS = """
#q = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>
#k = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>
#v = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>
#s = affine_map<(d0, d1, d2, d3, d4) -> ()>
#m = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>
#o = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>
#id4 = affine_map<(a, b, c, d) -> (a, b, c, d)>
"""


def _attention(name: str, q: str, kv: str, scale: str, mask: str = "", mask_t: str = "") -> str:
    maps = "#q, #k, #v, #s, #m, #o" if mask else "#q, #k, #v, #s, #o"
    extra_in, extra_t = (f", {mask}", f", {mask_t}") if mask else ("", "")
    return f"""
  %oe = tensor.empty() : {q}
  %r = iree_linalg_ext.attention <indexing_maps = [{maps}]>
      ins(%q, %k, %v, %scale{extra_in} : {q}, {kv}, {kv}, f32{extra_t}) outs(%oe : {q}) {{
  ^bb0(%x: f32):
    iree_linalg_ext.yield %x : f32
  }} -> {q}
  return %r : {q}
}}"""


# causal: torch's is_causal mask as its lowering writes it (0 where query >= key, else -inf, over
# [1, heads, q, k], collapsed); full: no mask, query and key lengths differ; d96: a head dim the
# kernel does not take; notcausal: a mask of another shape (query > key) stays IREE's.
def _mask(cmp: str) -> str:
    t4, t3 = "tensor<1x4x200x200xf16>", "tensor<4x200x200xf16>"
    return f"""
  %zero = arith.constant 0.0 : f16
  %ninf = arith.constant 0xFC00 : f16
  %e = tensor.empty() : {t4}
  %f = linalg.fill ins(%zero : f16) outs(%e : {t4}) -> {t4}
  %mask = linalg.generic {{indexing_maps = [#id4], iterator_types = ["parallel", "parallel",
      "parallel", "parallel"]}} outs(%f : {t4}) {{
  ^bb0(%out: f16):
    %i = linalg.index 2 : index
    %j = linalg.index 3 : index
    %c = arith.cmpi {cmp}, %i, %j : index
    %sel = arith.select %c, %zero, %ninf : f16
    linalg.yield %sel : f16
  }} -> {t4}
  %mk = tensor.collapse_shape %mask [[0, 1], [2], [3]] : {t4} into {t3}"""


def _graph() -> str:
    t = "tensor<4x200x64xf16>"
    sig = f"(%q: {t}, %k: {t}, %v: {t}) -> {t}"
    causal = (
        f"func.func @causal{sig} {{\n  %scale = arith.constant 0.125 : f32"
        + _mask("sge")
        + _attention("causal", t, t, "0.125", "%mk", "tensor<4x200x200xf16>")
    )
    notcausal = (
        f"func.func @notcausal{sig} {{\n  %scale = arith.constant 0.125 : f32"
        + _mask("sgt")
        + _attention("notcausal", t, t, "0.125", "%mk", "tensor<4x200x200xf16>")
    )
    q, kv = "tensor<8x100x128xf16>", "tensor<8x300x128xf16>"
    full = (
        f"func.func @full(%q: {q}, %k: {kv}, %v: {kv}) -> {q} {{\n"
        "  %scale = arith.constant 0.0883883461 : f32" + _attention("full", q, kv, "")
    )
    t96 = "tensor<2x64x96xf16>"
    d96 = (
        f"func.func @d96(%q: {t96}, %k: {t96}, %v: {t96}) -> {t96} {{\n"
        "  %scale = arith.constant 0.1 : f32" + _attention("d96", t96, t96, "")
    )
    return "\n".join([MAPS, causal, notcausal, full, d96, _heads_graph(), _heads_graph(True)])


def _heads_graph(fused: bool = False) -> str:
    """Attention as transformers writes it at batch 2: each of Q, K, V a linear's output viewed
    as [batch, tokens, heads, d] and transposed to [batch, heads, tokens, d] (collapsed to the
    op's [batch*heads, tokens, d]), the result transposed back; `fused`: Q, K, V are column
    slices of one projection's output (GPT-2's `c_attn(x).split(...)`)."""
    x, t4, t3 = "tensor<2x100x3x64xf16>", "tensor<2x3x100x64xf16>", "tensor<6x100x64xf16>"
    if fused:
        xs, ts = "tensor<2x100x576xf16>", "tensor<2x100x192xf16>"
        lines = [f"func.func @fused(%qkv: {xs}) -> {x} {{"]
        for i, name in enumerate("qkv"):
            lines += [
                f"  %s{name} = tensor.extract_slice %qkv[0, 0, {192 * i}] [2, 100, 192] [1, 1, 1]"
                f" : {xs} to {ts}",
                f"  %x{name} = tensor.expand_shape %s{name} [[0], [1], [2, 3]]"
                f" output_shape [2, 100, 3, 64] : {ts} into {x}",
            ]
    else:
        lines = [f"func.func @heads(%xq: {x}, %xk: {x}, %xv: {x}) -> {x} {{"]
    lines.append("  %scale = arith.constant 0.125 : f32")
    for name in "qkv":
        lines += [
            f"  %e{name} = tensor.empty() : {t4}",
            f"  %t{name} = linalg.transpose ins(%x{name} : {x}) outs(%e{name} : {t4})"
            " permutation = [0, 2, 1, 3]",
            f"  %{name} = tensor.collapse_shape %t{name} [[0, 1], [2], [3]] : {t4} into {t3}",
        ]
    body = _attention("heads", t3, t3, "").replace(f"  return %r : {t3}\n}}", "")
    return (
        "\n".join(lines)
        + body
        + f"""
  %ro = tensor.expand_shape %r [[0, 1], [2], [3]] output_shape [2, 3, 100, 64] : {t3} into {t4}
  %eo = tensor.empty() : {x}
  %o = linalg.transpose ins(%ro : {t4}) outs(%eo : {x}) permutation = [0, 2, 1, 3]
  return %o : {x}
}}"""
    )


FUNCTIONS = ["causal", "notcausal", "full", "d96", "heads", "fused"]


def test_the_attention_kernel_compiles_to_sm_90a_wgmma_code_without_a_gpu():
    kernel = compile_attention(AttentionConfig("f16", 128, causal=True, scale=128**-0.5))
    assert kernel.cubin[:4] == b"\x7fELF"
    assert ".target sm_90a" in kernel.ptx and "wgmma.mma_async" in kernel.ptx
    entry = kernel.ptx[kernel.ptx.index(".entry") : kernel.ptx.index(")")]
    # what IREE passes: Q, K, V, O bindings, then the two lengths, the heads per batch, Q, K and
    # V's offsets and the twelve strides (no Triton scratch pointers)
    assert re.findall(r"\.param \.(u64|u32)", entry) == ["u64"] * 4 + ["u32"] * 18
    assert kernel.threads == 256 and kernel.shared_bytes <= 227 * 1024


INTERPRET = """
import json, math, sys
import torch
from myelin.kernels._attention import AttentionConfig, _attention_fn, launch_constants
import triton
fn = _attention_fn()
out = {}
for name, causal, bh, sq, sk, d in (
    ("causal", True, 3, 200, 200, 64), ("full", False, 2, 100, 300, 128),
    ("token_major", True, 3, 150, 150, 64), ("batch_token_major", False, 6, 90, 130, 64),
    ("fused_qkv", True, 6, 120, 120, 64),
):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(bh, sq, d, generator=g).half()
    k, v = (torch.randn(bh, sk, d, generator=g).half() for _ in range(2))
    o = torch.full((bh, sq, d), float("nan")).half()
    config = AttentionConfig("f16", d, causal, d ** -0.5)
    grid = (triton.cdiv(sq, config.block_m), bh)
    if name == "token_major":  # Q, K, V, O as [tokens, heads, d]: strides, no transposes
        qt, kt, vt = (x.transpose(0, 1).contiguous() for x in (q, k, v))
        ot = torch.full((sq, bh, d), float("nan")).half()
        strides = [bh * d, d, bh * d] * 4
        fn[grid](qt, kt, vt, ot, sq, sk, bh, 0, 0, 0, *strides, **launch_constants(config))
        o = ot.transpose(0, 1)
    elif name == "batch_token_major":  # [batch, tokens, heads, d], 2 batches of 3 heads
        b, h = 2, 3
        qt, kt, vt = (x.view(b, h, -1, d).transpose(1, 2).contiguous() for x in (q, k, v))
        ot = torch.full((b, sq, h, d), float("nan")).half()
        strides = [sq * h * d, d, h * d] + [sk * h * d, d, h * d] * 2 + [sq * h * d, d, h * d]
        fn[grid](qt, kt, vt, ot, sq, sk, h, 0, 0, 0, *strides, **launch_constants(config))
        o = ot.transpose(1, 2).reshape(bh, sq, d)
    elif name == "fused_qkv":  # Q, K, V as column slices of one [batch, tokens, 3 * heads * d]
        b, h = 2, 3
        qkv = torch.cat([x.view(b, h, -1, d).transpose(1, 2).reshape(b, sq, h * d)
                         for x in (q, k, v)], dim=2).contiguous()
        ot = torch.full((b, sq, h, d), float("nan")).half()
        w = 3 * h * d
        strides = [sq * w, d, w] * 3 + [sq * h * d, d, h * d]
        fn[grid](qkv, qkv, qkv, ot, sq, sk, h, 0, h * d, 2 * h * d, *strides,
                 **launch_constants(config))
        o = ot.transpose(1, 2).reshape(bh, sq, d)
    else:
        strides = [bh * sq * d, sq * d, d] + [bh * sk * d, sk * d, d] * 2 + [bh * sq * d, sq * d, d]
        fn[grid](q, k, v, o, sq, sk, bh, 0, 0, 0, *strides, **launch_constants(config))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float()[None], k.float()[None], v.float()[None], is_causal=causal)[0]
    out[name] = float((o.float() - ref).norm() / ref.norm())
print(json.dumps(out))
"""


def test_the_attention_kernel_matches_torch_in_tritons_interpreter():
    """The algorithm (online softmax, causal skipping, masked tails of both lengths) against
    torch's fp32 attention; the interpreter runs the kernel's Python on the CPU."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", INTERPRET], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(errors) == {"causal", "full", "token_major", "batch_token_major", "fused_qkv"}
    assert all(e < 2e-3 for e in errors.values()), errors


@pytest.fixture(scope="module")
def kernelized(tmp_path_factory):
    imported = import_mlir(tmp_path_factory.mktemp("attention"), _graph())
    return imported, apply_kernels(imported.module_bytecode, library="triton-attention")


def test_the_rewrite_sends_sdpa_attention_to_the_kernel_and_leaves_the_rest(kernelized):
    _, k = kernelized
    sites = {s["function"]: s for s in k.sites}
    assert sites["causal"]["op"] == "attention_causal" and sites["causal"]["kernel"].startswith(
        "plex_attention_causal_f16_d64_"
    )
    assert (sites["causal"]["m"], sites["causal"]["k"], sites["causal"]["n"]) == (200, 200, 64)
    assert sites["full"]["kernel"].startswith("plex_attention_full_f16_d128_")
    assert (sites["full"]["m"], sites["full"]["k"]) == (100, 300)
    assert sites["notcausal"]["kernel"] is None
    assert sites["notcausal"]["reason"].startswith("the mask is not the causal mask: ")
    assert sites["d96"]["kernel"] is None and "head dim 96" in sites["d96"]["reason"]
    _, calls = flow_dispatches(k.module_bytecode, FUNCTIONS)
    externs = sorted(n for exe, n in calls if exe.startswith("extern_dispatch"))
    # heads, fused: full
    assert [n.split("_")[2] for n in externs] == ["causal", "full", "full", "full"]
    # [batch, tokens, heads, d] read and written in place, Q, K, V also as column slices of
    # one tensor: no transpose and no copy of a slice is left to make
    for name in ("heads", "fused"):
        assert "4 of Q, K, V, O read/written token-major" in sites[name]["reason"]
        assert sites[name]["batch"] == 6
        assert not [n for exe, n in calls if n.startswith(f"{name}_dispatch")], calls
    codegen = [n for exe, n in calls if not exe.startswith("extern_dispatch")]
    assert any("d96_dispatch" in n and "attention" in n for n in codegen), codegen
    assert any("notcausal_dispatch" in n and "attention" in n for n in codegen), codegen


def test_the_matmul_library_leaves_attention_to_iree(kernelized):
    imported, _ = kernelized
    k = apply_kernels(imported.module_bytecode, library="triton")
    # every attention is reported, none matched, and the reason names the library that would
    assert k.kernels == () and k.sites
    assert all(s["op"] == "attention" and s["kernel"] is None for s in k.sites), k.sites
    assert all('"triton-attention"' in s["reason"] for s in k.sites)
