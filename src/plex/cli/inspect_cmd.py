"""`plex inspect`: what is inside a .mln, without running anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from plex.cli.build_cmd import _size


def inspect(
    artifact: Path = typer.Argument(..., help="The .mln file.", metavar="ARTIFACT"),
    as_json: bool = typer.Option(False, "--json", help="Print the raw manifest as JSON."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Check every section's content hash (default: on)."
    ),
) -> None:
    """Show variants, entrypoints with signatures, parameters, sizes and provenance."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from myelin.codecs import bytes_by_codec, parameter_rows
    from myelin.mln import MlnReader
    from myelin.signature import TensorSpec

    with MlnReader(artifact, verify=verify) as reader:
        manifest = reader.manifest
        sections = reader.sections
        size = reader.file_size
    if as_json:
        typer.echo(json.dumps(manifest, indent=2, sort_keys=True))
        return
    console = Console(emoji=False)
    app = manifest["app"]
    console.print(
        f"[bold]{escape(str(artifact))}[/bold]: app {escape(app['name'])} "
        f"{escape(app.get('version', ''))}, {_size(size)}, "
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
            escape(v["name"]),
            escape(devices),
            escape(", ".join(m["name"] for m in v["modules"])),
            _size(module_bytes),
            escape(", ".join(v.get("parameter_scopes", []))),
        )
    console.print(variants)
    entry = Table(title="entrypoints")
    for col in ("variant", "name", "inputs", "outputs"):
        entry.add_column(col)
    for v in manifest["variants"]:
        for e in v["entrypoints"]:
            entry.add_row(
                escape(v["name"]),
                escape(e["name"]),
                escape(", ".join(TensorSpec.from_json(t).describe() for t in e["inputs"])),
                escape(", ".join(TensorSpec.from_json(t).describe() for t in e["outputs"])),
            )
    console.print(entry)
    params = manifest["parameters"]
    if not params:
        console.print("parameters: 0 (the model has no weights)")
    else:
        # One row per logical parameter: a codec's scale/zero parts count in its stored bytes.
        rows = parameter_rows(params)
        by_codec = ", ".join(f"{c} {_size(b)}" for c, (b, _) in bytes_by_codec(params).items())
        table = Table(
            title=f"parameters ({len(rows)}, {_size(sum(p['length'] for p in params))}: {by_codec})"
        )
        show_rule = any(r.rule for r in rows)
        columns = ["scope", "key", "dtype", "shape", "codec", "stored bytes", "offset"]
        for col in columns + (["why this codec"] if show_rule else []):
            table.add_column(col)
        sections_of = {(p["scope"], p["key"]): p["section"] for p in params}
        for r in rows:
            table.add_row(
                escape(r.scope),
                escape(r.key),
                r.dtype,
                "x".join(map(str, r.shape)),
                r.codec,
                str(r.stored_bytes),
                str(sections[sections_of[(r.scope, r.key)]].offset + r.offset),
                *([escape(r.rule)] if show_rule else []),
            )
        console.print(table)
    prov = manifest.get("provenance", {})
    console.print("[bold]provenance[/bold]")
    for key in sorted(prov):
        if key not in ("sources", "packages"):
            console.print(escape(f"  {key}: {prov[key]}"))
    for ref, digest in sorted(prov.get("sources", {}).items()):
        console.print(escape(f"  source {ref}: sha256 {digest[:16]}…"))
    for v in manifest["variants"]:
        console.print(escape(f"  flags [{v['name']}]: {' '.join(v.get('flags', []))}"))
        for name, value in v.get("module_attributes", {}).items():
            console.print(escape(f"  module attribute [{v['name']}]: {name} = {value}"))
