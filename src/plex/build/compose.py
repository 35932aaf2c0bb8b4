"""Compose the .mln: gather the compiled modules and every parameter they read into one file.

Parameters are checked here against what each graph asks for (scope, key, dtype, shape), so a
mismatch between a graph and its weights is a build error, never a wrong answer at run time.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

from myelin.compiler.stream_analysis import plan_module
from myelin.dtypes import itemsize
from myelin.errors import CompileError
from myelin.mln import MlnWriter, module_section_name, parameter_section_name
from plex.build import steps
from plex.build.plan import (
    FAVOR_ATTRIBUTES,
    BuildRequest,
    ModuleUnit,
    compile_node_id,
    device_requirements,
    encode_node_id,
    import_node_id,
    import_units,
    memory_node_id,
    module_units,
    variant_flags,
    weights_node_id,
)
from plex.build.versions import versions
from plex.errors import BuildError
from plex.manifest import AppSpec, GraphSpec, VariantSpec
from synapse import file_digest

# Modules the runtime registers itself, ahead of the app's modules.
RUNTIME_MODULES = ("hal", "io_parameters")


def _parameter_sources(
    app: AppSpec, outputs: Mapping[str, Path]
) -> tuple[dict[tuple[str, str], dict], dict[str, list[str]]]:
    """(scope, key) -> {dtype, shape, file}; plus imported graph ref -> scopes it reads.

    Shards of one graph, and graphs that share a weights package, read the same (scope, key):
    it is stored once.
    """
    params: dict[tuple[str, str], dict] = {}
    scopes_by_graph: dict[str, list[str]] = {}
    for graph in import_units(app):
        imported = outputs[import_node_id(graph)]
        meta = steps.read_import_meta(imported)
        exported = {
            (meta["exported_scope"], e["key"]): imported / steps.EXPORTED_DIR / e["file"]
            for e in meta["exported"]
        }
        parameters, codecs = meta["parameters"], {}
        if encode_node_id(graph) in outputs:  # weight codecs: the stored parts replace them
            encoded = outputs[encode_node_id(graph)]
            encode_meta = steps.read_import_meta(encoded)
            parameters, codecs = encode_meta["parameters"], steps.codec_parts(encode_meta)
            exported.update(
                {
                    (e["scope"], e["key"]): encoded / steps.EXPORTED_DIR / e["file"]
                    for e in encode_meta["exported"]
                }
            )
        weights = _weights_tensors(graph, outputs)
        scopes: list[str] = []
        for p in parameters:
            scope, key = p["scope"], p["key"]
            if (scope, key) in exported:
                path = exported[(scope, key)]
            else:
                path = _bind_named_parameter(graph, p, weights)
            expected = itemsize(p["dtype"]) * _count(p["shape"])
            size = path.stat().st_size
            if size != expected:
                raise BuildError(
                    f"graph {graph.ref}: parameter {scope}::{key} needs {expected} bytes "
                    f"({p['dtype']}{p['shape']}), its data has {size}"
                )
            params.setdefault(
                (scope, key),
                {
                    "dtype": p["dtype"],
                    "shape": p["shape"],
                    "file": path,
                    "codec": codecs.get((scope, key)),
                },
            )
            if scope not in scopes:
                scopes.append(scope)
        scopes_by_graph[graph.ref] = scopes
    return params, scopes_by_graph


def _named_dims(
    function: str,
    inputs: list[dict],
    dynamic: Mapping[str, Mapping[int, str]],
    source_dims: Mapping[str, Mapping[str, str]],
) -> list[dict]:
    """The inputs with their dynamic dims named as the manifest's `dynamic` names them
    (`input_ids: int64[batch, seq]`), else as the source names them (an ONNX dim_param, from
    the import record), instead of the compiler's `<arg>.<axis>`; an `"entrypoint.argument"`
    key wins over a plain `"argument"` one. The runtime checks that dims of one name have one
    size in a call."""
    named = []
    for spec in inputs:
        from_source = {int(a): n for a, n in source_dims.get(spec["name"], {}).items()}
        names = dynamic.get(f"{function}.{spec['name']}", dynamic.get(spec["name"], from_source))
        dims = [
            names.get(axis, d) if spec["shape"][axis] is None else d
            for axis, d in enumerate(spec.get("dims", []))
        ]
        named.append({**spec, "dims": dims} if names else spec)
    return named


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
            f'source; add `weights = "<package>:<name>"` to [graph.{graph.name}]'
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
    units = ordered_units(app, outputs)
    # the source's own names of dynamic dims (ONNX dim_param), per module; the same in all variants
    source_dims = {
        u.name: steps.read_import_meta(outputs[import_node_id(u.imported)]).get("dim_names", {})
        for u in units
    }
    for variant in app.variants:
        modules, entrypoints, scopes = [], [], []
        metas = {
            u.name: steps.read_compile_meta(outputs[compile_node_id(u, variant)]) for u in units
        }
        counts: dict[str, int] = {}
        for unit in units:
            for fn in metas[unit.name]["signatures"]:
                counts[fn] = counts.get(fn, 0) + 1
        for unit in units:
            section = module_section_name(variant.name, unit.name)
            module_sections.append(
                (section, outputs[compile_node_id(unit, variant)] / steps.COMPILED_MODULE)
            )
            modules.append({"name": unit.name, "section": section})
            plans = read_memory_plans(outputs[memory_node_id(unit, variant)])
            for fn, sig in metas[unit.name]["signatures"].items():
                # A name two modules export stays reachable as `module.function`.
                name = fn if counts[fn] == 1 else f"{unit.name}.{fn}"
                entrypoints.append(
                    {
                        "name": name,
                        "module": unit.name,
                        "function": fn,
                        "inputs": _named_dims(
                            fn, sig["inputs"], unit.graph.dynamic, source_dims[unit.name]
                        ),
                        "outputs": sig["outputs"],
                    }
                )
                entrypoints[-1]["memory"] = plans.get(fn, {"unknown": "no memory plan"})
                device = metas[unit.name].get("devices", {}).get(fn)
                if device is not None:  # where it runs: the placement, else the first device
                    entrypoints[-1]["device"] = device
            for s in scopes_by_graph[unit.imported.ref]:
                if s not in scopes:
                    scopes.append(s)
        variants.append(
            {
                "name": variant.name,
                "devices": [
                    {
                        "name": d.name,
                        "target": d.target,
                        "driver": d.driver,
                        "options": {
                            k: v
                            for k, v in (
                                ("cpu", d.cpu),
                                ("cpu_features", d.cpu_features),
                                ("data_tiling", d.data_tiling),
                                ("arch", d.arch),
                            )
                            if v
                        },
                        "requires": device_requirements(d),
                    }
                    for d in variant.devices
                ],
                "modules": modules,
                "entrypoints": entrypoints,
                "parameter_scopes": scopes,
                "flags": variant_flags(app, variant),
                "module_attributes": FAVOR_ATTRIBUTES[app.favor],
            }
        )
    parameter_sections = []
    parameters = []
    for (scope, key), p in sorted(params.items()):
        section = parameter_section_name(scope, key)
        parameter_sections.append((section, p["file"]))
        parameters.append(
            {
                "scope": scope,
                "key": key,
                "section": section,
                "offset": 0,
                "length": p["file"].stat().st_size,
                "codec": "none",
                "dtype": p["dtype"],
                "shape": list(p["shape"]),
                "layout": "dense",
                **_codec_fields(p["codec"]),
            }
        )
    manifest = {
        "app": {"name": app.name, "version": app.version},
        "policies": _policies(app),
        "variants": variants,
        "parameters": parameters,
        "tuning": None,
        "provenance": {
            **{f"{k.replace('-', '_')}_version": v for k, v in versions().items()},
            "sources": {g.ref: file_digest(g.source) for g in import_units(app) if g.source},
            "packages": {
                p.name: {"version": p.version, "fingerprint": p.fingerprint} for p in app.packages
            },
            "favor": app.favor,
        },
    }
    return manifest, module_sections, parameter_sections


def _codec_fields(codec: dict | None) -> dict:
    """Manifest fields of a stored part of an encoded parameter (docs/mln-format.md): the data
    part carries the parameter's codec, logical dtype and shape and the rule that chose the
    codec; a scale or zero part names the parameter it belongs to (`of`)."""
    if codec is None:
        return {}
    record, part = codec["record"], codec["part"]
    if part is None:  # kept as it was; say why
        return {"rule": record["reason"]}
    fields = {
        "codec": record["codec"],
        "layout": record["layout"],
        "role": part["role"],
        "storage": {"dtype": part["dtype"], "shape": part["shape"]},
    }
    if part["role"] == "data":
        fields.update(
            dtype=record["dtype"],
            shape=record["shape"],
            rule=record["reason"],
            reduce_axes=record["reduce_axes"],
            order=record.get("order", []),
        )
    else:
        fields.update(dtype=part["dtype"], shape=part["shape"], of=record["key"])
    return fields


def recorded_warnings(app: AppSpec, outputs: Mapping[str, Path]) -> tuple[list[str], list[str]]:
    """(frontend and codec warnings, no-materialization violations) of this build, read from the
    import, encode and compile records so that a cached build reports them again."""
    notes: list[str] = []
    for node_id, key in ((import_node_id, "warnings"), (encode_node_id, "codec_warnings")):
        for graph in import_units(app):
            if node_id(graph) in outputs:
                meta = steps.read_import_meta(outputs[node_id(graph)])
                notes += [f"graph {graph.ref}: {w}" for w in meta.get(key, [])]
    violations: list[str] = []
    for unit in module_units(app):
        for variant in app.variants:
            meta = steps.read_compile_meta(outputs[compile_node_id(unit, variant)])
            found = meta.get("codec_violations", [])
            violations += [f"{v} [variant {variant.name}]" for v in found]
    return notes, violations


def _policies(app: AppSpec) -> dict:
    """The runtime policies of `[weights]` and `[runtime]`, which MyeLiN applies at load."""
    profile = app.profile
    if profile is not None:
        profile = {"output": profile.output, "device_timing": profile.device_timing}
    return {
        "residency": app.residency,
        "memory_budget": app.memory,
        "favor": app.favor,
        "profile": profile,
    }


MEMORY_PLANS = "memory.json"


def write_memory_plans(
    out_dir: Path, unit: ModuleUnit, variant: VariantSpec, outputs: Mapping[str, Path]
) -> None:
    """The action of a memory-plan node (cached, so a no-op rebuild compiles nothing): the
    plans of one compiled module, for compose to copy into the manifest."""
    meta = steps.read_compile_meta(outputs[compile_node_id(unit, variant)])
    plans = _memory_plans(unit, variant, meta, outputs)
    (out_dir / MEMORY_PLANS).write_text(json.dumps(plans, indent=1, sort_keys=True))


def read_memory_plans(out_dir: Path) -> dict[str, dict]:
    return json.loads((out_dir / MEMORY_PLANS).read_text())


def _memory_plans(
    unit: ModuleUnit, variant: VariantSpec, meta: dict, outputs: Mapping[str, Path]
) -> dict[str, dict]:
    """Entrypoint -> what a call allocates (a formula of its input dims) and which parameters
    it reads, from the module's Stream IR (myelin.compiler.stream_analysis).

    The IR is re-derived from the imported module with the compile node's own flags and
    module attributes, so it matches the compiled module. Not derived (recorded as unknown,
    so a memory budget refuses rather than guesses): modules resumed from an edited phase file,
    and multi-device variants, whose placement pass this replay does not run.
    """
    functions = list(meta["signatures"])
    if "memory_plans" in meta:  # a compile step that records them saves the replay below
        return meta["memory_plans"]
    why = None
    if meta.get("resumed_from"):
        why = f"resumed from an edited '{meta['resumed_from']}' phase file"
    elif len(variant.devices) > 1:
        why = "memory plans of multi-device variants are not derived yet"
    if why is not None:
        return {fn: {"unknown": why} for fn in functions}
    # the encoded module when weight codecs apply (its node is then a dependency too)
    imported = outputs.get(encode_node_id(unit.imported)) or outputs[import_node_id(unit.imported)]
    import_meta = steps.read_import_meta(imported)
    try:
        plans, _ = plan_module(
            (imported / steps.IMPORTED_MODULE).read_bytes(),
            phase=import_meta["phase"],
            # The execution model (fences or not) changes the calling convention, not what a
            # call allocates; the analysis reads the synchronous form's Stream IR.
            flags=[f for f in meta["flags"] if not f.startswith("--iree-execution-model")],
            module_attributes=meta["module_attributes"],
            functions=functions,
            what=f"{unit.ref} ({variant.name})",
        )
    except CompileError as e:
        raise BuildError(f"memory plan of {unit.ref} ({variant.name}) failed: {e}") from e
    return {fn: plan.to_json() for fn, plan in plans.items()}


def ordered_units(app: AppSpec, outputs: Mapping[str, Path]) -> list[ModuleUnit]:
    """The app's modules in VM registration order: each after the modules it imports functions
    from (a shard calling `@other_shard.fn`), otherwise in manifest order."""
    units = module_units(app)
    by_name = {u.name: u for u in units}
    needs: dict[str, list[str]] = {}
    for unit in units:
        imports = steps.read_import_meta(outputs[import_node_id(unit.imported)]).get("imports", [])
        needs[unit.name] = [m for m in imports if m != unit.name]
        for module in needs[unit.name]:
            if module not in by_name and module not in RUNTIME_MODULES:
                raise BuildError(
                    f"{unit.ref} calls functions of VM module '{module}', which this app does "
                    f"not build (its modules: {', '.join(by_name)}); a shard's module is named "
                    "<graph>_<shard>"
                )
    ordered: list[ModuleUnit] = []
    state: dict[str, str] = {}  # name -> "visiting" | "done"

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise BuildError(f"VM modules import each other in a cycle: {cycle}; break it")
        state[name] = "visiting"
        for dep in needs[name]:
            if dep in by_name:
                visit(dep, [*path, name])
        state[name] = "done"
        ordered.append(by_name[name])

    for unit in units:
        visit(unit.name, [])
    return ordered


def write_phases(
    app: AppSpec, request: BuildRequest, target: Path, outputs: Mapping[str, Path]
) -> None:
    """Copy the IR phase files of every compile node to `target`: `<module>/<variant>/NN.<phase>
    .mlir`, or, for `--compile-to` with one module and variant and a `.mlir` target, that file."""
    files: list[tuple[Path, Path]] = []  # (from, to)
    for unit in module_units(app):
        for variant in app.variants:
            folder = outputs[compile_node_id(unit, variant)] / steps.PHASES_DIR
            for phase_file in sorted(folder.iterdir()):
                files.append((phase_file, target / unit.name / variant.name / phase_file.name))
    if request.compile_to is not None and target.suffix == ".mlir":
        if len(files) != 1:
            raise BuildError(
                f"--compile-to writes {len(files)} files (one per module and variant); "
                f"give -o a folder, not {target.name}"
            )
        files = [(files[0][0], target)]
    for source, destination in files:  # each file appears whole, or not at all
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(f".{destination.name}.partial")
        try:
            shutil.copyfile(source, partial)
            os.replace(partial, destination)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise


def compose_artifact(app: AppSpec, request: BuildRequest, outputs: Mapping[str, Path]) -> None:
    notes, violations = recorded_warnings(app, outputs)
    if violations and request.strict:
        raise BuildError(
            f"{violations[0]}; --strict makes a decode that is not fused an error"
            + (f" ({len(violations) - 1} more)" if len(violations) > 1 else "")
        )
    for message in notes + violations:
        warnings.warn(message, steps.BuildWarning, stacklevel=2)
    manifest, module_sections, parameter_sections = build_manifest(app, outputs)
    writer = MlnWriter(manifest)
    for name, path in module_sections:
        writer.add_section(name, "module", path)
    for name, path in parameter_sections:
        writer.add_section(name, "parameter", path)
    request.output.parent.mkdir(parents=True, exist_ok=True)
    writer.write(request.output)
