"""`plex run`: call one entrypoint with inputs from the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from plex.cli.tensor_args import format_tensor, parse_tensor_arg
from plex.errors import PlexError


def run(
    artifact: Path = typer.Argument(..., help="The .mln file."),
    function: str = typer.Option("forward", "-f", "--function", help="Entrypoint to call."),
    inputs: list[str] = typer.Option(
        [],
        "--input",
        "-i",
        help="An argument: @file.npy or SHAPExTYPE=VALUES (e.g. 2x3xf32=1,2,3,4,5,6; one value "
        "fills the tensor). Repeat in argument order.",
    ),
    outputs: list[Path] = typer.Option(
        [], "--output", "-o", help="Save a result as .npy. Repeat for several results."
    ),
    variant: str = typer.Option(
        None, "--variant", help="Use this variant instead of the first that fits this machine."
    ),
) -> None:
    """Run one entrypoint and print (or save) its results."""
    import myelin

    args = [parse_tensor_arg(text) for text in inputs]
    model = myelin.Instance().load(artifact, variant=variant)
    with model.session() as session:
        result = session.call(function, *args)
    results = list(result) if isinstance(result, tuple) else [result]
    if outputs and len(outputs) != len(results):
        raise PlexError(
            f"{function} returned {len(results)} result(s) but {len(outputs)} --output path(s) "
            "were given; give one per result"
        )
    for i, value in enumerate(results):
        if outputs:
            np.save(outputs[i], np.asarray(value), allow_pickle=False)
            typer.echo(f"result {i}: saved {outputs[i]}")
        else:
            typer.echo(f"result {i}: {format_tensor(value)}")
