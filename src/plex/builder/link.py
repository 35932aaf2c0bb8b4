"""Link: the decisions only the steps' records can tell, made once, as a cached node.

What a module imports from another, which functions it exports and with which signatures, and
which parameters it reads are known only after import and compile ran. From those records the
link step decides the VM registration order (callee first), the entrypoint names (a name two
modules export stays reachable as `module.function`), binds every parameter to its data
(checked against what the graph asks for, so a mismatch is a build error, never a wrong answer
at run time), and writes the artifact manifest plus the list of sections for compose to pack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from myelin.dtypes import itemsize
from myelin.mln import module_section_name, parameter_section_name
from plex.builder.jobs import DeviceLink, ImportedGraph, LinkJob, ModuleLink, WeightsSource
from plex.builder.records import (
    COMPILED_MODULE,
    EXPORTED_DIR,
    WEIGHTS_DIR,
    codec_parts,
    read_compile_meta,
    read_import_meta,
    read_weights_index,
    source_digest,
)
from plex.errors import BuildError
from synapse import NodeContext, step

# What the link step writes.
LINKED_MANIFEST = "manifest.json"
LINKED_SECTIONS = "sections.json"  # [{"name", "kind", "node", "file"}] in file order
LINKED_WARNINGS = "warnings.json"  # {"notes": [...], "violations": [...]}

# Modules the runtime registers itself, ahead of the app's modules.
RUNTIME_MODULES = ("hal", "io_parameters", "plex_host")  # plex_host: myelin.runtime.host_ops


class _Outputs:
    """Node outputs as (node id, path) pairs: paths for reading here, ids for compose."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def dir(self, node_id: str) -> Path:
        return self.ctx.dep_outputs[node_id]

    def file(self, node_id: str, path: Path) -> dict:
        return {"node": node_id, "file": path.relative_to(self.dir(node_id)).as_posix()}


@step(LinkJob)
def run_link(job: LinkJob, ctx: NodeContext) -> None:
    outputs = _Outputs(ctx)
    notes, violations = _recorded_warnings(job, outputs)
    manifest, sections = _artifact_manifest(job, outputs)
    (ctx.out_dir / LINKED_MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    (ctx.out_dir / LINKED_SECTIONS).write_text(json.dumps(sections, indent=1))
    (ctx.out_dir / LINKED_WARNINGS).write_text(
        json.dumps({"notes": notes, "violations": violations}, indent=1)
    )


def read_link(out_dir: Path) -> tuple[dict, list[dict], dict]:
    """(manifest, sections, warnings) as the link step wrote them."""
    return (
        json.loads((out_dir / LINKED_MANIFEST).read_text()),
        json.loads((out_dir / LINKED_SECTIONS).read_text()),
        json.loads((out_dir / LINKED_WARNINGS).read_text()),
    )


def _recorded_warnings(job: LinkJob, outputs: _Outputs) -> tuple[list[str], list[str]]:
    """(frontend and codec warnings, no-materialization violations), read from the import,
    encode and compile records so that a cached build reports them again."""
    notes: list[str] = []
    for graph in job.graphs:
        meta = read_import_meta(outputs.dir(graph.imported.node_id))
        notes += [f"graph {graph.ref}: {w}" for w in meta.get("warnings", [])]
    unmatched: set[str] | None = None  # weight-layout globs that no graph's parameter matched
    for graph in job.graphs:
        if graph.encoded is not None:
            meta = read_import_meta(outputs.dir(graph.encoded.node_id))
            notes += [f"graph {graph.ref}: {w}" for w in meta.get("codec_warnings", [])]
            here = set(meta.get("weight_layouts_unmatched", []))
            unmatched = here if unmatched is None else unmatched & here
    notes += [
        f'weight layout "{pattern}" matches no parameter of the app\'s graphs'
        for pattern in sorted(unmatched or ())
    ]
    violations: list[str] = []
    for module in job.modules:
        for variant, compiled in zip(job.variants, module.compiled, strict=True):
            compile_meta = read_compile_meta(outputs.dir(compiled.node_id))
            found = compile_meta.get("codec_violations", [])
            violations += [f"{v} [variant {variant.name}]" for v in found]
            at_load = compile_meta.get("codecs_at_load", [])
            if at_load:
                notes.append(
                    f"module {module.name} [variant {variant.name}]: {len(at_load)} encoded "
                    "matmul weight(s) decode once at load into data tiling's packed layout "
                    "(float32 in memory, as fp32's packed copies; the .mln keeps the encoded "
                    f"bytes): {', '.join(at_load[:3])}{', ...' if len(at_load) > 3 else ''}"
                )
            notes += _kernel_coverage_warning(module.name, variant.name, compile_meta)
            notes += _cuda_convolution_warning(module.name, variant.name, compile_meta)
            tuning_warning = (compile_meta.get("tuning") or {}).get("warning")
            if tuning_warning:
                notes.append(tuning_warning)
    return notes, violations


def _tuning(job: LinkJob, outputs: _Outputs) -> dict | None:
    """The manifest's `tuning`: each spec applied (by content) and what it matched per module
    and variant, from the compile records. None when no spec applied."""
    specs: dict[str, dict] = {}
    applied = []
    for module in job.modules:
        for variant, compiled in zip(job.variants, module.compiled, strict=True):
            record = read_compile_meta(outputs.dir(compiled.node_id)).get("tuning") or {}
            if not record:
                continue
            specs[record["spec"]] = {"target": record["target"], "sha256": record["sha256"]}
            applied.append(
                {
                    "module": module.name,
                    "variant": variant.name,
                    "spec": record["spec"],
                    "matched_ops": record["matched_ops"],
                    "dispatches": dict(record["dispatches"]),
                }
            )
    return {"specs": specs, "applied": applied} if specs else None


def _parameter_sources(
    job: LinkJob, outputs: _Outputs
) -> tuple[dict[tuple[str, str], dict], dict[str, list[str]]]:
    """(scope, key) -> {dtype, shape, file: {node, file}, codec}; plus imported graph ref ->
    scopes it reads. Shards of one graph, and graphs that share a weights package, read the
    same (scope, key): it is stored once."""
    params: dict[tuple[str, str], dict] = {}
    scopes_by_graph: dict[str, list[str]] = {}
    for graph in job.graphs:
        imported_id = graph.imported.node_id
        meta = read_import_meta(outputs.dir(imported_id))
        folder = outputs.dir(imported_id) / EXPORTED_DIR
        exported = {
            (meta["exported_scope"], e["key"]): (imported_id, folder / e["file"])
            for e in meta["exported"]
        }
        parameters, codecs, layouts = meta["parameters"], {}, {}
        if graph.encoded is not None:  # weight codecs: the stored parts replace them
            encoded_id = graph.encoded.node_id
            encode_meta = read_import_meta(outputs.dir(encoded_id))
            parameters, codecs = encode_meta["parameters"], codec_parts(encode_meta)
            layouts = {(r["scope"], r["key"]): r for r in encode_meta.get("weight_layouts", [])}
            folder = outputs.dir(encoded_id) / EXPORTED_DIR
            exported.update(
                {
                    (e["scope"], e["key"]): (encoded_id, folder / e["file"])
                    for e in encode_meta["exported"]
                }
            )
        weights = _weights_tensors(graph.weights, outputs)
        scopes: list[str] = []
        for p in parameters:
            scope, key = p["scope"], p["key"]
            if (scope, key) in exported:
                node_id, path = exported[(scope, key)]
            else:
                node_id, path = _bind_named_parameter(graph, p, weights)
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
                    "file": outputs.file(node_id, path),
                    "length": size,
                    "codec": codecs.get((scope, key)),
                    "weight_layout": layouts.get((scope, key)),
                },
            )
            if scope not in scopes:
                scopes.append(scope)
        scopes_by_graph[graph.ref] = scopes
    return params, scopes_by_graph


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _weights_tensors(weights: WeightsSource | None, outputs: _Outputs) -> dict[str, dict] | None:
    if weights is None:
        return None
    folder = outputs.dir(weights.output.node_id)
    return {
        t["key"]: {**t, "path": folder / WEIGHTS_DIR / t["file"]}
        for t in read_weights_index(folder)
    }


def _bind_named_parameter(
    graph: ImportedGraph, p: dict, tensors: dict[str, dict] | None
) -> tuple[str, Path]:
    scope, key = p["scope"], p["key"]
    weights = graph.weights
    if tensors is None or weights is None:
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key} but declares no weights with a "
            f'source; add `weights = "<package>:<name>"` to [graph.{graph.name}]'
        )
    if scope != weights.scope:
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key}, but its weights "
            f"{weights.ref} have scope '{weights.scope}'; set scope = \"{scope}\" "
            f"in [weights.{weights.name}] or change the graph"
        )
    tensor = tensors.get(key)
    if tensor is None:
        import difflib

        close = difflib.get_close_matches(key, tensors, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key}, which weights "
            f"{weights.ref} ({weights.file}) does not have{hint}"
        )
    if tensor["dtype"] != p["dtype"] or list(tensor["shape"]) != list(p["shape"]):
        raise BuildError(
            f"graph {graph.ref} reads parameter {scope}::{key} as {p['dtype']}{list(p['shape'])}"
            f", but weights {weights.ref} hold {tensor['dtype']}{list(tensor['shape'])}"
        )
    return weights.output.node_id, tensor["path"]


def _kernel_coverage_warning(module: str, variant: str, compile_meta: dict) -> list[str]:
    """A module built with a kernel library warns when contractions stay with IREE's sm_80
    codegen on the sm_90a target: the coverage line, then each one left and why."""
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line, left_to_codegen

    sites = compile_meta.get("kernel_sites", [])
    left = left_to_codegen(sites)
    if not left:
        return []
    shown = "; ".join(left[:4]) + (f"; {len(left) - 4} more" if len(left) > 4 else "")
    return [
        f"module {module} [variant {variant}]: {coverage_line(sites, KERNELS_CUDA_ARCH)}; "
        f"left to IREE's codegen: {shown} (plex inspect lists them all)"
    ]


def _cuda_convolution_warning(module: str, variant: str, compile_meta: dict) -> list[str]:
    """A CUDA variant whose f16/bf16 convolutions IREE 3.13's own codegen computes warns: that
    code gave ResNet-50 a wrong answer on an H100 (myelin.compiler.cuda_convolution)."""
    convs = compile_meta.get("cuda_codegen_convolutions", [])
    if not convs:
        return []
    shown = "; ".join(convs[:3]) + (f"; {len(convs) - 3} more" if len(convs) > 3 else "")
    return [
        f"module {module} [variant {variant}]: {len(convs)} f16/bf16 convolution(s) left to "
        "IREE 3.13's CUDA codegen, which computed ResNet-50's f16 convolutions wrong on an H100 "
        "(cosine 0.66 to torch; docs/kernels.md): compare the outputs with a reference before "
        'use, or build for Hopper with kernels = "triton" (2-D NCHW convolutions then run as '
        f"matmul kernels): {shown}"
    ]


def _kernel_sites(device: DeviceLink, metas: dict[str, dict]) -> dict:
    """`kernels` of a device record: every matmul of the variant's modules, with the library
    kernel it went to or why it stayed IREE codegen (the compile records copy the kernels
    node's report)."""
    if not device.options.get("kernels"):
        return {}
    return {
        "kernels": [
            {"module": module, **site}
            for module, meta in metas.items()
            for site in meta.get("kernel_sites", [])
        ]
    }


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


def _with_ranges(inputs: list[dict], ranges: list[list[int] | None]) -> list[dict]:
    """The inputs with `range` ([lo, hi)) where the compile step found that the input indexes a
    table: the runtime checks it before the call."""
    return [
        {**spec, "range": bounds} if bounds is not None else spec
        for spec, bounds in zip(inputs, [*ranges, *[None] * len(inputs)], strict=False)
    ]


def _with_limits(
    inputs: list[dict], limits: list[list[list | None]], from_source: Mapping[str, Mapping]
) -> list[dict]:
    """The inputs with `limits` (per axis, null or [largest size, why]) where the compile step
    found a dynamic dim whose positions index a table, or the source bounds it (`from_source`:
    input -> {axis: limit}, torch.export's ranges). The smallest limit of a dim name holds for
    every dim of that name: the runtime requires them equal."""
    by_name: dict[str, list] = {}
    found = [
        (spec, axis, limit)
        for spec, axes in zip(inputs, limits, strict=False)
        for axis, limit in enumerate(axes or ())
    ]
    found += [
        (spec, int(axis), limit)
        for spec in inputs
        for axis, limit in from_source.get(spec["name"], {}).items()
    ]
    for spec, axis, limit in found:
        dims = spec.get("dims", [])
        name = dims[axis] if axis < len(dims) else None
        if (limit is not None and name is not None) and (
            name not in by_name or limit[0] < by_name[name][0]
        ):
            by_name[name] = limit
    if not by_name:
        return inputs
    out = []
    for spec in inputs:
        axes = [
            by_name.get(name) if size is None else None
            for size, name in zip(spec["shape"] or (), spec.get("dims", ()), strict=False)
        ]
        out.append({**spec, "limits": axes} if any(a is not None for a in axes) else spec)
    return out


def ordered_modules(job: LinkJob, outputs: _Outputs) -> list[ModuleLink]:
    """The app's modules in VM registration order: each after the modules it imports functions
    from (a shard calling `@other_shard.fn`), otherwise in manifest order."""
    by_name = {m.name: m for m in job.modules}
    needs: dict[str, list[str]] = {}
    for module in job.modules:
        imports = read_import_meta(outputs.dir(module.imported.node_id)).get("imports", [])
        needs[module.name] = [m for m in imports if m != module.name]
        for other in needs[module.name]:
            if other not in by_name and other not in RUNTIME_MODULES:
                raise BuildError(
                    f"{module.ref} calls functions of VM module '{other}', which this app does "
                    f"not build (its modules: {', '.join(by_name)}); a shard's module is named "
                    "<graph>_<shard>"
                )
    ordered: list[ModuleLink] = []
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

    for module in job.modules:
        visit(module.name, [])
    return ordered


def _artifact_manifest(job: LinkJob, outputs: _Outputs) -> tuple[dict, list[dict]]:
    """The .mln manifest plus the sections to write, module sections first, in order."""
    params, scopes_by_graph = _parameter_sources(job, outputs)
    sections: list[dict] = []
    variants = []
    modules = ordered_modules(job, outputs)
    # the source's own names of dynamic dims (ONNX dim_param), per module; the same in all variants
    source_dims = {
        m.name: read_import_meta(outputs.dir(m.imported.node_id)).get("dim_names", {})
        for m in modules
    }
    source_limits = {
        m.name: read_import_meta(outputs.dir(m.imported.node_id)).get("dim_limits", {})
        for m in modules
    }
    for index, variant in enumerate(job.variants):
        records, entrypoints, scopes = [], [], []
        metas = {m.name: read_compile_meta(outputs.dir(m.compiled[index].node_id)) for m in modules}
        counts: dict[str, int] = {}
        for module in modules:
            for fn in metas[module.name]["signatures"]:
                counts[fn] = counts.get(fn, 0) + 1
        for module in modules:
            section = module_section_name(variant.name, module.name)
            compiled_id = module.compiled[index].node_id
            sections.append(
                {
                    "name": section,
                    "kind": "module",
                    **outputs.file(compiled_id, outputs.dir(compiled_id) / COMPILED_MODULE),
                }
            )
            records.append(
                {"name": module.name, "section": section, **_host_fields(module, outputs, sections)}
            )
            meta = metas[module.name]
            for fn, sig in meta["signatures"].items():
                # A name two modules export stays reachable as `module.function`.
                name = fn if counts[fn] == 1 else f"{module.name}.{fn}"
                entry = {
                    "name": name,
                    "module": module.name,
                    "function": fn,
                    "inputs": _with_limits(
                        _with_ranges(
                            _named_dims(
                                fn, sig["inputs"], module.dynamic, source_dims[module.name]
                            ),
                            meta.get("index_ranges", {}).get(fn, {}).get("ranges", []),
                        ),
                        meta.get("index_ranges", {}).get(fn, {}).get("limits", []),
                        source_limits[module.name].get(fn, {}),
                    ),
                    "outputs": sig["outputs"],
                    "memory": meta["footprints"].get(fn, {"unknown": "no memory plan"}),
                }
                device = meta["function_devices"].get(fn)
                if device is not None:  # where it runs: the placement, else the first device
                    entry["device"] = device
                entrypoints.append(entry)
            for s in scopes_by_graph[module.imported_ref]:
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
                        "options": dict(d.options),
                        "requires": dict(d.requires),
                        **({"host_chosen": dict(d.host_chosen)} if d.host_chosen else {}),
                        **({"driver_pinned": True} if d.driver_pinned else {}),
                        **_backend_fields(d, outputs, sections),
                        **_kernel_sites(d, metas),
                    }
                    for d in variant.devices
                ],
                "modules": records,
                "entrypoints": entrypoints,
                "parameter_scopes": scopes,
                "flags": list(variant.flags),
                "module_attributes": dict(variant.module_attributes),
            }
        )
    parameters = []
    for (scope, key), p in sorted(params.items()):
        section = parameter_section_name(scope, key)
        sections.append({"name": section, "kind": "parameter", **p["file"]})
        parameters.append(
            {
                "scope": scope,
                "key": key,
                "section": section,
                "offset": 0,
                "length": p["length"],
                "codec": "none",
                "dtype": p["dtype"],
                "shape": list(p["shape"]),
                "layout": "dense",
                **_codec_fields(p["codec"]),
                **_layout_fields(p["weight_layout"], p["dtype"], p["shape"]),
            }
        )
    tuning = _tuning(job, outputs)
    manifest = {
        "app": dict(job.app),
        "policies": dict(job.policies),
        "variants": variants,
        "parameters": parameters,
        "tuning": tuning,
        "provenance": {
            **{f"{k.replace('-', '_')}_version": v for k, v in job.versions.items()},
            "sources": {g.ref: source_digest(g.source.path) for g in job.graphs},
            "packages": dict(job.packages),
            "favor": job.favor,
            **({"tuning_specs": tuning["specs"]} if tuning else {}),
        },
    }
    return manifest, sections


def _host_fields(module: ModuleLink, outputs: _Outputs, sections: list[dict]) -> dict:
    """Host fallback (ONNX): the nodes a module calls in the runtime's host module, each with
    its one-node model as a `blob` section (myelin.runtime.host_ops)."""
    node = module.imported.node_id
    nodes = read_import_meta(outputs.dir(node)).get("host_nodes", [])
    if not nodes:
        return {}
    functions = []
    for n in nodes:
        name = f"host/{n['function']}"
        if all(s["name"] != name for s in sections):
            sections.append(
                {"name": name, "kind": "blob", **outputs.file(node, outputs.dir(node) / n["file"])}
            )
        functions.append({k: v for k, v in n.items() if k != "file"} | {"section": name})
    return {"host_functions": functions}


def _backend_fields(device, outputs: _Outputs, sections: list[dict]) -> dict:
    """An external backend's device record: the plugin and vendor libraries as `backend`
    sections (one copy however many variants use it), in the order the runtime loads them."""
    if device.backend is None:
        return {}
    from plex.builder.backends import read_backend_meta

    node = device.backend.node_id
    meta = read_backend_meta(outputs.dir(node))
    prefix = f"backend/{meta['name']}"

    def add(name: str, file: str) -> str:
        if all(s["name"] != name for s in sections):
            sections.append(
                {"name": name, "kind": "backend", **outputs.file(node, outputs.dir(node) / file)}
            )
        return name

    libraries = [add(f"{prefix}/{f.rpartition('/')[2]}", f) for f in meta["libraries"]]
    return {
        "backend": {
            "name": meta["name"],
            "abi": meta["abi"],
            "ops": meta["ops"],
            "plugin": add(f"{prefix}/plugin", meta["plugin"]),
            "libraries": libraries,
        }
    }


def _layout_fields(record: dict | None, dtype: str, stored: list[int]) -> dict:
    """Manifest fields of a parameter stored in a tuned weight layout (myelin.tuning.layout):
    the logical shape, the stored one, and `order` (stored axis i is logical axis order[i])."""
    if record is None:
        return {}
    return {
        "shape": record["logical_shape"],
        "layout": f"dense, stored {record['layout']} (tuned weight layout)",
        "storage": {"dtype": dtype, "shape": list(stored)},
        "order": record["order"],
        "weight_layout": record["layout"],
    }


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
