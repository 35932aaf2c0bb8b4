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
    dump_phases: Path = typer.Option(
        None,
        "--dump-phases",
        help="Also write every module's IR at every compile phase to DIR/<module>/<variant>/.",
        metavar="DIR",
    ),
    compile_to: str = typer.Option(
        None,
        "--compile-to",
        help="Stop after this compile phase (input, abi, ..., flow, stream, ..., vm) and write "
        "the IR, with its phase recorded, to -o (a folder, or a .mlir file for one module) "
        "instead of a .mln.",
        metavar="PHASE",
    ),
    resume_from: list[Path] = typer.Option(
        None,
        "--resume-from",
        help="Compile a module from this phase file (written by --compile-to or --dump-phases, "
        "maybe edited) instead of from its source. Repeat for several modules.",
        metavar="FILE",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Fail when a weight codec's decode is not fused into its consumer."
    ),
) -> None:
    """Resolve packages, import graphs, compile each variant and pack one .mln."""
    from plex.builder import build as run_build
    from plex.builder import check_phase, plan_for

    check_phase(compile_to)
    app_toml = app_toml.resolve()
    if output is None:
        from plex.manifest import load_app

        name = load_app(app_toml).name
        output = app_toml.parent / (f"{name}.{compile_to}" if compile_to else f"{name}.mln")
    options = {
        "dump_phases": dump_phases,
        "compile_to": compile_to,
        "resume_from": tuple(resume_from or ()),
        "strict": strict,
    }
    console = Console(stderr=True, soft_wrap=True)
    if plan:
        _, the_plan = plan_for(app_toml, output, **options)
        typer.echo(the_plan.describe())
        return
    mode = "json" if json_ else progress
    with make_progress(mode, sys.stderr) as sink:
        result = run_build(
            app_toml,
            output,
            jobs=jobs,
            cache_dir=cache,
            use_cache=not no_cache,
            on_event=sink,
            **options,
        )
    if explain_:
        for line in explain(result.results):
            typer.echo(line)
    if mode != "json":
        if compile_to is not None:
            what = f"IR at phase '{compile_to}' to {output}"
        else:
            what = f"{output} ({_size(output.stat().st_size)})"
        if dump_phases is not None:
            what += f", every phase to {dump_phases}"
        console.print(
            f"[green]built[/green] {what} in {result.seconds:.1f} s: "
            f"{result.built} step(s) ran, {result.hits} cache hit(s); lock: {result.lock_path.name}"
        )
        if compile_to is None:
            console.print(_codec_sizes(output))


def _codec_sizes(artifact: Path) -> str:
    """`parameters by codec: int8 5.6 MiB (36), none 120.5 KiB (65)`."""
    from myelin.codecs import bytes_by_codec
    from myelin.mln import MlnReader

    with MlnReader(artifact, verify=False) as reader:
        totals = bytes_by_codec(reader.manifest["parameters"])
    parts = [f"{codec} {_size(b)} ({n})" for codec, (b, n) in totals.items()]
    return "parameters by codec: " + (", ".join(parts) or "none")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
