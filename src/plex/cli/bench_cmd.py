"""`plex bench`: latency percentiles and throughput of one entrypoint, warm-up excluded."""

from __future__ import annotations

import time
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


def _rss_peak_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def bench(
    artifact: Path = artifact_argument(),
    function: str = function_option("Entrypoint to time."),
    inputs: list[str] = inputs_option(
        "As for `plex run`; without inputs, random tensors matching the signature are used."
    ),
    dims: list[str] = dims_option(
        "Size of a dynamic dim for random inputs: "
        "NAME=N (names as `plex inspect` shows them) or *=N."
    ),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed calls first.", metavar="N"),
    iterations: int = typer.Option(
        100, "-n", "--iterations", min=1, help="Timed calls.", metavar="N"
    ),
    variant: str = variant_option("Variant to use."),
    allow_native_code: bool = allow_native_code_option(),
) -> None:
    """Time an entrypoint: p50/p90/p99 latency, mean, calls/s and peak RSS."""
    import numpy as np
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import myelin
    from plex.cli.tensor_args import cli_inputs, describe_inputs

    model = myelin.Instance(allow_native_code=allow_native_code).load(artifact, variant=variant)
    entry = model.entrypoint(function)
    args = cli_inputs(inputs, dims, entry.signature, entry.name)
    with model.session() as session:
        call = session.resolve(function)
        for _ in range(warmup):
            call(*args)
        times = np.empty(iterations)
        for i in range(iterations):
            t0 = time.perf_counter()
            call(*args)
            times[i] = time.perf_counter() - t0
    ms = times * 1e3
    table = Table(
        title=escape(
            f"{artifact.name} {function} ({model.variant_name}), {iterations} calls "
            f"after {warmup} warm-up; inputs {describe_inputs(entry.signature.inputs, args)}"
        )
    )
    for col in ("p50 ms", "p90 ms", "p99 ms", "mean ms", "min ms", "calls/s", "peak RSS MiB"):
        table.add_column(col, justify="right")
    table.add_row(
        *(f"{v:.3f}" for v in np.percentile(ms, [50, 90, 99])),
        f"{ms.mean():.3f}",
        f"{ms.min():.3f}",
        f"{iterations / times.sum():.1f}",
        f"{_rss_peak_mib():.0f}",
    )
    Console(emoji=False).print(table)
