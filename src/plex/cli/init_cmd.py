"""`plex init`: scaffold a package and an app that build and run as they are."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from plex.errors import PlexError


def _linear_model(name: str) -> str:
    """A dynamic-batch linear layer with inline constant weights (PLeX moves them into
    parameters at build time)."""
    import numpy as np

    rng = np.random.default_rng(0)
    w = np.round(rng.standard_normal((8, 4)), 3)
    rows = ", ".join("[" + ", ".join(f"{v:.3f}" for v in row) + "]" for row in w)
    return f"""// y = x @ W: replace this with your model
// (linalg, or StableHLO with frontend = "stablehlo" in plex.toml).
module @{name} {{
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x4xf32> {{
    %w = arith.constant dense<[{rows}]> : tensor<8x4xf32>
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x8xf32>
    %zero = arith.constant 0.0 : f32
    %init = tensor.empty(%n) : tensor<?x4xf32>
    %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x4xf32>) -> tensor<?x4xf32>
    %y = linalg.matmul ins(%x, %w : tensor<?x8xf32>, tensor<8x4xf32>)
                       outs(%acc : tensor<?x4xf32>) -> tensor<?x4xf32>
    return %y : tensor<?x4xf32>
  }}
}}
"""


def init(
    folder: Path = typer.Argument(
        ..., help="Folder for the new package (created).", metavar="FOLDER"
    ),
    name: str = typer.Option(
        None, "--name", help="Package name (default: the folder name).", metavar="NAME"
    ),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty folder."),
) -> None:
    """Create plex.toml, a model and app.toml that `plex build` handles out of the box."""
    pkg = name or re.sub(r"[^a-z0-9_-]", "_", folder.resolve().name.lower())
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", pkg):
        raise PlexError(f"package name {pkg!r} must match [a-z][a-z0-9_-]*; pass --name")
    graph = re.sub(r"[^A-Za-z0-9_]", "_", pkg)
    if folder.exists() and any(folder.iterdir()) and not force:
        raise PlexError(f"{folder} is not empty; choose a new folder or pass --force")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.mlir").write_text(_linear_model(graph))
    (folder / "plex.toml").write_text(
        f'[package]\nname = "{pkg}"\nversion = "0.1.0"\ndescription = ""\n\n'
        f'[graph.{graph}]\nsource = "model.mlir"\n'
        f'arg_names = {{ forward = ["x"] }}\n'
    )
    (folder / "app.toml").write_text(
        f'[app]\nname = "{pkg}"\nversion = "0.1.0"\npackages = ["."]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\n'
    )
    # Quoted as a shell needs them: `plex init "My Model"` must print commands that paste.
    typer.echo(
        f"created {shlex.quote(str(folder / 'plex.toml'))}, model.mlir and app.toml. Next:\n"
        f"  plex build {shlex.quote(str(folder / 'app.toml'))} -o {shlex.quote(pkg + '.mln')}\n"
        f"  plex run {shlex.quote(pkg + '.mln')} -f forward --input 2x8xf32=1"
    )
