"""One .mln, several variants; reproducible bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import myelin
from plex.builder import build
from tests.models import mlp_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

APP = """\
[app]
name = "variants"
packages = ["{pkg}"]

[devices.gpu]
target = "cuda"

[devices.host]
target = "llvm-cpu"
cpu = "host"

[devices.portable]
target = "llvm-cpu"
cpu = "generic"

[[variant]]
name = "gpu"
devices = ["gpu"]

[[variant]]
name = "cpu"
devices = ["host"]

[[variant]]
name = "generic"
devices = ["portable"]
"""


@pytest.fixture(scope="module")
def variants_mln(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("variants")
    (root / "app.toml").write_text(APP.format(pkg=EXAMPLES / "mlp"))
    return build(root / "app.toml", root / "v.mln").output


def test_runtime_picks_the_first_variant_whose_devices_exist(variants_mln, mlp_weights):
    model = myelin.Instance().load(variants_mln)
    assert [v["name"] for v in model.manifest["variants"]] == ["gpu", "cpu", "generic"]
    assert model.variant_name == "cpu"  # no CUDA driver here
    x = np.ones((2, 16), np.float32)
    with model.session() as s:
        assert np.abs(s.call("forward", x) - mlp_reference(mlp_weights, x)[1]).max() < 1e-5


def test_a_named_variant_is_used(variants_mln, mlp_weights):
    model = myelin.Instance().load(variants_mln, variant="generic")
    assert model.variant_name == "generic"
    flags = model.variant["flags"]
    assert "--iree-llvmcpu-target-cpu=generic" in flags
    x = np.ones((2, 16), np.float32)
    with model.session() as s:
        assert np.abs(s.call("forward", x) - mlp_reference(mlp_weights, x)[1]).max() < 1e-5


def test_variants_share_parameter_sections(variants_mln):
    from myelin.mln import MlnReader

    with MlnReader(variants_mln) as r:
        kinds = [s.kind for s in r.sections.values()]
    assert kinds.count("module") == 3 and kinds.count("parameter") == 4


def test_unavailable_named_variant_lists_the_machine(variants_mln):
    with pytest.raises(myelin.DeviceUnavailable, match="local-task"):
        myelin.Instance().load(variants_mln, variant="gpu")
    with pytest.raises(myelin.DeviceUnavailable, match="has: gpu, cpu, generic"):
        myelin.Instance().load(variants_mln, variant="tpu")


def test_builds_are_byte_identical_from_different_folders(tmp_path):
    outputs = []
    for name in ("a", "b"):
        folder = tmp_path / name / "mlp"
        shutil.copytree(EXAMPLES / "mlp", folder)
        out = tmp_path / name / "mlp.mln"
        build(folder / "app.toml", out, use_cache=False)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_local_sync_driver_runs_the_same_module(tmp_path, mlp_weights):
    (tmp_path / "app.toml").write_text(
        f'[app]\nname = "sync"\npackages = ["{EXAMPLES / "mlp"}"]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-sync"\n'
    )
    out = build(tmp_path / "app.toml", tmp_path / "sync.mln").output
    model = myelin.Instance().load(out)
    assert model.variant["devices"][0]["driver"] == "local-sync"
    x = np.ones((3, 16), np.float32)
    with model.session() as s:
        assert np.abs(s.call("forward", x) - mlp_reference(mlp_weights, x)[1]).max() < 1e-5
