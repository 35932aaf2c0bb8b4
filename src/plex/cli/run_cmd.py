"""`plex run`: call one entrypoint with inputs from the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from plex.cli.options import (
    allow_native_code_option,
    artifact_argument,
    function_option,
    inputs_option,
    variant_option,
)


def run(
    artifact: Path = artifact_argument(),
    function: str = function_option("Entrypoint to call."),
    inputs: list[str] = inputs_option(
        "An argument: @file.npy or SHAPExTYPE=VALUES (e.g. 2x3xf32=1,2,3,4,5,6; one value "
        "fills the tensor). Repeat in argument order."
    ),
    outputs: list[Path] = typer.Option(
        [],
        "--output",
        "-o",
        help="Save a result as a .npy file (the name must end in .npy). Repeat for several "
        "results.",
        metavar="FILE",
    ),
    variant: str = variant_option("Use this variant instead of the first that fits this machine."),
    trust: Path = typer.Option(
        None,
        "--trust",
        help="Run the file only if this public key (PEM) signed it (plex sign).",
        metavar="PUB",
    ),
    allow_native_code: bool = allow_native_code_option(),
) -> None:
    """Run one entrypoint and print (or save) its results."""
    import numpy as np

    import myelin
    from plex.cli.paths import check_writable_file
    from plex.cli.tensor_args import check_dtypes, format_tensor, parse_tensor_arg
    from plex.errors import PlexError

    args = [parse_tensor_arg(text) for text in inputs]
    for path in outputs:  # before the call: a long call must not end in an unwritable path
        if path.suffix != ".npy":  # np.save would append .npy and write a file not named here
            raise PlexError(
                f"--output {path}: results are saved as .npy files; give a name ending in .npy "
                f"(e.g. {path.with_suffix('.npy')})"
            )
        check_writable_file(path, "--output")
    model = myelin.Instance(trust=trust, allow_native_code=allow_native_code).load(
        artifact, variant=variant
    )
    check_dtypes(function, model.entrypoint(function).signature.inputs, args)
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
            try:
                np.save(outputs[i], np.asarray(value), allow_pickle=False)
            except OSError as e:
                raise PlexError(f"--output {outputs[i]}: cannot write it: {e.strerror}") from None
            typer.echo(f"result {i}: saved {outputs[i]}")
        else:
            typer.echo(f"result {i}: {format_tensor(value)}")
