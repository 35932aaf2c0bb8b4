"""`plex profile`: capture one call with IREE's HAL profiling, summarize it, export a trace."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from plex.cli.tensor_args import parse_dims, parse_tensor_arg, synthetic_inputs


def profile(
    artifact: Path = typer.Argument(..., help="The .mln file."),
    function: str = typer.Option("forward", "-f", "--function", help="Entrypoint to profile."),
    inputs: list[str] = typer.Option(
        [],
        "--input",
        "-i",
        help="As for `plex run`; without inputs, random tensors matching "
        "the signature are used (dynamic dims from --dim).",
    ),
    dims: list[str] = typer.Option(
        [], "--dim", help="Size of a dynamic dim for random inputs: NAME=N or *=N."
    ),
    out_dir: Path = typer.Option(
        ...,
        "-o",
        "--output-dir",
        help="Folder for the capture and "
        "trace.json (Chrome trace format: open it in ui.perfetto.dev).",
    ),
    repeat: int = typer.Option(
        1, "--repeat", min=1, help="Calls to capture (more calls, steadier dispatch times)."
    ),
    device_timing: bool = typer.Option(
        None,
        "--device-timing/--no-device-timing",
        help="Device timestamps per dispatch (GPU drivers); "
        "default: the app's runtime.profile device_timing.",
    ),
    top: int = typer.Option(10, "--top", min=1, help="Rows of the hottest-dispatch table."),
    variant: str = typer.Option(None, "--variant", help="Variant to profile."),
) -> None:
    """Capture one call of an entrypoint and show its hottest dispatches.

    The capture is a HAL profile bundle (`iree-profile` reads it), one new file per run; its
    path comes from the app's runtime.profile output (`{capture}` is a unique id), else
    DIR/capture-{capture}.ireeprof. DIR/trace.json is the same capture as Chrome trace events
    (open it in ui.perfetto.dev).
    """
    import myelin
    from myelin.runtime.profiling import capture

    if inputs:
        args = [parse_tensor_arg(t) for t in inputs]
    else:
        model = myelin.Instance().load(artifact, variant=variant)
        try:
            args = synthetic_inputs(model.entrypoint(function).signature, parse_dims(dims))
        finally:
            model.close()
    result = capture(
        artifact,
        function,
        args,
        out_dir,
        variant=variant,
        device_timing=device_timing,
        repeat=repeat,
    )
    total = sum(s.total_ns for s in result.dispatches) or 1
    timing = result.dispatches[0].timing if result.dispatches else "host"
    table = Table(
        title=f"{artifact.name} {function}: hottest dispatches ({timing} timing, "
        f"{repeat} call{'s' if repeat > 1 else ''})"
    )
    table.add_column("dispatch", overflow="fold")
    for col in ("count", "total ms", "avg ms", "max ms", "share"):
        table.add_column(col, justify="right")
    for s in result.dispatches[:top]:
        table.add_row(
            s.name,
            str(s.count),
            f"{s.total_ns / 1e6:.3f}",
            f"{s.avg_ns / 1e6:.3f}",
            f"{s.max_ns / 1e6:.3f}",
            f"{100 * s.total_ns / total:.1f}%",
        )
    console = Console()
    console.print(table)
    if result.memory_high_water is not None:
        console.print(
            f"peak queue-ordered memory (transients + results): {result.memory_high_water:,} B"
        )
    console.print(f"capture: {result.profile}")
    console.print(f"trace:   {result.trace}")
