"""The CPU as shipped: data tiling chosen for the host, attention decomposed on llvm-cpu.

An app that leaves `data_tiling` unset gets the host's choice (on where IREE has matmul
microkernels for the CPU), recorded in the .mln with its reason and shown by `plex inspect`; an
app that pins it gets what it pinned. Attentions of llvm-cpu variants compile as two matmuls and
a softmax (myelin.compiler.cpu_attention) and compute what torch computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import myelin
from myelin import hostinfo
from myelin.compiler.targets import DATA_TILING_FLAGS, data_tiling_choice
from plex.builder import build
from plex.cli import app as plex_app
from tests.models import write_torch_package

MODEL = """
import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def forward(self, q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def build():
    q = torch.randn(1, 3, 24, 16)
    return Attention(), (q, q.clone(), q.clone(), torch.ones(1, 1, 24, 24, dtype=torch.bool))
"""

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
APP = '[app]\nname = "attn"\npackages = ["{package}"]\n\n[devices.cpu]\ntarget = "llvm-cpu"\n'


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_torch_package(tmp_path_factory.mktemp("attn_pkg"), "attn", MODEL)


def _build(package: Path, folder: Path, pinned: str = "") -> Path:
    app = folder / "app.toml"
    app.write_text(APP.format(package=package) + pinned)
    return build(app, folder / "attn.mln").output


@pytest.fixture(scope="module")
def default_mln(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(package, tmp_path_factory.mktemp("default"))


def _inputs() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 3, 24, 16), dtype=np.float32) for _ in range(3))
    keep = rng.random((1, 1, 24, 24)) < 0.6
    keep[..., 0] = True  # every query sees a key
    return q, k, v, keep


def _assert_computes_like_torch(mln: Path) -> dict:
    model = myelin.Instance().load(mln)
    q, k, v, keep = _inputs()
    with model.session() as session:
        got = np.asarray(session.call("forward", q, k, v, keep))
    want = F.scaled_dot_product_attention(
        *(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(keep)
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    manifest = model.manifest
    model.close()
    return manifest


@pytest.mark.parametrize(
    ("cpu", "features", "chosen"),
    [
        ("generic", "+avx2,+fma", False),  # measured no faster on an AVX2 host
        ("generic", "+avx512f", True),
        ("generic", "+avx2,+avx512f", True),
        ("generic", "", False),
        ("znver4", "", False),  # a named CPU is not looked up
    ],
)
def test_data_tiling_is_chosen_where_it_was_measured_to_pay(cpu, features, chosen):
    choice = data_tiling_choice(cpu, features)
    assert choice.value is chosen
    assert choice.reason


@pytest.mark.parametrize(
    ("vendor", "family", "model", "named"),
    [
        ("AuthenticAMD", "26", "17", "znver5"),
        ("AuthenticAMD", "25", "17", "znver4"),  # a Zen 4 EPYC (Genoa)
        ("AuthenticAMD", "25", "1", "znver3"),  # a Zen 3 EPYC (Milan)
        ("AuthenticAMD", "23", "49", None),
        ("GenuineIntel", "6", "143", None),
    ],
)
def test_the_hosts_amd_generation_is_named_as_llvm_names_it(
    monkeypatch, vendor, family, model, named
):
    fields = {"vendor_id": vendor, "cpu family": family, "model": model}
    monkeypatch.setattr(hostinfo, "cpuinfo", lambda: fields)
    assert hostinfo.llvm_cpu() == named


def test_the_host_choice_follows_this_cpus_isa():
    flags = hostinfo.cpu_flags()
    expected = (
        "avx512f" in flags or {"avx2", "fma"} <= flags or hostinfo.machine() in ("aarch64", "arm64")
    )
    assert data_tiling_choice("host", "").value is expected


def test_an_unpinned_app_records_the_host_choice_and_computes_like_torch(default_mln):
    manifest = _assert_computes_like_torch(default_mln)
    variant = manifest["variants"][0]
    choice = data_tiling_choice("host", "")
    assert variant["devices"][0]["host_chosen"]["data_tiling"] == {
        "value": choice.value,
        "reason": choice.reason,
    }
    assert (DATA_TILING_FLAGS[0] in variant["flags"]) is choice.value


def test_plex_inspect_shows_the_host_chosen_options(default_mln):
    result = CliRunner().invoke(plex_app, ["inspect", str(default_mln)])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())  # rich wraps lines at the terminal's width
    choice = data_tiling_choice("host", "")
    assert f"host-chosen [default/cpu]: data_tiling = {str(choice.value).lower()}" in shown
    assert choice.reason in shown


@pytest.mark.parametrize("pinned", [False, True])
def test_a_pinned_data_tiling_is_honoured_and_not_host_chosen(package, tmp_path, pinned):
    mln = _build(package, tmp_path, f"data_tiling = {str(pinned).lower()}\n")
    manifest = _assert_computes_like_torch(mln)
    device = manifest["variants"][0]["devices"][0]
    assert "data_tiling" not in device.get("host_chosen", {})
    assert (DATA_TILING_FLAGS[0] in manifest["variants"][0]["flags"]) is pinned


def test_attention_on_llvm_cpu_compiles_as_matmuls_and_a_softmax(package, tmp_path):
    app = tmp_path / "app.toml"
    app.write_text(APP.format(package=package))
    ir = tmp_path / "ir"
    build(app, ir, compile_to="abi")
    text = "\n".join(p.read_text() for p in ir.rglob("*.mlir"))
    assert "iree_linalg_ext.attention" not in text
    assert text.count("linalg.batch_matmul") == 2  # Q @ K^T and P @ V (inlined by now)


def test_an_app_that_encodes_weights_keeps_them_encoded(tmp_path):
    """Data tiling would decode each encoded matmul weight at load into fp32's packed copies:
    unpinned, the build leaves it off for an app with `[weights.codec]` and says why."""
    app = tmp_path / "app.toml"
    app.write_text(
        f'[app]\nname = "mlp"\npackages = ["{EXAMPLES / "mlp"}"]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\n\n[weights.codec]\n"*" = "int8"\n'
    )
    model = myelin.Instance().load(build(app, tmp_path / "mlp.mln").output)
    variant = model.manifest["variants"][0]
    model.close()
    assert DATA_TILING_FLAGS[0] not in variant["flags"]
    assert variant["devices"][0]["host_chosen"]["data_tiling"] == {
        "value": False,
        "reason": "the app encodes weights: they stay encoded in memory",
    }


CONV_MODEL = """
import torch


def build():
    torch.manual_seed(0)
    convs = torch.nn.Sequential(
        torch.nn.Conv1d(5, 7, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.Conv1d(7, 6, 3, stride=2, padding=2, dilation=2),
    )
    return convs.eval(), (torch.randn(2, 5, 33),)
"""

CONV2D_MODEL = """
import torch


def build():
    torch.manual_seed(0)
    convs = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 1),
    )
    return convs.eval(), (torch.randn(1, 3, 20, 20),)
"""


# a batch of images: each convolution runs one image at a time, IREE's packed batch-1 case
CONV2D_BATCH_MODEL = """
import torch


def build():
    torch.manual_seed(0)
    convs = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.Conv2d(16, 4, 1),
    )
    return convs.eval(), (torch.randn(3, 3, 20, 20),)
"""


# attention written out, as transformers' attn_implementation="eager" does
EAGER_ATTENTION_MODEL = """
import torch


class Eager(torch.nn.Module):
    def forward(self, q, k):
        scores = torch.matmul(q, k.transpose(2, 3)) * 0.25
        return torch.matmul(torch.softmax(scores, dim=-1), k)


def build():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 40, 16)
    return Eager().eval(), (q, torch.randn(1, 2, 40, 16))
"""


def _torch_app(tmp_path: Path, source: str, device_lines: str) -> Path:
    """A package whose torch graph is `source`'s `build()`, and an app over it on the CPU
    device of APP with `device_lines` added."""
    package = tmp_path / "conv"
    package.mkdir()
    (package / "model.py").write_text(source)
    (package / "plex.toml").write_text(
        '[package]\nname = "conv"\n[graph.conv]\nsource = "model.py:build"\nfrontend = "torch"\n'
    )
    app = tmp_path / "app.toml"
    app.write_text(APP.format(package=package) + device_lines)
    return app


def _assert_runs_like_torch(app: Path, source: str, tmp_path: Path) -> None:
    """The built app's `forward` equals `source`'s module in torch eager (1e-5)."""
    namespace: dict = {}
    exec(source, namespace)
    convs, xs = namespace["build"]()
    model = myelin.Instance().load(build(app, tmp_path / "conv.mln").output)
    with model.session() as session:
        got = np.asarray(session.call("forward", *(x.numpy() for x in xs)))
    model.close()
    with torch.inference_mode():
        want = convs(*xs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("source", "gone", "phase", "pinned"),
    [
        # Whisper's front end: strided, dilated, padded 1-D convolutions as gathered columns
        # times the filter (myelin.compiler.cpu_convolution), data tiling or not
        (CONV_MODEL, "linalg.conv_1d", "abi", ""),
        # ResNet's: IREE's im2col, which data tiling brings along (pinned: any host)
        (CONV2D_MODEL, "linalg.conv_2d", "global-optimization", "data_tiling = true\n"),
        # a written-out softmax stays reductions, not raised to IREE's softmax op
        # (myelin.compiler.cpu_max_reduction)
        (EAGER_ATTENTION_MODEL, "linalg.softmax", "global-optimization", ""),
    ],
    ids=["conv1d", "conv2d", "eager-softmax"],
)
def test_cpu_rewrites_leave_their_op_behind_and_compute_like_torch(
    tmp_path, source, gone, phase, pinned
):
    app = _torch_app(tmp_path, source, pinned)
    build(app, tmp_path / "ir", compile_to=phase)
    text = "\n".join(p.read_text() for p in (tmp_path / "ir").rglob("*.mlir"))
    assert gone not in text

    _assert_runs_like_torch(app, source, tmp_path)


def test_a_batch_of_2d_convolutions_runs_as_packed_matmuls_and_computes_like_torch(tmp_path):
    """IREE 3.13 packs an NCHW convolution's im2col product only at batch 1; a batch of 3 is
    split into one-image convolutions (myelin.compiler.cpu_convolution), so each becomes an
    `mmt4d` of IREE's microkernels, and the result is torch's."""
    app = _torch_app(tmp_path, CONV2D_BATCH_MODEL, "data_tiling = true\n")
    build(app, tmp_path / "ir", compile_to="dispatch-creation")
    text = "\n".join(p.read_text() for p in (tmp_path / "ir").rglob("*.mlir"))
    assert "linalg.conv_2d" not in text
    # three convolutions of three images each, every product packed
    assert text.count("linalg.mmt4d") >= 9

    _assert_runs_like_torch(app, CONV2D_BATCH_MODEL, tmp_path)
