"""A batch's 2-D convolutions on llvm-cpu under data tiling (`conv_batch`,
myelin.compiler.cpu_convolution): "images" (chosen wherever data tiling is on) runs each
convolution one image at a time, so that every product is packed for IREE's `mmt4d` kernels,
with the batch norm, residual add and activation after it in each image's product dispatch;
recorded in the .mln and shown by `plex inspect`; "iree" pinned keeps IREE's im2col over the
whole batch. A real IREE compile of a small ResNet block, checked against torch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from myelin.compiler.targets import conv_batch_choice
from plex.builder import build
from plex.cli import app as plex_app
from tests.models import runs_like_torch, write_torch_package

# a ResNet bottleneck's shape, tiny: 1x1 convolution, batch norm, ReLU; 3x3 convolution, batch
# norm, the residual add, ReLU
MODEL = """
import torch


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def build():
    torch.manual_seed(0)
    block = Block(16).eval()
    for bn in (block.bn1, block.bn2):  # statistics of a trained model, not the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return block, (torch.randn({batch}, 16, 12, 12),)
"""

APP = (
    '[app]\nname = "block"\npackages = ["{package}"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'
    "data_tiling = true\n"
)
DISPATCH = re.compile(r"flow\.dispatch\.workgroups.*?flow\.return", re.DOTALL)
# f32 sums of 16 or 144 products, in another order than torch's
TOLERANCE = 1e-5


def _build(folder: Path, batch: int, pinned: str = "") -> tuple[Path, list[str], str]:
    """The .mln of the block at `batch`, the op names of each of its dispatches (IREE's
    dispatch-creation phase) and the source."""
    source = MODEL.replace("{batch}", str(batch))
    (folder / "package").mkdir()
    package = write_torch_package(folder / "package", "block", source)
    app = folder / "app.toml"
    app.write_text(APP.format(package=package) + pinned)
    phases = folder / "phases"
    mln = build(app, folder / "block.mln", dump_phases=phases).output
    (text,) = [p.read_text() for p in phases.rglob("*dispatch-creation.mlir")]
    ops = [" ".join(re.findall(r"linalg\.\w+", d)) for d in DISPATCH.findall(text)]
    return mln, ops, source


@pytest.fixture(scope="module", params=[1, 4], ids=["batch1", "batch4"])
def chosen(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, list[str], str]:
    batch = request.param
    return (batch, *_build(tmp_path_factory.mktemp(f"images{batch}"), batch))


def test_each_image_runs_packed_with_its_batch_norm_add_and_relu_and_computes_like_torch(chosen):
    batch, mln, dispatches, source = chosen
    assert not any("linalg.conv_2d" in d for d in dispatches)
    # two convolutions per image, each a packed product
    assert sum("linalg.mmt4d" in d for d in dispatches) == 2 * batch
    # each product's result unpacked with the ops after it: no pass over the whole batch
    assert sum(d.startswith("linalg.unpack linalg.generic") for d in dispatches) == 2 * batch
    runs_like_torch(mln, source, TOLERANCE)


def test_the_choice_is_recorded_and_shown(chosen):
    _, mln, _, source = chosen
    _, manifest = runs_like_torch(mln, source, TOLERANCE)
    device = manifest["variants"][0]["devices"][0]
    choice = conv_batch_choice(True)
    assert device["host_chosen"]["conv_batch"] == {"value": "images", "reason": choice.reason}
    assert device["options"]["conv_batch"] == "images"
    shown = " ".join(CliRunner().invoke(plex_app, ["inspect", str(mln)]).output.split())
    assert "host-chosen [default/cpu]: conv_batch = images" in shown


def test_without_data_tiling_nothing_is_split():
    assert conv_batch_choice(False).value == "iree"
    assert conv_batch_choice(True).value == "images"


def test_a_pinned_iree_keeps_the_batch_in_one_product_and_computes_like_torch(tmp_path):
    mln, dispatches, source = _build(tmp_path, 4, 'conv_batch = "iree"\n')
    # IREE 3.13's im2col over a batch: products with the batch as a second dimension, which its
    # data tiling leaves unpacked
    assert not any("linalg.mmt4d" in d for d in dispatches)
    _, manifest = runs_like_torch(mln, source, TOLERANCE)
    device = manifest["variants"][0]["devices"][0]
    assert "conv_batch" not in device.get("host_chosen", {})
    assert "conv_batch" not in device.get("options", {})


# Segformer's decode head: features joined along channels, then a 1x1 convolution
JOINED_MODEL = """
import torch


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 6, 1)
        self.b = torch.nn.Conv2d(8, 6, 3, padding=1)
        self.fuse = torch.nn.Conv2d(12, 5, 1)

    def forward(self, x):
        return self.fuse(torch.cat([self.a(x), torch.relu(self.b(x))], dim=1))


def build():
    torch.manual_seed(0)
    return Head().eval(), (torch.randn(3, 8, 10, 10),)
"""


def _build_with_input_ir(tmp_path: Path, name: str, model: str) -> tuple[Path, str]:
    """The default app's build of `model` and its input-phase IR (after PLeX's rewrites)."""
    package = write_torch_package(tmp_path, name, model)
    app = tmp_path / "app.toml"
    app.write_text(APP.format(package=package))
    phases = tmp_path / "phases"
    mln = build(app, tmp_path / f"{name}.mln", dump_phases=phases).output
    (text,) = [p.read_text() for p in phases.rglob("*.input.mlir")]
    return mln, text


def test_features_joined_along_channels_are_joined_image_by_image(tmp_path):
    """A batch's concat along channels puts each image's parts apart (IREE copies them, strided);
    the convolution that reads it takes each image's parts joined, one contiguous block."""
    mln, text = _build_with_input_ir(tmp_path, "head", JOINED_MODEL)
    assert len(re.findall(r"tensor\.concat dim\(1\) .* -> tensor<1x12x10x10xf32>", text)) == 3
    runs_like_torch(mln, JOINED_MODEL, TOLERANCE)


# Segformer's Mix-FFN: a depthwise 3x3 convolution with a bias (its initial output the bias,
# broadcast over the batch), then GELU
DEPTHWISE_MODEL = """
import torch


class MixFFN(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)

    def forward(self, x):
        return torch.nn.functional.gelu(self.dw(x))


def build():
    torch.manual_seed(0)
    return MixFFN(24).eval(), (torch.randn(3, 24, 13, 13),)
"""


def test_a_depthwise_convolution_runs_image_by_image_from_its_padded_image(tmp_path):
    """IREE's depthwise convolution over a batch took 1.7x the time of its images one at a
    time (Segformer-b0 at batch 16); each image is padded, and its bias broadcast, alone."""
    mln, text = _build_with_input_ir(tmp_path, "mix", DEPTHWISE_MODEL)
    one_image = r" -> tensor<1x24x13x13xf32>"
    assert len(re.findall(r"linalg\.depthwise_conv_2d_nchw_chw .*" + one_image, text)) == 3
    assert "linalg.depthwise_conv_2d_nchw_chw" not in re.sub(r".*" + one_image, "", text)
    assert text.count("} : tensor<1x24x13x13xf32> to tensor<1x24x15x15xf32>") == 3  # padded
    runs_like_torch(mln, DEPTHWISE_MODEL, TOLERANCE)


# A 1-D depthwise convolution written as 2-D (ONNX's causal convolutions import so): a window
# of width 1
DEPTHWISE_1D_MODEL = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Conv2d(4, 4, (4, 1), groups=4).eval(), (torch.randn(2, 4, 11, 1),)
"""


def test_a_depthwise_convolution_with_a_window_of_width_1_keeps_its_batch(tmp_path):
    """Split by image, IREE 3.13's compile of such a convolution fails; it keeps IREE's batch
    form and computes as torch does."""
    mln, text = _build_with_input_ir(tmp_path, "dw1d", DEPTHWISE_1D_MODEL)
    assert re.search(r"linalg\.depthwise_conv_2d_nchw_chw .* -> tensor<2x4x8x1xf32>", text)
    runs_like_torch(mln, DEPTHWISE_1D_MODEL, TOLERANCE)
