"""Convolutions as im2col + matmul (myelin.kernels._conv), checked without a GPU.

A set of torch convolutions (7x7 stride 2 with padding, 3x3 with bias, 3x3 stride 2, 3x3
dilation 2, 1x1, 1x1 stride 2, a rectangular 3x1 one; Whisper's two 1-D ones), imported by the
torch frontend, rewritten
as the kernels step rewrites them and compiled for llvm-cpu: the same values as torch eager, in
f32 to the rounding of another summation order and in f16 to the output's f16 rounding. The same
graphs built for a Hopper device put every one of those convolutions on the matmul kernels and
list them in the kernel report as convolutions; a grouped one and one with 10 output channels
stay IREE's, with the reason, and the build warns about f16 convolutions IREE's CUDA codegen
computes (it gave ResNet-50 a wrong answer on an H100).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("triton")

import myelin
from myelin.compiler.phases import read_phase_file, render_phase_file
from myelin.kernels import normalize_contractions
from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning

CONVS_PY = '''
import numpy as np
import torch


class Convs(torch.nn.Module):
    """Each convolution kind the rewrite takes, one after another (ReLU between)."""

    def __init__(self, extra: bool) -> None:
        super().__init__()
        conv = torch.nn.Conv2d
        self.layers = torch.nn.ModuleList([
            conv(3, 32, 7, stride=2, padding=3, bias=False),      # the stem: K 147 -> 192
            conv(32, 32, 3, padding=1),                           # 3x3 with a bias
            conv(32, 64, 3, stride=2, padding=1, bias=False),     # 3x3 stride 2
            conv(64, 64, 3, padding=2, dilation=2, bias=False),   # dilation 2
            conv(64, 128, 1, bias=False),                         # 1x1: no gather
            conv(128, 64, 1, stride=2),                           # 1x1 stride 2 (a downsample)
            conv(64, 32, (3, 1), padding=(1, 0), bias=False),     # rectangular
        ])
        if extra:  # forms no kernel takes: grouped, and 10 output channels
            self.layers.append(conv(32, 32, 3, padding=1, groups=2, bias=False))
            self.layers.append(conv(32, 10, 1, bias=False))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _model(dtype, extra=False):
    torch.manual_seed(0)
    model = Convs(extra).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32), np.float32))
    return model.to(dtype), {"x": x.to(dtype)}


def convs_f32():
    return _model(torch.float32)


def convs_f16():
    return _model(torch.float16)


def convs_more_f16():
    return _model(torch.float16, extra=True)


class Conv1ds(torch.nn.Module):
    """Whisper's front end: two 1-D convolutions with biases, the second of stride 2, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv1d(16, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv2(torch.nn.functional.gelu(self.conv1(x))))


def _conv1d(dtype):
    torch.manual_seed(0)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 16, 64), np.float32))
    return Conv1ds().eval().to(dtype), {"x": x.to(dtype)}


def conv1d_f32():
    return _conv1d(torch.float32)


def conv1d_f16():
    return _conv1d(torch.float16)
'''
PACKAGE = """[package]
name = "convs"
[graph.convs_f32]
source = "convs.py:convs_f32"
frontend = "torch"
[graph.convs_f16]
source = "convs.py:convs_f16"
frontend = "torch"
[graph.convs_more_f16]
source = "convs.py:convs_more_f16"
frontend = "torch"
[graph.conv1d_f32]
source = "convs.py:conv1d_f32"
frontend = "torch"
[graph.conv1d_f16]
source = "convs.py:conv1d_f16"
frontend = "torch"
"""
APP = '[app]\nname = "convs"\npackages = ["."]\ngraphs = [{graphs}]\n'
# data tiling off: under it the CPU's own rewrite runs a batch's f32 convolutions one image at a
# time (myelin.compiler.cpu_convolution), which would double the convolutions counted here
CPU = '[devices.cpu]\ntarget = "llvm-cpu"\ndata_tiling = false\n'
VMVX = '[devices.cpu]\ntarget = "vmvx"\n'
HOPPER = '[devices.hopper]\ntarget = "cuda"\nkernels = "triton"\n'
PLAIN_CUDA = '[devices.gpu]\ntarget = "cuda"\n'
CONVS_TAKEN = 7


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("convs")
    (root / "convs.py").write_text(CONVS_PY)
    (root / "plex.toml").write_text(PACKAGE)
    import importlib.util

    spec = importlib.util.spec_from_file_location("convs_source", root / "convs.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    return root, source


def _app(root: Path, name: str, graphs: list[str], device: str) -> Path:
    app = root / f"{name}.toml"
    listed = ", ".join(f'"convs:{g}"' for g in graphs)
    app.write_text(APP.format(graphs=listed).replace('"convs"', f'"{name}"', 1) + device)
    return app


def _build(app: Path, out: Path, **kwargs) -> tuple[Path, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        built = build(app, out, **kwargs).output
    return built, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float32) - want).max() / np.abs(want).max())


def _normalized(app: Path, folder: Path, graphs: list[str], convolutions: int) -> list[Path]:
    """The graphs' input IR with every convolution rewritten as the kernels step does, as phase
    files to resume the app's build from."""
    build(app, folder, compile_to="input")
    normal = []
    for graph in graphs:
        saved = read_phase_file(folder / graph / "default" / "01.input.mlir")
        text, counts = normalize_contractions(saved.text, what=graph, all_convolutions=True)
        assert counts["convolutions"] == convolutions, counts
        assert "linalg.conv" not in text
        path = folder / f"{graph}.normal.mlir"
        path.write_text(render_phase_file(text, saved.fields))
        normal.append(path)
    return normal


def test_the_rewritten_convolutions_compute_what_torch_does_on_the_cpu(package):
    """f32: the gather + matmul form within 1e-5 of torch eager (another summation order);
    f16: within 5e-3 of torch eager in f32 (the f16 weights and input computed in f32)."""
    import torch

    root, source = package
    graphs = ["convs_f32", "convs_f16"]
    app = _app(root, "cpu", graphs, CPU)
    normal = _normalized(app, root / "ir", graphs, CONVS_TAKEN)
    # the padded convolutions gather from their input channels-last: torch's NCHW zero pads
    # (low[0, 0, h, w]) became NHWC ones after the input's transpose (low[0, h, w, 0])
    pads = re.findall(r"tensor\.pad %\S+ low\[([\d, ]+)\]", normal[0].read_text())
    four_d = [p for p in pads if p.count(",") == 3]
    assert four_d and all(p.startswith("0, ") and p.endswith(", 0") for p in four_d), pads
    # (the graphs as imported are not compiled here: IREE 3.13 fails on an f16 convolution with
    # a bias for llvm-cpu under data tiling, "'arith.addf' op requires the same type", an f16 +
    # f32 add its fusion makes; the rewritten form compiles)
    normal_mln, _ = _build(app, root / "normal.mln", resume_from=normal)
    model, inputs = source.convs_f32()
    x = inputs["x"]
    with torch.no_grad():
        want = model(x).numpy()
    f16_model, f16_inputs = source.convs_f16()
    with torch.no_grad():  # the f16 weights, computed in f32
        want_f16 = f16_model.float()(f16_inputs["x"].float()).numpy()
    with myelin.Instance().load(normal_mln) as m, m.session() as s:
        got = np.asarray(s.call("convs_f32.forward", x.numpy()))
        got_f16 = np.asarray(s.call("convs_f16.forward", f16_inputs["x"].numpy()))
    assert got.shape == want.shape == (2, 32, 4, 4)
    assert _relative(got, want) < 1e-5, _relative(got, want)
    assert _relative(got_f16, want_f16) < 5e-3, _relative(got_f16, want_f16)


def test_1d_convolutions_as_2d_ones_compute_what_torch_does(package):
    """Whisper's front end as the kernels step rewrites it (each 1-D convolution a 2-D one of
    height 1, then im2col + matmul), on vmvx: an llvm-cpu variant's import already makes its
    1-D convolutions products of its own (myelin.compiler.cpu_convolution). Within 1e-5 of
    torch eager (another summation order)."""
    import torch

    root, source = package
    app = _app(root, "vmvx", ["conv1d_f32"], VMVX)
    normal = _normalized(app, root / "ir1d", ["conv1d_f32"], 2)
    # torch's zero pads of the NCW input became NHWC ones after the transpose (low[0, 0, w, 0]),
    # so they no longer sit between one convolution's transpose back and the next one's
    pads = re.findall(r"tensor\.pad %\S+ low\[([\d, ]+)\]", normal[0].read_text())
    assert [p for p in pads if p.count(",") == 3] == ["0, 0, 1, 0"] * 2, pads
    out, _ = _build(app, root / "conv1d.mln", resume_from=normal)
    model, inputs = source.conv1d_f32()
    with torch.no_grad():
        want = model(inputs["x"]).numpy()
    with myelin.Instance().load(out) as m, m.session() as s:
        got = np.asarray(s.call("conv1d_f32.forward", inputs["x"].numpy()))
    assert got.shape == want.shape == (2, 32, 32)
    assert _relative(got, want) < 1e-5, _relative(got, want)


def test_every_convolution_is_in_the_kernel_report_on_a_kernel_or_with_its_reason(package):
    root, _ = package
    app = _app(root, "hopper", ["convs_f16", "convs_more_f16", "conv1d_f16"], HOPPER)
    out, warned = _build(app, root / "hopper.mln")
    with MlnReader(out) as r:
        (device,) = r.manifest["variants"][0]["devices"]
    # the 1-D convolutions go to the kernels as 2-D ones of height 1, listed as 1-D
    ones = [s for s in device["kernels"] if s["module"] == "conv1d_f16"]
    assert [s["op"] for s in ones] == ["conv_1d_ncw_fcw"] * 2 and all(s["kernel"] for s in ones)
    assert ones[0]["conv"].startswith("3 taps stride 1 dilation 1, 16 -> 32 channels, as im2col")
    assert (ones[1]["m"], ones[1]["n"], ones[1]["k"]) == (2 * 32, 32, 128)  # K 96 padded
    sites = [s for s in device["kernels"] if s["module"] == "convs_more_f16"]
    assert all(s["op"].startswith("conv") for s in sites), sites
    taken = [s for s in sites if s["kernel"]]
    assert len(taken) == CONVS_TAKEN and all(s["as"] == "matmul_transpose_b" for s in taken)
    stem = taken[0]
    assert (stem["m"], stem["n"], stem["k"]) == (2 * 16 * 16, 32, 192)
    assert stem["conv"].startswith("7x7 stride 2 dilation 1, 3 -> 32 channels, as im2col")
    assert stem["flops"] == 2 * 512 * 32 * 147  # the convolution's, not the padded K's
    assert "1x1, stride 1: no gather" in taken[4]["conv"]
    # every gather is read in place by the convolution kernel (all but the 1x1 of stride 1),
    # per column where C does not fill whole K steps of 64 (the stem, the 32-channel ones)
    kinds = [s["kernel"].split("_abt_")[0] for s in taken]
    assert (
        kinds == ["plex_conv_masked"] * 3 + ["plex_conv", "plex_matmul_tma"] + ["plex_conv"] * 2
    ), kinds
    assert all("im2col read in place" in s["reason"] for s in taken if "conv" in s["kernel"])
    left = {s["op"]: s["reason"] for s in sites if not s["kernel"]}
    assert len([s for s in sites if not s["kernel"]]) == 2, left
    assert any(r.startswith("grouped convolution") for r in left.values()), left
    assert left["conv_2d_nchw_fchw"].startswith("convolution with 10 output channels"), left
    # the two left are f16 on IREE's CUDA codegen: the build says so, for that module alone
    (risk,) = [w for w in warned if "IREE 3.13's CUDA codegen" in w]
    assert "module convs_more_f16 " in risk and "2 f16/bf16 convolution(s)" in risk


def test_a_cuda_variant_without_kernels_warns_about_its_f16_convolutions(package):
    root, _ = package
    app = _app(root, "plaincuda", ["convs_f16"], PLAIN_CUDA)
    _, warned = _build(app, root / "plaincuda.mln")
    (risk,) = [w for w in warned if "IREE 3.13's CUDA codegen" in w]
    assert f"{CONVS_TAKEN} f16/bf16 convolution(s)" in risk and "wrong" in risk


def test_the_convolution_kernel_reads_the_columns_in_place_in_tritons_interpreter():
    """The implicit-im2col kernel (`_triton._conv_fn`) against torch's conv2d: x NHWC and padded,
    the filter as [F, (i, j, c)] (K padded to 64 with zeros), M and N past whole tiles; 3x3,
    strided, dilated, 1x1 strided and rectangular, and masked per column where C is no multiple
    of 64 (a 7x7 stem on 3 channels, a 1-D one on 80). Within 2e-3 of the largest output (f16 output rounding). The interpreter
    runs the kernel's Python on the CPU."""
    import os
    import subprocess
    import sys

    code = """
import json, torch, triton
from myelin.kernels._triton import _conv_fn
g = torch.Generator().manual_seed(0)
worst = 0.0
for b, c, h, w, f, (kh, kw), s, p, d in [
    (2, 64, 9, 7, 48, (3, 3), 1, (1, 1), 1),
    (1, 64, 10, 10, 32, (3, 3), 2, (1, 1), 1),
    (2, 128, 8, 8, 16, (1, 1), 2, (0, 0), 1),
    (1, 64, 9, 9, 32, (3, 3), 1, (2, 2), 2),
    (1, 64, 6, 5, 16, (3, 1), 1, (1, 0), 1),
    (2, 3, 15, 13, 32, (7, 7), 2, (3, 3), 1),  # masked: the stem's C = 3, K 147 -> 192
    (1, 80, 1, 30, 16, (1, 3), 1, (0, 1), 1),  # masked: Whisper's 80 mel bins, K 240 -> 256
]:
    x = torch.randn(b, c, h, w, generator=g).half()
    wt = torch.randn(f, c, kh, kw, generator=g).half()
    ref = torch.nn.functional.conv2d(x.float(), wt.float(), stride=s, padding=p, dilation=d)
    xp = torch.nn.functional.pad(x, (p[1], p[1], p[0], p[0])).permute(0, 2, 3, 1).contiguous()
    kr = kh * kw * c
    k = -(-kr // 64) * 64
    wk = torch.zeros(f, k).half()
    wk[:, :kr] = wt.permute(0, 2, 3, 1).reshape(f, kr)
    oh, ow = ref.shape[2], ref.shape[3]
    m = b * oh * ow
    out = torch.full((m, f), float("nan")).half()
    _conv_fn()[(triton.cdiv(m, 32) * triton.cdiv(f, 16),)](
        xp, wk, out, m, f, k, oh, ow, xp.shape[1], xp.shape[2], c, kw, s, s, d, d, kr,
        BM=32, BN=16, BK=64, GROUP_M=8, MASKED=c % 64 != 0)
    got = out.float().reshape(b, oh, ow, f).permute(0, 3, 1, 2)
    worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
print(json.dumps(worst))
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 2e-3


@pytest.mark.parametrize("masked", [False, True])
def test_the_convolution_kernel_takes_exactly_what_its_wrapper_passes(masked):
    """sm_90a code (wgmma) with no GPU present, whose parameters are the 3 bindings (x, filter,
    C) and one i32 per push constant the wrapper declares: M, N, K and the geometry."""
    from myelin.kernels._triton import CONV_GEOMETRY, MatmulConfig, compile_matmul

    config = MatmulConfig("f16", "f16", True, 128, 64, 64, 8, 4, 4, im2col=True)
    kernel = compile_matmul(dataclasses.replace(config, im2col_masked=masked))
    assert ".target sm_90a" in kernel.ptx and "wgmma.mma_async" in kernel.ptx
    entry = kernel.ptx[kernel.ptx.index(".entry") : kernel.ptx.index(")")]
    params = re.findall(r"\.param \.(u64|u32)", entry)
    assert params == ["u64"] * 3 + ["u32"] * (3 + len(CONV_GEOMETRY))
    assert kernel.name.startswith("plex_conv_masked_" if masked else "plex_conv_abt_")
