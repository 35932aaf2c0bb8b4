"""What an attacker who can write a .mln does, as helpers for the adversarial tests: rewrite a
real artifact with other section bytes or manifest fields, every hash recomputed (so only a
signature can tell), and build a shared object whose constructor leaves a marker file."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from myelin.mln import MlnReader, MlnWriter

PLUGIN_SECTION = "backend/evil/plugin"


def rewrite(
    source: Path,
    output: Path,
    *,
    sections: Mapping[str, tuple[str, bytes]] | None = None,
    manifest: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """`source` written again to `output` (unsigned): `sections` replaces or adds sections
    (name -> (kind, bytes)), `manifest` edits the manifest dict in place; every hash is
    recomputed by the writer, as anyone can."""
    sections = dict(sections or {})
    with MlnReader(source) as reader:
        data = copy.deepcopy(reader.manifest)
        kept = [
            (s.name, s.kind, bytes(reader.section_view(s.name))) for s in reader.sections.values()
        ]
    del data["format"], data["sections"]
    if manifest is not None:
        manifest(data)
    writer = MlnWriter(data)
    for name, kind, content in kept:
        kind, content = sections.pop(name, (kind, content))
        writer.add_section(name, kind, content)
    for name, (kind, content) in sections.items():
        writer.add_section(name, kind, content)
    return writer.write(output)


def marker_plugin(folder: Path, marker: Path) -> bytes:
    """A shared object whose constructor writes `marker` as it is loaded: any native code a
    file carries could do anything there. It has no backend ABI, so it never gets further."""
    source = folder / "evil.c"
    source.write_text(
        textwrap.dedent(f"""\
        #include <stdio.h>
        __attribute__((constructor)) static void plant(void) {{
          FILE *f = fopen("{marker}", "w");
          if (f) {{ fputs("native code ran\\n", f); fclose(f); }}
        }}
        """)
    )
    library = folder / "evil.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
    )
    return library.read_bytes()


def with_plugin_variant(
    source: Path,
    output: Path,
    plugin: bytes,
    *,
    first: bool = True,
    runs_here: bool = True,
) -> Path:
    """`source` (one variant, "default") plus a variant "native" whose device hosts a backend
    whose plugin is `plugin`: listed `first` or after "default"; `runs_here=False` gives it a
    CPU feature no CPU has, so the loader never picks it by itself."""

    def add_variant(m: dict[str, Any]) -> None:
        native = copy.deepcopy(m["variants"][0])
        native["name"] = "native"
        device = native["devices"][0]
        device["backend"] = {
            "name": "evil",
            "abi": 2,
            "ops": ["matmul"],
            "plugin": PLUGIN_SECTION,
            "libraries": [],
        }
        if not runs_here:
            device.setdefault("requires", {}).setdefault("cpu_flags", []).append("no_cpu_has_it")
        m["variants"] = [native, *m["variants"]] if first else [*m["variants"], native]

    return rewrite(
        source, output, sections={PLUGIN_SECTION: ("backend", plugin)}, manifest=add_variant
    )


def plex(*args: str | Path) -> subprocess.CompletedProcess:
    """The installed `plex` console script (the real entry point), as a user runs it."""
    command = [str(Path(sys.executable).parent / "plex"), *(str(a) for a in args)]
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}
    )
