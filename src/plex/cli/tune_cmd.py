"""`plex tune`: search tile configs for one device's hot dispatches and write a tuning package
(plex.toml with [tuning.<device>], the spec, tuning.json, tuning.png, summary.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from plex.cli.options import dims_option, function_option, jobs_option


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
    function: str = function_option("Entrypoint to time (default: forward or the first).", None),
    dims: list[str] = dims_option("Size of a dynamic dim for the random inputs: NAME=N or *=N."),
    dispatches: int = typer.Option(
        3, "--dispatches", min=1, help="Hottest contraction dispatches to tune.", metavar="N"
    ),
    rounds: int = typer.Option(
        5, "--rounds", min=1, help="Interleaved timing rounds per batch.", metavar="N"
    ),
    jobs: int = jobs_option("Candidates built at once (default: CPU count)."),
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
        help="A backend package folder (e.g. examples/backends/blas): also time every op it "
        "implements (matmul, attention, gelu) on it, as one candidate (docs/tuning.md).",
        metavar="DIR",
    ),
    required_gain: float = typer.Option(
        None,
        "--required-gain",
        help="The gain the tuned build must show to be applied, as a fraction (0.1: 10%% "
        "faster); default: the untuned build's measured noise (docs/tuning.md).",
        metavar="F",
    ),
    bundle: Path = typer.Option(
        None,
        "--bundle",
        help="Split tuning, for a device on another machine: compile the reference and one "
        "round of candidates into BUNDLE, time them there with `python -m "
        "myelin.tuning.time_bundle`, then --collect (docs/tuning.md).",
        metavar="BUNDLE",
    ),
    collect: Path = typer.Option(
        None,
        "--collect",
        help="Split tuning: tell the search what time_bundle measured (its -o folder), write "
        "the package and, while trials remain, the next round's bundle.",
        metavar="RESULTS",
    ),
) -> None:
    """Tune an app for one device: ranked hot dispatches, nevergrad search, checked outputs."""
    from plex.extras import extras_for_executor, require

    # before the reference build: the search, the solver and the plot need the extra, and
    # candidates built on a cluster need Ray
    for extra in ("tune", *extras_for_executor(executor)):
        require(extra)
    from plex.tune import tune as run_tune

    path = app_path / "app.toml" if app_path.is_dir() else app_path
    if bundle is not None or collect is not None:
        _split(
            path,
            device,
            out_dir,
            bundle,
            collect,
            trials,
            batch,
            function,
            dims,
            dispatches,
            rounds,
            jobs,
        )
        return
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
        required_gain=required_gain,
    )


def _split(
    path: Path,
    device: str,
    out_dir: Path,
    bundle: Path | None,
    collect: Path | None,
    trials: int,
    batch: int,
    function: str | None,
    dims: list[str],
    dispatches: int,
    rounds: int,
    jobs: int | None,
) -> None:
    """--bundle / --collect: one step of the split flow, then the exact next commands."""
    from plex.tune import (
        collect_bundle_results,
        collect_kernel_results,
        make_bundle,
        make_kernel_bundle,
        next_commands,
        read_results,
    )

    echo = typer.echo
    if _tunes_kernels(path, device, collect):
        if collect is not None:
            results = read_results(collect)
            collect_kernel_results(results, device, out_dir, log=echo)
            echo("plex tune: kernel configs collected; the package is final")
            return
        assert bundle is not None
        make_kernel_bundle(
            path, device, out_dir, bundle, trials=trials, rounds=rounds, jobs=jobs, log=echo
        )
        first, _ = next_commands(path, device, out_dir, bundle)
        echo("next, on the device's machine (runtime wheel only; copy BUNDLE there):")
        echo(f"  {first}")
        echo("then here, with that results folder copied back: the same command with --collect")
        return
    if collect is not None:
        written = collect_bundle_results(
            path, device, out_dir, collect, bundle, jobs=jobs, log=echo
        )
        if written is None:
            echo("plex tune: every dispatch has its trials; the package is final")
            return
        bundle = written
    else:
        assert bundle is not None
        make_bundle(
            path,
            device,
            out_dir,
            bundle,
            trials=trials,
            batch=batch,
            function=function,
            dims=dims,
            max_dispatches=dispatches,
            rounds=rounds,
            jobs=jobs,
            log=echo,
        )
    first, second = next_commands(path, device, out_dir, bundle)
    echo("next, on the device's machine, from a copy of this repository with the")
    echo("iree-base-runtime wheel installed (no compiler needed; copy BUNDLE there):")
    echo(f"  {first}")
    echo("then here, with that results folder copied back:")
    echo(f"  {second}")


def _tunes_kernels(path: Path, device: str, collect: Path | None) -> bool:
    """Whether this split step tunes kernel-library configs: a cuda device with `kernels` (for
    --bundle), or results of a kernel-config bundle (for --collect)."""
    from plex.manifest import load_app
    from plex.tune import KERNEL_BUNDLE_KIND, read_results

    if collect is not None:
        return read_results(collect)["bundle"].get("kind") == KERNEL_BUNDLE_KIND
    spec = next((d for d in load_app(path).devices if d.name == device), None)
    return spec is not None and spec.target == "cuda" and bool(spec.kernels)
