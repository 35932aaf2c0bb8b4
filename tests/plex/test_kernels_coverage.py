"""Models as users write them get the kernels, and the build says what happened to every
contraction: a block with `[batch, seq, dim]` activations (`nn.Linear`, hand-written attention,
`scaled_dot_product_attention`), built for a Hopper device with `kernels = "triton"`, without a
GPU. Its CPU variant checks that the 2-D form of the linears computes what torch does."""

from __future__ import annotations

import importlib.util
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("triton")

import torch

import myelin
from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning

MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(256, 768, bias=False)
            self.o = torch.nn.Linear(256, 256)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 64).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2)) * 0.125
            y = scores.softmax(-1) @ v + F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, s, 256))

    def build(dtype=torch.float16):
        return Block().to(dtype), (torch.randn(2, 64, 256).to(dtype),)

    def build_f32():
        return build(torch.float32)
    """
)
PACKAGE = """
[package]
name = "blk"

[graph.blk]
source = "model.py:{function}"
frontend = "torch"
{dynamic}
"""
HOPPER_APP = """
[app]
name = "blk"
packages = ["."]

[devices.hopper]
target = "cuda"
kernels = "triton"
"""
CPU_APP = """
[app]
name = "blk"
packages = ["."]

[devices.cpu]
target = "llvm-cpu"
"""


def _build(root: Path, function: str, dynamic: str, app: str) -> Path:
    root.mkdir()
    (root / "model.py").write_text(MODEL_PY)
    (root / "plex.toml").write_text(PACKAGE.format(function=function, dynamic=dynamic))
    (root / "app.toml").write_text(app)
    return build(root / "app.toml", root / "blk.mln").output


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    """The f16 block built for Hopper with kernels, and the build's warnings."""
    root = tmp_path_factory.mktemp("coverage")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        out = _build(root / "hopper", "build", "", HOPPER_APP)
    return out, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


def _sites(artifact: Path) -> list[dict]:
    with MlnReader(artifact) as r:
        (device,) = r.manifest["variants"][0]["devices"]
        return list(device["kernels"])


def test_linears_over_three_dims_go_to_kernels_and_every_contraction_is_listed(built):
    sites = _sites(built[0])
    by_op: dict[str, list[dict]] = {}
    for s in sites:
        by_op.setdefault(s["op"], []).append(s)
    # nn.Linear on [2, 64, 256]: one [128, 256] x [256, n]^T matmul each, on a kernel
    linears = by_op.pop("matmul_transpose_b")
    assert sorted((s["m"], s["n"], s["k"]) for s in linears) == [(128, 256, 256), (128, 768, 256)]
    assert all(s["kernel"] for s in linears), linears
    # the attention written by hand is exported as SDPA, like the one beside it: both attention
    # ops, which need the attention library
    attentions = by_op.pop("attention")
    assert [(s["m"], s["n"], s["k"], s["kernel"]) for s in attentions] == [(64, 64, 64, None)] * 2
    assert all("triton-attention" in s["reason"] for s in attentions)
    assert not by_op, by_op


def test_the_build_warns_with_the_coverage_line_and_inspect_shows_it(built):
    out, warned = built
    (warning,) = [w for w in warned if "kernels:" in w]
    assert "kernels: 2 of 4 contractions (80% of FLOPs) on sm_90a kernels" in warning
    assert "attention 64x64x64 in forward (attention kernels need" in warning
    from typer.testing import CliRunner

    from plex.cli import app

    shown = CliRunner().invoke(app, ["inspect", str(out)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "[default/hopper] kernels: 2 of 4 contractions (80% of FLOPs)" in shown.output
    assert "attention 64x64x64 in forward" in shown.output


def test_the_two_dimensional_linears_compute_what_torch_does(tmp_path):
    dynamic = 'dynamic = { x = { 0 = "batch", 1 = "seq" } }'
    out = _build(tmp_path / "cpu", "build_f32", dynamic, CPU_APP)
    spec = importlib.util.spec_from_file_location("coverage_block", out.parent / "model.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)  # the package's own model.py
    module, _ = source.build_f32()
    x = np.random.default_rng(0).standard_normal((3, 40, 256)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    model = myelin.Instance().load(out)
    with model.session() as s:
        got = s.call("forward", x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
