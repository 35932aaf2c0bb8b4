"""`plex profile`: capture one call with IREE's HAL profiling, summarize it, export a trace.

The call runs in IREE's own tools, which check inputs only deep inside the VM; so the inputs are
checked against the signature here first, exactly as `plex run` checks them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from plex.cli.options import (
    allow_native_code_option,
    artifact_argument,
    dims_option,
    function_option,
    inputs_option,
    variant_option,
)


def profile(
    artifact: Path = artifact_argument(),
    function: str = function_option("Entrypoint to profile."),
    inputs: list[str] = inputs_option(
        "As for `plex run`; without inputs, random tensors matching "
        "the signature are used (dynamic dims from --dim)."
    ),
    dims: list[str] = dims_option("Size of a dynamic dim for random inputs: NAME=N or *=N."),
    out_dir: Path = typer.Option(
        ...,
        "-o",
        "--output-dir",
        help="Folder for the capture and "
        "trace.json (Chrome trace format: open it in ui.perfetto.dev).",
        metavar="DIR",
    ),
    repeat: int = typer.Option(
        1,
        "--repeat",
        min=1,
        help="Calls to capture (more calls, steadier dispatch times).",
        metavar="N",
    ),
    device_timing: bool = typer.Option(
        None,
        "--device-timing/--no-device-timing",
        help="Device timestamps per dispatch (GPU drivers); "
        "default: the app's runtime.profile device_timing.",
    ),
    top: int = typer.Option(
        10, "--top", min=1, help="Rows of the hottest-dispatch table.", metavar="N"
    ),
    variant: str = variant_option("Variant to profile."),
    allow_native_code: bool = allow_native_code_option(),
) -> None:
    """Capture one call of an entrypoint and show its hottest dispatches.

    The capture is a HAL profile bundle (`iree-profile` reads it), one new file per run; its
    path comes from the app's runtime.profile output (`{capture}` is a unique id), else
    DIR/capture-{capture}.ireeprof. DIR/trace.json is the same capture as Chrome trace events
    (open it in ui.perfetto.dev).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import myelin
    from myelin.runtime.profiling import capture
    from plex.cli.paths import check_writable_dir
    from plex.cli.tensor_args import cli_inputs, describe_inputs
    from plex.errors import PlexError

    model = myelin.Instance(allow_native_code=allow_native_code).load(artifact, variant=variant)
    try:
        entry = model.entrypoint(function)
        args = cli_inputs(inputs, dims, entry.signature, entry.name)
        parameter_bytes = _parameter_bytes(model.manifest, model.variant_name)
        call_bytes = _call_bytes(entry, args)
    finally:
        model.close()
    check_writable_dir(out_dir, "--output-dir")
    try:
        result = capture(
            artifact,
            function,
            args,
            out_dir,
            variant=variant,
            device_timing=device_timing,
            repeat=repeat,
        )
    except OSError as e:  # e.g. the disk filled up while the capture was written
        where = f" {e.filename}" if e.filename else ""
        raise PlexError(f"profile capture: cannot write{where}: {e.strerror}") from None
    total = sum(s.total_ns for s in result.dispatches) or 1
    timing = result.dispatches[0].timing if result.dispatches else "host"
    table = Table(
        title=escape(
            f"{artifact.name} {function}: hottest dispatches ({timing} timing, "
            f"{repeat} call{'s' if repeat > 1 else ''}; inputs "
            f"{describe_inputs(entry.signature.inputs, args)})"
        )
    )
    table.add_column("dispatch", overflow="fold")
    for col in ("count", "total ms", "avg ms", "max ms", "share"):
        table.add_column(col, justify="right")
    for s in result.dispatches[:top]:
        table.add_row(
            escape(s.name),
            str(s.count),
            f"{s.total_ns / 1e6:.3f}",
            f"{s.avg_ns / 1e6:.3f}",
            f"{s.max_ns / 1e6:.3f}",
            f"{100 * s.total_ns / total:.1f}%",
        )
    console = Console(emoji=False, highlight=False)
    console.print(table)
    if result.memory_high_water is not None:
        console.print(
            f"peak queue-ordered memory: {result.memory_high_water:,} B (includes the "
            f"{parameter_bytes:,} B of parameters the profiling tool loads)"
        )
    if call_bytes is not None:
        console.print(
            f"transients + results of one call: {call_bytes:,} B (the build's memory plan)"
        )
    console.print(escape(f"capture: {result.profile}"))
    console.print(escape(f"trace:   {result.trace}"))


def _parameter_bytes(manifest: dict, variant: str) -> int:
    """Bytes of the variant's parameters: IREE's tools load them into queue-ordered memory, so
    the capture's peak counts them too."""
    [chosen] = [v for v in manifest["variants"] if v["name"] == variant]
    scopes = set(chosen.get("parameter_scopes", []))
    return sum(p["length"] for p in manifest["parameters"] if p["scope"] in scopes)


def _call_bytes(entry: object, args: list) -> int | None:
    """Transient and result bytes of one call with these inputs, from the memory plan the
    build recorded (None when the build could not bound them)."""
    from myelin.errors import MyelinError

    try:
        need = entry.memory.need(entry.name, args)  # type: ignore[attr-defined]
    except MyelinError:
        return None
    return need.transient + need.results
