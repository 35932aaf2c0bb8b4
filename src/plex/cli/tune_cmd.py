"""`plex tune`: search tile configs for one device's hot dispatches and write a tuning package
(plex.toml with [tuning.<device>], the spec, tuning.json, tuning.png, summary.md)."""

from __future__ import annotations

from pathlib import Path

import typer


def tune(
    app_path: Path = typer.Argument(..., help="The app.toml (or its folder).", metavar="APP"),
    device: str = typer.Option(..., "--device", help="The app's device to tune.", metavar="NAME"),
    out_dir: Path = typer.Option(
        ..., "-o", "--output-dir", help="Folder for the tuning package.", metavar="DIR"
    ),
    trials: int = typer.Option(
        16, "--trials", min=1, help="Candidates timed per dispatch.", metavar="N"
    ),
    batch: int = typer.Option(
        4, "--batch", min=1, help="Candidates asked, built and timed per round.", metavar="N"
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the searches recorded in DIR/tuning.json."
    ),
    function: str = typer.Option(
        None,
        "-f",
        "--function",
        help="Entrypoint to time (default: forward or the first).",
        metavar="NAME",
    ),
    dims: list[str] = typer.Option(
        [],
        "--dim",
        help="Size of a dynamic dim for the random inputs: NAME=N or *=N.",
        metavar="NAME=N",
    ),
    dispatches: int = typer.Option(
        3, "--dispatches", min=1, help="Hottest contraction dispatches to tune.", metavar="N"
    ),
    rounds: int = typer.Option(
        5, "--rounds", min=1, help="Interleaved timing rounds per batch.", metavar="N"
    ),
    jobs: int = typer.Option(
        None,
        "-j",
        "--jobs",
        min=1,
        help="Candidates built at once (default: CPU count).",
        metavar="N",
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="local, or ray / ray=ADDRESS: candidates build as CPU tasks on the cluster, each "
        "batch is timed by a task that claims one GPU (docs/cluster.md).",
        metavar="NAME",
    ),
    backend: Path = typer.Option(
        None,
        "--backend",
        help="A backend package folder (e.g. examples/backends/blas): also time every matmul "
        "on it, as one candidate (docs/tuning.md).",
        metavar="DIR",
    ),
) -> None:
    """Tune an app for one device: ranked hot dispatches, nevergrad search, checked outputs."""
    from plex.tune import tune as run_tune

    path = app_path / "app.toml" if app_path.is_dir() else app_path
    run_tune(
        path,
        device,
        out_dir,
        trials=trials,
        batch=batch,
        resume=resume,
        function=function,
        dims=dims,
        max_dispatches=dispatches,
        rounds=rounds,
        jobs=jobs,
        log=lambda line: typer.echo(line, err=False),
        executor=executor,
        backend=backend,
    )
