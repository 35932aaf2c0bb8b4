"""`[devices.x] kernels = "triton"` through plex build: the .mln records the sm_90a requirement
and which op went to which kernel, and a machine without a Hopper GPU runs the next variant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.mln import DeviceRecord, DeviceRequirements
from myelin.runtime.devices import DeviceRegistry
from plex.builder import build

GRAPH = """
func.func @linear(%x: tensor<?x128xf16>, %w: tensor<64x128xf16>) -> tensor<?x64xf16> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<?x128xf16>
  %e = tensor.empty(%m) : tensor<?x64xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<?x64xf16>) -> tensor<?x64xf16>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>,
      affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]
      ins(%x, %w : tensor<?x128xf16>, tensor<64x128xf16>) outs(%f : tensor<?x64xf16>)
      -> tensor<?x64xf16>
  return %r : tensor<?x64xf16>
}
"""
PACKAGE = """
[package]
name = "lin"

[graph.lin]
source = "lin.mlir"
"""
APP = """
[app]
name = "kernels"
packages = ["."]

[devices.hopper]
target = "cuda"
kernels = "triton"

[devices.cpu]
target = "llvm-cpu"
cpu = "generic"

[[variant]]
name = "hopper"
devices = ["hopper"]

[[variant]]
name = "cpu"
devices = ["cpu"]
"""


@pytest.fixture(scope="module")
def kernels_mln(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kernels_app")
    (root / "lin.mlir").write_text(GRAPH)
    (root / "plex.toml").write_text(PACKAGE)
    (root / "app.toml").write_text(APP)
    return build(root / "app.toml", root / "k.mln").output


def test_the_artifact_records_the_requirement_and_the_kernel_of_each_op(kernels_mln):
    model = myelin.Instance().load(kernels_mln)
    hopper = model.manifest["variants"][0]
    device = hopper["devices"][0]
    assert device["options"]["kernels"] == "triton"
    assert device["requires"] == {"cuda_arch": "sm_90a"}
    [site] = device["kernels"]
    assert site["module"] == "lin" and site["function"] == "linear"
    assert (site["op"], site["m"], site["n"], site["k"]) == ("matmul_transpose_b", None, 64, 128)
    assert site["kernel"] == "plex_matmul_tma_abt_f16_f16_128x256x64_w8s3"
    assert not model.manifest["variants"][1]["devices"][0].get("requires")


class _GpuOf(DeviceRegistry):
    """This machine's registry, told that a CUDA driver works and its GPU has `capability`:
    what a machine with another GPU would report (no GPU is needed to test the choice)."""

    def __init__(self, capability: tuple[int, int] | None) -> None:
        super().__init__()
        self.capability = capability

    def _driver(self, name: str):
        return object() if name == "cuda" else super()._driver(name)

    def cuda_capability(self) -> tuple[int, int] | None:
        return self.capability


def test_sm_90a_code_runs_only_on_compute_capability_9_0():
    device = DeviceRecord("gpu", "cuda", "cuda", requires=DeviceRequirements(cuda_arch="sm_90a"))
    assert _GpuOf((9, 0)).why_unusable(device) is None
    for other in ((8, 0), (8, 9), (10, 0), None):
        reason = _GpuOf(other).why_unusable(device)
        assert reason is not None and "sm_90a" in reason, other
    plain = DeviceRecord("gpu", "cuda", "cuda", requires=DeviceRequirements(cuda_arch="sm_90"))
    assert _GpuOf((10, 0)).why_unusable(plain) is None
    assert _GpuOf((8, 9)).why_unusable(plain) is not None


def test_an_a100_runs_the_next_variant(kernels_mln):
    instance = myelin.Instance()
    instance.device_registry = _GpuOf((8, 0))  # a working CUDA driver, an sm_80 GPU
    model = instance.load(kernels_mln)
    assert model.variant_name == "cpu"
    x = np.random.default_rng(0).standard_normal((3, 128)).astype(np.float16)
    w = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float16)
    with model.session() as s:
        y = s.call("linear", x, w)
    expected = x.astype(np.float32) @ w.astype(np.float32).T
    assert np.abs(y.astype(np.float32) - expected).max() < 0.05 * np.abs(expected).max()


def test_the_hopper_variant_asked_for_by_name_says_why_it_cannot_run(kernels_mln):
    instance = myelin.Instance()
    instance.device_registry = _GpuOf((8, 6))
    with pytest.raises(myelin.DeviceUnavailable, match=r"sm_90a.*compute capability 8\.6"):
        instance.load(kernels_mln, variant="hopper")
