"""`plex build`: one app manifest to one .mln (or to IR at a phase), with progress.

The default output follows one rule: `<app name>.mln` beside the app manifest, and a folder
stands for its `app.toml` (`plex.cli.paths.resolve_app`). Ctrl-C says at once that the build is
stopping and which running steps it waits for (IREE cannot be interrupted inside a step).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from plex.cli.options import app_toml_argument, jobs_option


def build(
    app_toml: Path = app_toml_argument(),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="Where to write the .mln (default: <app name>.mln beside app.toml, also when "
        "APP_TOML is a folder).",
        metavar="PATH",
    ),
    jobs: int = jobs_option(
        "Most build steps at once (default: [build] jobs, else the CPU count)."
    ),
    cache: Path = typer.Option(
        None,
        "--cache",
        help="Cache folder (default: [build] cache, "
        "else $PLEX_CACHE_DIR, else the user cache folder).",
        metavar="DIR",
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Build everything from scratch and store nothing."
    ),
    plan: bool = typer.Option(False, "--plan", help="Print the build DAG and exit."),
    explain_: bool = typer.Option(
        False, "--explain", help="Say for each step whether it was a cache hit or why it rebuilt."
    ),
    progress: str = typer.Option(
        "auto", "--progress", help="auto | rich | plain | json", metavar="MODE"
    ),
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
    executor: str = typer.Option(
        None,
        "--executor",
        help="Where steps run: local, ray (the cluster Ray finds: RAY_ADDRESS or `ray start`), "
        "ray=ADDRESS (default: [build] executor, else local). See docs/cluster.md.",
        metavar="NAME",
    ),
) -> None:
    """Resolve packages, import graphs, compile each variant and pack one .mln."""
    from plex.builder import build as run_build
    from plex.builder import check_phase, plan_for
    from plex.cli.paths import resolve_app
    from synapse import explain, make_progress

    check_phase(compile_to)
    app_toml = resolve_app(app_toml)
    quiet_model_progress_bars()
    if output is None:
        name = _app_name(app_toml)
        output = app_toml.parent / (f"{name}.{compile_to}" if compile_to else f"{name}.mln")
    options = {
        "dump_phases": dump_phases,
        "compile_to": compile_to,
        "resume_from": tuple(resume_from or ()),
        "strict": strict,
    }
    if plan:
        _, the_plan = plan_for(app_toml, output, **options)
        typer.echo(the_plan.describe())
        return
    mode = "json" if json_ else progress
    with make_progress(mode, sys.stderr) as sink, announce_interrupt(sink) as on_event:
        result = run_build(
            app_toml,
            output,
            jobs=jobs,
            cache_dir=cache,
            use_cache=not no_cache,
            on_event=on_event,
            executor=executor,
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
        # click's styling, not rich: a no-op rebuild in a log should not pay for importing rich.
        typer.secho("built", fg="green", err=True, nl=False)
        typer.echo(
            f" {what} in {result.seconds:.1f} s: {result.built} step(s) ran, "
            f"{result.hits} cache hit(s); lock: {result.lock_path.name}",
            err=True,
        )
        if compile_to is None:
            typer.echo(_codec_sizes(output), err=True)


def _app_name(app_toml: Path) -> str:
    """The app's name, for the default output path, read with tomllib: the build validates the
    whole manifest right after (a second full load would cost a no-op rebuild its time); a
    manifest too broken to name is loaded here so its error reads as usual."""
    import tomllib

    try:
        name = tomllib.loads(app_toml.read_text())["app"]["name"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
        name = None
    if isinstance(name, str) and name:
        return name
    from plex.manifest import load_app

    return load_app(app_toml).name


def quiet_model_progress_bars() -> None:
    """Keep progress bars of model code out of plex's output: a torch model built through
    transformers prints a "Loading weights" bar into the middle of ours. Hugging Face libraries
    read this variable when they are imported, which happens inside the import step, after this
    call; a value the user set is kept."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class _RunningSteps:
    """Forwards events to the progress renderer and remembers which steps are running."""

    def __init__(self, sink: Callable[[Any], None]) -> None:
        self.sink = sink
        self.running: dict[str, float] = {}  # node id -> start (monotonic)

    def __call__(self, event: Any) -> None:
        if event.kind == "start":
            self.running[event.node_id] = time.monotonic()
        elif event.kind in ("finish", "error"):
            self.running.pop(event.node_id, None)
        self.sink(event)

    def stopping_message(self) -> str:
        running = dict(self.running)  # one C-level copy: safe against a worker's event
        if not running:
            return "plex: stopping the build"
        now = time.monotonic()
        steps = ", ".join(f"{node} ({now - t0:.0f}s in)" for node, t0 in running.items())
        return (
            # import/encode/compile run in worker processes, which are killed at once; a step in a
            # thread (PLEX_BUILD_ISOLATE=0, or weights) is awaited
            f"plex: stopping the build; stopping {len(running)} running step(s): {steps}; "
            "nothing unfinished is kept"
        )


@contextlib.contextmanager
def announce_interrupt(sink: Callable[[Any], None]) -> Iterator[Callable[[Any], None]]:
    """While the build runs, Ctrl-C prints what the build is waiting for, at once, then raises
    KeyboardInterrupt as before (the executor cancels and drains; the CLI exits 130)."""
    steps = _RunningSteps(sink)

    def on_sigint(signum: int, frame: object) -> None:
        with contextlib.suppress(RuntimeError):  # a write to stderr was under way here
            print(steps.stopping_message(), file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread (an embedding caller): no handler of ours
        yield steps
        return
    try:
        yield steps
    finally:
        signal.signal(signal.SIGINT, previous)


def _codec_sizes(artifact: Path) -> str:
    """`parameters by codec: int8 5.6 MiB (36), none 120.5 KiB (65)`."""
    from myelin.codecs import bytes_by_codec
    from myelin.mln import MlnReader

    with MlnReader(artifact, verify=False) as reader:
        totals = bytes_by_codec(reader.manifest["parameters"])
    if not totals:
        return no_parameters_line()
    parts = [f"{codec} {_size(b)} ({n})" for codec, (b, n) in totals.items()]
    return "parameters by codec: " + ", ".join(parts)


def no_parameters_line() -> str:
    """What `plex build` and `plex inspect` say of an artifact without parameters: why a model
    with inline constants (the `plex init` scaffold's 8x4 matrix) can have none."""
    from myelin.compiler.options import DEFAULT_MIN_PARAMETER_BYTES

    return (
        "parameters: 0 (no weights file, and inline constants under "
        f"{DEFAULT_MIN_PARAMETER_BYTES} bytes stay in the code; larger ones become parameters)"
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
