"""Compose the .mln: gather the compiled modules and every parameter they read into one file.

Parameters are checked here against what each graph asks for (scope, key, dtype, shape), so a
mismatch between a graph and its weights is a build error, never a wrong answer at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from myelin.dtypes import itemsize
from myelin.mln import MlnWriter, module_section_name, parameter_section_name
from plex.build import steps
from plex.build.plan import (
    FAVOR_ATTRIBUTES,
    BuildRequest,
    compile_node_id,
    device_requirements,
    graph_scope,
    import_node_id,
    variant_flags,
    weights_node_id,
)
from plex.build.versions import versions
from plex.errors import BuildError
from plex.manifest import AppSpec, GraphSpec
from synapse import file_digest


def _parameter_sources(
    app: AppSpec, outputs: Mapping[str, Path]
) -> tuple[dict[tuple[str, str], dict], dict[str, list[str]]]:
    """(scope, key) -> {dtype, shape, file}; plus graph ref -> scopes it reads."""
    params: dict[tuple[str, str], dict] = {}
    scopes_by_graph: dict[str, list[str]] = {}
    for graph in app.graphs:
        imported = outputs[import_node_id(graph)]
        meta = steps.read_import_meta(imported)
        exported = {e["key"]: imported / steps.EXPORTED_DIR / e["file"] for e in meta["exported"]}
        weights = _weights_tensors(graph, outputs)
        scopes: list[str] = []
        for p in meta["parameters"]:
            scope, key = p["scope"], p["key"]
            if scope == graph_scope(graph) and key in exported:
                path = exported[key]
            else:
                path = _bind_named_parameter(graph, p, weights)
            expected = itemsize(p["dtype"]) * _count(p["shape"])
            size = path.stat().st_size
            if size != expected:
                raise BuildError(
                    f"graph {graph.ref}: parameter {scope}::{key} needs {expected} bytes "
                    f"({p['dtype']}{p['shape']}), its data has {size}"
                )
            params.setdefault((scope, key), {"dtype": p["dtype"], "shape": p["shape"],
                                             "file": path})
            if scope not in scopes:
                scopes.append(scope)
        scopes_by_graph[graph.ref] = scopes
    return params, scopes_by_graph


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _weights_tensors(graph: GraphSpec, outputs: Mapping[str, Path]) -> dict[str, dict] | None:
    if graph.weights is None or graph.weights.source is None:
        return None
    folder = outputs[weights_node_id(graph.weights)]
    return {
        t["key"]: {**t, "path": folder / steps.WEIGHTS_DIR / t["file"]}
        for t in steps.read_weights_index(folder)
    }


def _bind_named_parameter(graph: GraphSpec, p: dict, weights: dict[str, dict] | None) -> Path:
    scope, key = p["scope"], p["key"]
    if weights is None or graph.weights is None:
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key} but declares no weights with a "
            f"source; add `weights = \"<package>:<name>\"` to [graph.{graph.name}]"
        )
    if scope != graph.weights.scope:
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key}, but its weights "
            f"{graph.weights.ref} have scope '{graph.weights.scope}'; set scope = \"{scope}\" "
            f"in [weights.{graph.weights.name}] or change the graph"
        )
    tensor = weights.get(key)
    if tensor is None:
        import difflib

        close = difflib.get_close_matches(key, weights, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key}, which weights "
            f"{graph.weights.ref} ({graph.weights.source.name if graph.weights.source else ''}) "
            f"does not have{hint}"
        )
    if tensor["dtype"] != p["dtype"] or list(tensor["shape"]) != list(p["shape"]):
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key} as {p['dtype']}{list(p['shape'])}"
            f", but weights {graph.weights.ref} hold {tensor['dtype']}{list(tensor['shape'])}"
        )
    return tensor["path"]


def build_manifest(app: AppSpec, outputs: Mapping[str, Path]) -> tuple[dict, list, list]:
    """The .mln manifest plus the module and parameter sections to write, in order."""
    params, scopes_by_graph = _parameter_sources(app, outputs)
    module_sections: list[tuple[str, Path]] = []
    variants = []
    for variant in app.variants:
        modules, entrypoints, scopes = [], [], []
        metas = {g.ref: steps.read_compile_meta(outputs[compile_node_id(g, variant)])
                 for g in app.graphs}
        counts: dict[str, int] = {}
        for graph in app.graphs:
            for fn in metas[graph.ref]["signatures"]:
                counts[fn] = counts.get(fn, 0) + 1
        for graph in app.graphs:
            section = module_section_name(variant.name, graph.name)
            module_sections.append(
                (section, outputs[compile_node_id(graph, variant)] / steps.COMPILED_MODULE)
            )
            modules.append({"name": graph.name, "section": section})
            for fn, sig in metas[graph.ref]["signatures"].items():
                # A name two graphs export stays reachable as `graph.function`.
                name = fn if counts[fn] == 1 else f"{graph.name}.{fn}"
                entrypoints.append({"name": name, "module": graph.name, "function": fn,
                                    "inputs": sig["inputs"], "outputs": sig["outputs"]})
            for s in scopes_by_graph[graph.ref]:
                if s not in scopes:
                    scopes.append(s)
        variants.append(
            {
                "name": variant.name,
                "devices": [
                    {
                        "name": d.name, "target": d.target, "driver": d.driver,
                        "options": {k: v for k, v in (("cpu", d.cpu), ("cpu_features",
                                    d.cpu_features), ("arch", d.arch)) if v},
                        "requires": device_requirements(d),
                    }
                    for d in variant.devices
                ],
                "modules": modules,
                "entrypoints": entrypoints,
                "parameter_scopes": scopes,
                "flags": variant_flags(variant),
                "module_attributes": FAVOR_ATTRIBUTES[app.favor],
            }
        )
    parameter_sections = []
    parameters = []
    for (scope, key), p in sorted(params.items()):
        section = parameter_section_name(scope, key)
        parameter_sections.append((section, p["file"]))
        parameters.append(
            {"scope": scope, "key": key, "section": section, "offset": 0,
             "length": p["file"].stat().st_size, "codec": "none",
             "dtype": p["dtype"], "shape": list(p["shape"]), "layout": "dense"}
        )
    manifest = {
        "app": {"name": app.name, "version": app.version},
        "variants": variants,
        "parameters": parameters,
        "tuning": None,
        "provenance": {
            **{f"{k.replace('-', '_')}_version": v for k, v in versions().items()},
            "sources": {g.ref: file_digest(g.source) for g in app.graphs},
            "packages": {p.name: {"version": p.version, "fingerprint": p.fingerprint}
                         for p in app.packages},
            "favor": app.favor,
        },
    }
    return manifest, module_sections, parameter_sections


def compose_artifact(app: AppSpec, request: BuildRequest, outputs: Mapping[str, Path]) -> None:
    manifest, module_sections, parameter_sections = build_manifest(app, outputs)
    writer = MlnWriter(manifest)
    for name, path in module_sections:
        writer.add_section(name, "module", path)
    for name, path in parameter_sections:
        writer.add_section(name, "parameter", path)
    request.output.parent.mkdir(parents=True, exist_ok=True)
    writer.write(request.output)
