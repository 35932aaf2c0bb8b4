"""A CUDA device built for Hopper (`arch = "sm_90a"`) uses the kernel library unless the app says
`kernels = "none"`; without Triton the build says how to get it and falls back to IREE's codegen.
An MLIR graph (one f16 linear) keeps the builds small: no torch needed."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning
from plex.manifest import load_app

GRAPH = """
func.func @linear(%x: tensor<32x128xf16>, %w: tensor<64x128xf16>) -> tensor<32x64xf16> {
  %e = tensor.empty() : tensor<32x64xf16>
  %z = arith.constant 0.0 : f16
  %f = linalg.fill ins(%z : f16) outs(%e : tensor<32x64xf16>) -> tensor<32x64xf16>
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>,
      affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]
      ins(%x, %w : tensor<32x128xf16>, tensor<64x128xf16>) outs(%f : tensor<32x64xf16>)
      -> tensor<32x64xf16>
  return %r : tensor<32x64xf16>
}
"""
PACKAGE = '[package]\nname = "lin"\n\n[graph.lin]\nsource = "lin.mlir"\n'
APP = '[app]\nname = "hopper"\npackages = ["."]\n\n[devices.gpu]\ntarget = "cuda"\n{options}\n'


def _app(root: Path, options: str) -> Path:
    root.mkdir()
    (root / "lin.mlir").write_text(GRAPH)
    (root / "plex.toml").write_text(PACKAGE)
    (root / "app.toml").write_text(APP.format(options=options))
    return root / "app.toml"


def _build(app: Path) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        out = build(app, app.parent / "out.mln").output
    with MlnReader(out) as r:
        (device,) = r.manifest["variants"][0]["devices"]
    return device, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


def test_hopper_arch_turns_the_kernel_library_on_and_none_turns_it_off(tmp_path):
    pytest.importorskip("triton")
    device, warned = _build(_app(tmp_path / "on", 'arch = "sm_90a"'))
    assert device["options"]["kernels"] == "triton-attention"
    assert device["requires"] == {"cuda_arch": "sm_90a"}
    (site,) = device["kernels"]
    assert site["kernel"] and (site["m"], site["n"], site["k"]) == (32, 64, 128)
    assert not [w for w in warned if "Triton" in w]

    off = load_app(_app(tmp_path / "off", 'arch = "sm_90a"\nkernels = "none"'))
    (spec,) = off.devices
    # IREE's own code for Hopper is sm_80 PTX (IREE 3.13 has no sm_90 target)
    assert (spec.kernels, spec.arch) == (None, "sm_80")
    plain = load_app(_app(tmp_path / "plain", ""))
    assert plain.devices[0].kernels is None  # other archs: opt-in, as before


def test_without_triton_a_hopper_build_says_how_to_get_it_and_uses_iree_codegen(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    device, warned = _build(_app(tmp_path / "fallback", 'arch = "sm_90a"'))
    (warning,) = [w for w in warned if "Triton is not installed" in w]
    assert 'pip install -e ".[kernels]"' in warning and 'kernels = "none"' in warning
    assert not device.get("kernels") and not device.get("requires")
    assert device["options"].get("kernels") in (None, "")
