"""`plex inspect`: what is inside a .mln, without running anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from myelin.mln import MlnReader
from myelin.signature import TensorSpec
from plex.cli.build_cmd import _size


def inspect(
    artifact: Path = typer.Argument(..., help="The .mln file."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw manifest as JSON."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Check every section's content hash (default: on)."
    ),
) -> None:
    """Show variants, entrypoints with signatures, parameters, sizes and provenance."""
    with MlnReader(artifact, verify=verify) as reader:
        manifest = reader.manifest
        sections = reader.sections
        size = reader.file_size
    if as_json:
        typer.echo(json.dumps(manifest, indent=2, sort_keys=True))
        return
    console = Console()
    app = manifest["app"]
    console.print(
        f"[bold]{artifact}[/bold]: app {app['name']} {app.get('version', '')}, {_size(size)}, "
        f"format {manifest['format']['major']}.{manifest['format']['minor']}"
        + (", all section hashes verified" if verify else "")
    )
    variants = Table(title="variants (the runtime picks the first whose devices exist)")
    for col in ("variant", "devices", "modules", "module bytes", "parameter scopes"):
        variants.add_column(col)
    for v in manifest["variants"]:
        devices = ", ".join(
            f"{d['name']} ({d['target']} on {d['driver']}"
            + "".join(f", {k}={val}" for k, val in d.get("options", {}).items())
            + ")"
            for d in v["devices"]
        )
        module_bytes = sum(sections[m["section"]].length for m in v["modules"])
        variants.add_row(
            v["name"],
            devices,
            ", ".join(m["name"] for m in v["modules"]),
            _size(module_bytes),
            ", ".join(v.get("parameter_scopes", [])),
        )
    console.print(variants)
    entry = Table(title="entrypoints")
    for col in ("variant", "name", "inputs", "outputs"):
        entry.add_column(col)
    for v in manifest["variants"]:
        for e in v["entrypoints"]:
            entry.add_row(
                v["name"],
                e["name"],
                escape(", ".join(TensorSpec.from_json(t).describe() for t in e["inputs"])),
                escape(", ".join(TensorSpec.from_json(t).describe() for t in e["outputs"])),
            )
    console.print(entry)
    params = manifest["parameters"]
    if params:
        table = Table(
            title=f"parameters ({len(params)}, {_size(sum(p['length'] for p in params))})"
        )
        for col in ("scope", "key", "dtype", "shape", "codec", "stored bytes", "offset"):
            table.add_column(col)
        for p in params:
            table.add_row(
                p["scope"],
                p["key"],
                p["dtype"],
                "x".join(map(str, p["shape"])),
                p["codec"],
                str(p["length"]),
                str(sections[p["section"]].offset + p["offset"]),
            )
        console.print(table)
    prov = manifest.get("provenance", {})
    console.print("[bold]provenance[/bold]")
    for key in sorted(prov):
        if key not in ("sources", "packages"):
            console.print(f"  {key}: {prov[key]}")
    for ref, digest in sorted(prov.get("sources", {}).items()):
        console.print(f"  source {ref}: sha256 {digest[:16]}…")
    for v in manifest["variants"]:
        console.print(escape(f"  flags [{v['name']}]: {' '.join(v.get('flags', []))}"))
        for name, value in v.get("module_attributes", {}).items():
            console.print(escape(f"  module attribute [{v['name']}]: {name} = {value}"))
