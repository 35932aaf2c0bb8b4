"""`plex inspect`: what is inside a .mln, without running anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from plex.cli.build_cmd import _size
from plex.cli.options import artifact_argument


def shown(text: str) -> str:
    """A name from the file as the terminal may show it: control characters, escape sequences
    and lone surrogates written as Python escapes (myelin.untrusted.printable), then rich's
    markup escaped, so `[bold]` in a name is text too."""
    from rich.markup import escape

    from myelin.untrusted import printable

    return escape(printable(text))


def _print_host_chosen(console, manifest) -> None:
    """Options the app left unset and the build chose for the CPU it targeted, and why."""
    for v in manifest.variants:
        for d in v.devices:
            for option, choice in (d.extras.get("host_chosen") or {}).items():
                console.print(
                    shown(
                        f"  host-chosen [{v.name}/{d.name}]: {option} = "
                        f"{str(choice.get('value')).lower()} ({choice.get('reason')}; "
                        f"pin it in [devices.{d.name}] to choose)"
                    )
                )


def _print_backends(console, manifest, sections) -> None:
    """External backends (docs/backends.md): which device hosts each, its ops, and the plugin
    and vendor libraries the artifact carries for it."""
    from rich.table import Table

    seen: dict = {}
    for v in manifest.variants:
        for d in v.devices:
            if d.backend is not None:
                seen.setdefault((d.backend.name, d.name), (d.backend, []))[1].append(v.name)
    if not seen:
        return
    table = Table(title="external backends (loaded from the artifact through memfds)")
    for col in ("backend", "device", "variants", "ops", "plugin", "vendor libraries"):
        table.add_column(col)
    for (name, device), (b, variant_names) in seen.items():
        libraries = "\n".join(
            f"{shown(s.rpartition('/')[2])}\n({_size(sections[s].length)})" for s in b.libraries
        )
        table.add_row(
            shown(name),
            shown(device),
            shown(", ".join(variant_names)),
            "\n".join(map(shown, b.ops)),  # one a line: the library names keep their width
            f"{_size(sections[b.plugin].length)}\nABI {b.abi}",
            libraries or "none",
        )
    console.print(table)


def _print_kernels(console, manifest) -> None:
    """Per device built with a kernel library: the coverage line, then each contraction left to
    IREE's codegen and why (docs/kernels.md, "Which ops went to which kernel")."""
    from rich.table import Table

    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line, left_to_codegen

    for v in manifest.variants:
        for d in v.devices:
            if d.kernels is None:
                continue
            console.print(
                shown(f"[{v.name}/{d.name}] {coverage_line(d.kernels, KERNELS_CUDA_ARCH)}")
            )
            left = left_to_codegen(d.kernels)
            if left:
                table = Table(
                    title=shown(f"contractions left to IREE's codegen [{v.name}/{d.name}]")
                )
                table.add_column("op, M x N x K, function (why no kernel)")
                for phrase in left:
                    table.add_row(shown(phrase))
                console.print(table)


def inspect(
    artifact: Path = artifact_argument(),
    as_json: bool = typer.Option(False, "--json", help="Print the raw manifest as JSON."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Check every section's content hash (default: on)."
    ),
) -> None:
    """Show variants, entrypoints with signatures, parameters, sizes and provenance."""
    from rich.console import Console
    from rich.table import Table

    from myelin.codecs import bytes_by_codec, parameter_rows
    from myelin.mln import MlnReader
    from plex.cli.build_cmd import no_parameters_line

    with MlnReader(artifact, verify=verify) as reader:
        manifest = reader.artifact_manifest
        raw = reader.manifest
        sections = reader.sections
        size = reader.file_size
        signature = reader.signature
    if as_json:
        typer.echo(json.dumps(raw, indent=2, sort_keys=True))
        return
    console = Console(emoji=False)
    app = manifest.app
    major, minor = manifest.format_version or (0, 0)
    console.print(
        f"[bold]{shown(str(artifact))}[/bold]: app {shown(app.name)} "
        f"{shown(app.version)}, {_size(size)}, format {major}.{minor}"
        + (", all section hashes verified" if verify else "")
    )
    if signature is not None:  # shown, not checked: only a trusted key can check it
        console.print(
            f"signed by key {signature.key_id.hex()[:16]} (check it: plex verify "
            f"{shown(str(artifact))} --key PUB)"
        )
    variants = Table(title="variants (the runtime picks the first whose devices exist)")
    for col in ("variant", "devices", "modules", "module bytes", "parameter scopes"):
        variants.add_column(col)
    for v in manifest.variants:
        devices = ", ".join(
            f"{d.name} ({d.target} on {d.driver}"
            + "".join(f", {k}={val}" for k, val in (d.options or {}).items())
            + ")"
            for d in v.devices
        )
        module_bytes = sum(sections[m.section].length for m in v.modules)
        variants.add_row(
            shown(v.name),
            shown(devices),
            shown(", ".join(m.name for m in v.modules)),
            _size(module_bytes),
            shown(", ".join(v.parameter_scopes)),
        )
    console.print(variants)
    _print_host_chosen(console, manifest)
    _print_backends(console, manifest, sections)
    _print_kernels(console, manifest)
    entry = Table(title="entrypoints")
    for col in ("variant", "name", "inputs", "outputs"):
        entry.add_column(col)
    for v in manifest.variants:
        for e in v.entrypoints:
            entry.add_row(
                shown(v.name),
                shown(e.name),
                shown(", ".join(t.describe() for t in e.inputs)),
                shown(", ".join(t.describe() for t in e.outputs)),
            )
    console.print(entry)
    params = manifest.parameters
    if not params:
        console.print(no_parameters_line())
    else:
        # One row per logical parameter: a codec's scale/zero parts count in its stored bytes.
        as_json_rows = [p.to_json() for p in params]
        rows = parameter_rows(as_json_rows)
        by_codec = ", ".join(
            f"{c} {_size(b)}" for c, (b, _) in bytes_by_codec(as_json_rows).items()
        )
        table = Table(
            title=f"parameters ({len(rows)}, {_size(sum(p.length for p in params))}: {by_codec})"
        )
        show_rule = any(r.rule for r in rows)
        columns = ["scope", "key", "dtype", "shape", "codec", "stored bytes", "offset"]
        for col in columns + (["why this codec"] if show_rule else []):
            table.add_column(col)
        sections_of = {(p.scope, p.key): p.section for p in params}
        # a tuned weight layout (`[tuning.*] layouts`): the order the data is stored in
        stored_as = {
            (p.scope, p.key): f" (stored {p.extras['weight_layout']})"
            for p in params
            if p.extras.get("weight_layout")
        }
        for r in rows:
            table.add_row(
                shown(r.scope),
                shown(r.key),
                r.dtype,
                "x".join(map(str, r.shape)) + stored_as.get((r.scope, r.key), ""),
                r.codec,
                str(r.stored_bytes),
                str(sections[sections_of[(r.scope, r.key)]].offset + r.offset),
                *([shown(r.rule)] if show_rule else []),
            )
        console.print(table)
    prov = manifest.provenance.to_json()
    console.print("[bold]provenance[/bold]")
    for key in sorted(prov):
        if key not in ("sources", "packages"):
            console.print(shown(f"  {key}: {prov[key]}"))
    for ref, digest in sorted((manifest.provenance.sources or {}).items()):
        console.print(shown(f"  source {ref}: sha256 {digest[:16]}…"))
    for v in manifest.variants:
        console.print(shown(f"  flags [{v.name}]: {' '.join(v.flags or ())}"))
        for name, value in (v.module_attributes or {}).items():
            console.print(shown(f"  module attribute [{v.name}]: {name} = {value}"))
