"""Small real models and their numpy references, shared by tests and benchmarks."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np


def mlp_reference(w: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x @ w["w1"] + w["b1"], 0.0)
    return h, h @ w["w2"] + w["b2"]


def dense_literal(a: np.ndarray) -> str:
    if a.ndim == 1:
        return "[" + ", ".join(f"{v:.8e}" for v in a) + "]"
    return "[" + ", ".join(dense_literal(r) for r in a) + "]"


INLINE_W = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
INLINE_B = np.random.default_rng(2).standard_normal(16).astype(np.float32)


def write_torch_package(folder: Path, name: str, source: str) -> Path:
    """A package of one torch graph `name`, whose `model.py` (`source`) defines `build()`."""
    (folder / "model.py").write_text(source)
    (folder / "plex.toml").write_text(
        f'[package]\nname = "{name}"\n[graph.{name}]\nsource = "model.py:build"\n'
        'frontend = "torch"\n'
    )
    return folder


def write_stablehlo_package(folder: Path) -> Path:
    """A StableHLO graph with inline constant weights (2 KiB + 64 B) and a scalar argument."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.mlir").write_text(
        textwrap.dedent(f"""\
        module @shlo {{
          func.func @forward(%x: tensor<?x32xf32>) -> tensor<?x16xf32> {{
            %w = stablehlo.constant dense<{dense_literal(INLINE_W)}> : tensor<32x16xf32>
            %b = stablehlo.constant dense<{dense_literal(INLINE_B)}> : tensor<16xf32>
            %mm = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<?x32xf32>, tensor<32x16xf32>) -> tensor<?x16xf32>
            %n = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?x32xf32>) -> tensor<i32>
            %n1 = stablehlo.reshape %n : (tensor<i32>) -> tensor<1xi32>
            %c = stablehlo.constant dense<16> : tensor<1xi32>
            %dims = stablehlo.concatenate %n1, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
            %bb = stablehlo.dynamic_broadcast_in_dim %b, %dims, dims = [1] : (tensor<16xf32>, tensor<2xi32>) -> tensor<?x16xf32>
            %s = stablehlo.add %mm, %bb : tensor<?x16xf32>
            %y = stablehlo.tanh %s : tensor<?x16xf32>
            return %y : tensor<?x16xf32>
          }}
          func.func @scale(%x: tensor<2x3xf32>, %k: tensor<f32>) -> tensor<2x3xf32> {{
            %kb = stablehlo.broadcast_in_dim %k, dims = [] : (tensor<f32>) -> tensor<2x3xf32>
            %y = stablehlo.multiply %x, %kb : tensor<2x3xf32>
            return %y : tensor<2x3xf32>
          }}
        }}
        """)
    )
    (folder / "plex.toml").write_text(
        textwrap.dedent("""\
        [package]
        name = "shlo"
        version = "0.1.0"

        [graph.shlo]
        source = "model.mlir"
        frontend = "stablehlo"
        arg_names = { forward = ["x"], scale = ["x", "k"] }
        """)
    )
    return folder


def shlo_reference(x: np.ndarray) -> np.ndarray:
    return np.tanh(x @ INLINE_W + INLINE_B)


def runs_like_torch(mln: Path, source: str, atol: float) -> tuple[np.ndarray, dict]:
    """Call the `.mln`'s `forward` on the input `source`'s `build()` returns (the text
    `write_torch_package` packaged) and check it against the torch module's own output (rtol
    1e-5, `atol`); returns PLeX's output and the artifact's manifest."""
    import torch

    import myelin

    namespace: dict = {}
    exec(source, namespace)
    module, (x,) = namespace["build"]()
    model = myelin.Instance().load(mln)
    with model.session() as session:
        got = np.asarray(session.call("forward", x.numpy()))
    manifest = model.manifest
    model.close()
    with torch.no_grad():
        np.testing.assert_allclose(got, module(x).numpy(), rtol=1e-5, atol=atol)
    return got, manifest
