"""`plex build`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from synapse import explain, make_progress


def build(
    app_toml: Path = typer.Argument(..., help="The application manifest (app.toml)."),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="Where to write the .mln (default: <app name>.mln beside app.toml).",
    ),
    jobs: int = typer.Option(
        None,
        "-j",
        "--jobs",
        min=1,
        help="Most build steps at once (default: [build] jobs, else the CPU count).",
    ),
    cache: Path = typer.Option(
        None,
        "--cache",
        help="Cache folder (default: [build] cache, "
        "else $PLEX_CACHE_DIR, else the user cache folder).",
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Build everything from scratch and store nothing."
    ),
    plan: bool = typer.Option(False, "--plan", help="Print the build DAG and exit."),
    explain_: bool = typer.Option(
        False, "--explain", help="Say for each step whether it was a cache hit or why it rebuilt."
    ),
    progress: str = typer.Option("auto", "--progress", help="auto | rich | plain | json"),
    json_: bool = typer.Option(
        False, "--json", help="Progress as JSON event lines (same as --progress json)."
    ),
) -> None:
    """Resolve packages, import graphs, compile each variant and pack one .mln."""
    from plex.build import build as run_build
    from plex.build import plan_for

    app_toml = app_toml.resolve()
    if output is None:
        from plex.manifest import load_app

        output = app_toml.parent / f"{load_app(app_toml).name}.mln"
    console = Console(stderr=True, soft_wrap=True)
    if plan:
        _, the_plan = plan_for(app_toml, output)
        typer.echo(the_plan.describe())
        return
    mode = "json" if json_ else progress
    with make_progress(mode, sys.stderr) as sink:
        result = run_build(
            app_toml, output, jobs=jobs, cache_dir=cache, use_cache=not no_cache, on_event=sink
        )
    if explain_:
        for line in explain(result.results):
            typer.echo(line)
    if mode != "json":
        size = output.stat().st_size
        console.print(
            f"[green]built[/green] {output} ({_size(size)}) in {result.seconds:.1f} s: "
            f"{result.built} step(s) ran, {result.hits} cache hit(s); lock: {result.lock_path.name}"
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
