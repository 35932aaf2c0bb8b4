"""Small real packages for the build tests."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def copy_example(name: str, folder: Path) -> Path:
    """A private copy of examples/<name> (tests edit sources); returns its app.toml."""
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns("plex.lock", "*.mln"))
    return folder / "app.toml"


def sharded_reference(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """examples/sharded: decode(encode(x)) with tied weights."""
    h = np.maximum(x @ w["w"] + w["b_enc"], 0.0)
    return h @ w["w"].T + w["b_dec"]


def write_mlp_split_by_entrypoint(folder: Path) -> Path:
    """The example MLP, its one source split into two shards by entrypoint; returns app.toml."""
    folder.mkdir(parents=True)
    for name in ("mlp.mlir", "params.safetensors"):
        shutil.copyfile(EXAMPLES / "mlp" / name, folder / name)
    (folder / "plex.toml").write_text(
        textwrap.dedent("""\
        [package]
        name = "mlpsplit"

        [graph.mlp]
        source = "mlp.mlir"
        weights = "params"
        shards = { first = ["hidden"], head = ["forward"] }

        [weights.params]
        source = "params.safetensors"
        scope = "mlp"
        """)
    )
    (folder / "app.toml").write_text('[app]\nname = "mlpsplit"\npackages = ["."]\n')
    return folder / "app.toml"


def matmul_chain_mlir(functions: int, module: str = "chain", first_size: int = 8) -> str:
    """A module of `functions` distinct two-matmul functions: compiles in ~0.3 s per function on
    the project's CPU, for tests that need a compile that lasts."""
    parts = []
    for i in range(functions):
        k = first_size + i
        t = f"tensor<4x{k}xf32>"
        w = f"tensor<{k}x{k}xf32>"
        parts.append(f"""
  func.func @f{i}(%x: {t}, %w: {w}) -> {t} {{
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : {t}
    %a = linalg.fill ins(%z : f32) outs(%e : {t}) -> {t}
    %m = linalg.matmul ins(%x, %w : {t}, {w}) outs(%a : {t}) -> {t}
    %m2 = linalg.matmul ins(%m, %w : {t}, {w}) outs(%a : {t}) -> {t}
    return %m2 : {t}
  }}""")
    return f"module @{module} {{{''.join(parts)}\n}}\n"


def write_chain_app(folder: Path, functions: int, graphs: int = 1) -> Path:
    """An app of `graphs` packages, each one graph of `matmul_chain_mlir(functions)`."""
    packages = []
    for g in range(graphs):
        package = folder / f"chain{g}"
        package.mkdir(parents=True)
        (package / "chain.mlir").write_text(matmul_chain_mlir(functions, f"chain{g}", 8 + 3 * g))
        (package / "plex.toml").write_text(
            f'[package]\nname = "chain{g}"\n\n[graph.chain{g}]\nsource = "chain.mlir"\n'
        )
        packages.append(f'"chain{g}"')
    (folder / "app.toml").write_text(
        f'[app]\nname = "chains"\npackages = [{", ".join(packages)}]\n'
    )
    return folder / "app.toml"


def write_weights_app(folder: Path, packages: int, tensor_bytes: int, tensors: int = 2) -> Path:
    """An app of `packages` packages, each a graph reading `tensors` float32 parameters of
    `tensor_bytes` each from its own safetensors weights package."""
    from safetensors.numpy import save_file

    n = tensor_bytes // 4
    names = []
    for p in range(packages):
        package = folder / f"w{p}"
        package.mkdir(parents=True)
        rng = np.random.default_rng(p)
        save_file(
            {f"t{i}": rng.standard_normal(n, dtype=np.float32) for i in range(tensors)},
            str(package / "params.safetensors"),
        )
        globals_ = "\n".join(
            f'  util.global private @t{i} = #flow.parameter.named<"w{p}"::"t{i}"> : tensor<{n}xf32>'
            for i in range(tensors)
        )
        (package / "model.mlir").write_text(
            f"module @g{p} {{\n{globals_}\n"
            f"  func.func @first(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n"
            f"    %t = util.global.load @t0 : tensor<{n}xf32>\n"
            f"    return %t : tensor<{n}xf32>\n  }}\n}}\n"
        )
        (package / "plex.toml").write_text(
            f'[package]\nname = "w{p}"\n\n[graph.g{p}]\nsource = "model.mlir"\n'
            f'weights = "params"\n\n[weights.params]\nsource = "params.safetensors"\n'
            f'scope = "w{p}"\n'
        )
        names.append(f'"w{p}"')
    (folder / "app.toml").write_text(f'[app]\nname = "weights"\npackages = [{", ".join(names)}]\n')
    return folder / "app.toml"
