"""From a resolved app to a SYNaPSe plan: which nodes exist, what each one's fingerprint covers.

Node ids:  weights:<pkg>:<name>   import:<pkg>:<unit>   compile:<pkg>:<module>:<variant>
           encode:<pkg>:<unit> (weight codecs; only where a codec policy applies)
           compose (writes the .mln)   phases (writes --dump-phases / --compile-to IR)

A graph is one VM module named after it, or, with `shards`, one module per shard named
`<graph>_<shard>`. A shard with its own source file has its own import node (id: its module
name), so a change to that file re-imports and recompiles only that shard; shards that split the
graph's source by entrypoint share the graph's import node and differ only at compile time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from myelin import hostinfo
from myelin.codecs import FORMAT_VERSION as CODECS_FORMAT
from myelin.codecs import NO_CODEC, CodecPolicy, CodecRule
from myelin.compiler.phases import PhaseFile
from myelin.compiler.pipeline import DEFAULT_MIN_PARAMETER_BYTES, compile_flags
from myelin.compiler.targets import TargetDevice
from myelin.frontends import FrontendRequest
from plex.build import steps
from plex.errors import BuildError
from plex.manifest import AppSpec, DeviceSpec, GraphSpec, ShardSpec, VariantSpec, WeightsSpec
from synapse import Node, Plan, bytes_digest, file_digest, json_digest

# scheduling.favor -> IREE Stream partitioning preference, as a module attribute: the compiler C
# API does not register --iree-stream-partitioning-favor (the iree-compile tool does).
FAVOR_ATTRIBUTES = {
    "min-memory": {},  # IREE's default is min-peak-memory
    "max-concurrency": {"stream.partitioning": '#stream.partitioning_config<"max-concurrency">'},
    "debug": {"stream.partitioning": '#stream.partitioning_config<"debug">'},
}


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked of one build, beyond the manifest.

    output: the .mln; with `compile_to`, a folder of IR files (or one `.mlir` file when the app
    has a single module and variant).
    dump_phases: also write the IR of every phase of every module and variant under this folder.
    compile_to: stop every compile after this phase and write its IR instead of a .mln.
    resume: phase files to compile from instead of the imported IR, one per module and variant.
    """

    output: Path
    strict: bool = False  # codec check violations are errors, not warnings
    dump_phases: Path | None = None
    compile_to: str | None = None
    resume: tuple[PhaseFile, ...] = field(default=(), hash=False)


def target_device(device: DeviceSpec) -> TargetDevice:
    return TargetDevice(
        name=device.name,
        target=device.target,
        cpu=device.cpu,
        cpu_features=device.cpu_features,
        arch=device.arch,
        data_tiling=device.data_tiling,
    )


def device_requirements(device: DeviceSpec) -> dict:
    """What the runtime must find to run code compiled for this device."""
    if device.target == "llvm-cpu" and (device.cpu or "host") == "host":
        return {"cpu_flags": sorted(hostinfo.cpu_flags()), "machine": hostinfo.machine()}
    return {}


# `[runtime] cancellable` (default): entrypoints take wait/signal fences (IREE's async-external
# ABI), so the runtime can stop waiting on a running call; costs ~1.5 µs per call on the CPU.
CANCELLABLE_FLAGS = ("--iree-execution-model=async-external",)


def variant_flags(app: AppSpec, variant: VariantSpec) -> list[str]:
    extra = CANCELLABLE_FLAGS if app.cancellable else ()
    return compile_flags([target_device(d) for d in variant.devices], extra)


def graph_scope(graph: GraphSpec) -> str:
    """Parameter scope of a graph's inline constants: unique per graph, so two graphs'
    `constant_0` never collide in one artifact."""
    return f"{graph.package}.{graph.name}"


def frontend_request(graph: GraphSpec, scope: str) -> FrontendRequest:
    return FrontendRequest(
        source=graph.source,
        symbol=graph.source_symbol,
        module_name=graph.name,
        scope=scope,
        entrypoints=graph.entrypoints,
        dynamic=graph.dynamic,
    )


def python_sources_digest(folder: Path) -> str:
    """Digest of every .py file under a package folder: a Python graph source may import any of
    them, so editing one must re-run the import."""
    files = sorted(
        p
        for p in folder.rglob("*.py")
        if not any(
            part.startswith(".") or part in ("__pycache__", "site-packages")
            for part in p.relative_to(folder).parts
        )
    )
    return json_digest({p.relative_to(folder).as_posix(): file_digest(p) for p in files})


def weights_node_id(weights: WeightsSpec) -> str:
    return f"weights:{weights.package}:{weights.name}"


def import_node_id(graph: GraphSpec) -> str:
    return f"import:{graph.package}:{graph.name}"


def encode_node_id(graph: GraphSpec) -> str:
    return f"encode:{graph.package}:{graph.name}"


def codec_policy(app: AppSpec, graph: GraphSpec) -> CodecPolicy:
    """The codec intent for a graph's parameters: the default codec of the weights it reads,
    then the app's `[weights.codec]` globs (myelin.codecs._policy says how they combine)."""
    weights = graph.weights
    return CodecPolicy(
        default=weights.codec if weights is not None else NO_CODEC,
        default_from=f"[weights.{weights.name}] of package {weights.package}" if weights else "",
        rules=tuple(CodecRule(pattern, codec) for pattern, codec in app.codecs),
    )


def module_source_id(app: AppSpec, graph: GraphSpec) -> str:
    """The node holding an imported graph's input-phase IR and parameter list for compiling:
    its encode node when a codec may apply, else its import node."""
    return import_node_id(graph) if codec_policy(app, graph).trivial else encode_node_id(graph)


@dataclass(frozen=True)
class ModuleUnit:
    """One VM module of the artifact: an unsharded graph, or one shard of a graph."""

    graph: GraphSpec  # as declared in the manifest
    shard: ShardSpec | None
    imported: GraphSpec  # what its import node imports: the graph, or its shard's own source

    @property
    def name(self) -> str:
        """The VM module name; unique in the artifact."""
        return self.graph.name if self.shard is None else f"{self.graph.name}_{self.shard.name}"

    @property
    def ref(self) -> str:
        """`package:graph` or `package:graph.shard`, for messages."""
        return self.graph.ref if self.shard is None else f"{self.graph.ref}.{self.shard.name}"

    @property
    def entrypoints(self) -> tuple[str, ...] | None:
        return self.graph.entrypoints if self.shard is None else self.shard.entrypoints

    @property
    def export_only(self) -> tuple[str, ...] | None:
        """A shard that splits its graph's source exports only its entrypoints."""
        if self.shard is None or self.shard.own_source:
            return None
        return self.shard.entrypoints


def shard_graph(graph: GraphSpec, shard: ShardSpec) -> GraphSpec:
    """A shard with its own source, as a graph its import node can import like any other: it
    takes the module name `<graph>_<shard>` and its own parameter scope for inline constants."""
    return replace(
        graph,
        ref=f"{graph.ref}.{shard.name}",
        name=f"{graph.name}_{shard.name}",
        source=shard.source,
        source_symbol=shard.source_symbol,
        frontend=shard.frontend,
        entrypoints=shard.entrypoints,
        shards=(),
    )


def module_units(app: AppSpec) -> list[ModuleUnit]:
    """Every VM module of the app, in manifest order; module names are checked to be unique."""
    units: list[ModuleUnit] = []
    for graph in app.graphs:
        if not graph.shards:
            units.append(ModuleUnit(graph, None, graph))
        for shard in graph.shards:
            imported = shard_graph(graph, shard) if shard.own_source else graph
            units.append(ModuleUnit(graph, shard, imported))
    seen: dict[str, ModuleUnit] = {}
    for unit in units:
        other = seen.setdefault(unit.name, unit)
        if other is not unit:
            raise BuildError(
                f"{other.ref} and {unit.ref} both compile to VM module '{unit.name}'; "
                "rename a graph or shard so that module names stay unique"
            )
    return units


def import_units(app: AppSpec) -> list[GraphSpec]:
    """What the import nodes import, each once: unsharded graphs, graphs whose source shards
    split, and shards with their own source (as graphs, see `shard_graph`)."""
    return list({u.imported.ref: u.imported for u in module_units(app)}.values())


def compile_node_id(unit: ModuleUnit, variant: VariantSpec) -> str:
    return f"compile:{unit.graph.package}:{unit.name}:{variant.name}"


def memory_node_id(unit: ModuleUnit, variant: VariantSpec) -> str:
    return f"memory:{unit.graph.package}:{unit.name}:{variant.name}"


def phase_fields(unit: ModuleUnit, variant: VariantSpec, app: AppSpec) -> dict[str, str]:
    """What a phase file written for this module and variant records (and a resume checks)."""
    flags = {
        "flags": variant_flags(app, variant),
        "module_attributes": FAVOR_ATTRIBUTES[app.favor],
    }
    source = unit.imported.source
    assert source is not None
    return {
        "module": unit.name,
        "variant": variant.name,
        "flags": json_digest(flags),
        "source": file_digest(source),
    }


def weights_temp_bytes(weights: WeightsSpec) -> int:
    """Peak temporary memory of encoding these weights: one tensor is held at a time."""
    if weights.source is None or weights.format != "safetensors":
        return 0
    tensors = steps.read_safetensors_header(weights.source, what=weights.ref)
    return max((t["end"] - t["begin"] for t in tensors), default=0)


def plan_build(app: AppSpec, request: BuildRequest) -> Plan:
    nodes: list[Node] = []
    weights_seen: dict[str, WeightsSpec] = {}
    for graph in app.graphs:
        if graph.weights is not None and graph.weights.source is not None:
            weights_seen.setdefault(weights_node_id(graph.weights), graph.weights)
    for node_id, weights in weights_seen.items():
        source = weights.source
        assert source is not None
        nodes.append(
            Node(
                id=node_id,
                kind="weights",
                label=f"weights {weights.ref}",
                action=lambda ctx, source=source, ref=weights.ref: steps.run_weights(
                    ctx.out_dir, source=source, what=ref
                ),
                inputs={"source": file_digest(source), "format": weights.format or ""},
                memory=weights_temp_bytes(weights),
            )
        )
    compile_ids: list[str] = []
    package_dirs = {p.name: p.path for p in app.packages}
    for graph in import_units(app):
        scope = graph_scope(graph)
        import_id = import_node_id(graph)
        nodes.append(
            Node(
                id=import_id,
                kind="import",
                label=f"import {graph.ref}",
                action=lambda ctx, g=graph, scope=scope: steps.run_import(
                    ctx.out_dir,
                    request=frontend_request(g, scope),
                    frontend_name=g.frontend,
                    min_parameter_bytes=DEFAULT_MIN_PARAMETER_BYTES,
                    what=g.ref,
                ),
                inputs={
                    "source": file_digest(graph.source),
                    "frontend": graph.frontend,
                    "options": json_digest(
                        {
                            "module": graph.name,
                            "scope": scope,
                            "min_parameter_bytes": DEFAULT_MIN_PARAMETER_BYTES,
                            "entrypoints": graph.entrypoints,
                            "dynamic": graph.dynamic,
                        }
                    ),
                    **(
                        {"python_sources": python_sources_digest(package_dirs[graph.package])}
                        if graph.source_symbol is not None
                        else {}
                    ),
                },
                heavy=True,
            )
        )
    for graph in import_units(app):
        policy = codec_policy(app, graph)
        if not policy.trivial:
            nodes.append(_encode_node(graph, policy))
    resume = _resume_files(app, request)
    from plex.build.compose import write_memory_plans

    for unit in module_units(app):
        import_id = module_source_id(app, unit.imported)
        for variant in app.variants:
            node_id = compile_node_id(unit, variant)
            compile_ids.append(node_id)
            nodes.append(
                _compile_node(
                    app,
                    request,
                    unit,
                    variant,
                    node_id,
                    import_id,
                    resume.get((unit.name, variant.name)),
                )
            )
            if request.compile_to is None:
                # Memory plans replay the compile up to Stream: cached, apart from compose.
                nodes.append(
                    Node(
                        id=memory_node_id(unit, variant),
                        kind="memory",
                        label=f"memory plan of {unit.ref} for {variant.name}",
                        deps=tuple(
                            dict.fromkeys((import_node_id(unit.imported), import_id, node_id))
                        ),
                        action=lambda ctx, u=unit, v=variant: write_memory_plans(
                            ctx.out_dir, u, v, ctx.dep_outputs
                        ),
                        heavy=True,
                    )
                )
    from plex.build.compose import compose_artifact

    deps = tuple(n.id for n in nodes)
    if request.dump_phases is not None or request.compile_to is not None:
        from plex.build.compose import write_phases

        target = request.dump_phases if request.compile_to is None else request.output
        assert target is not None
        nodes.append(
            Node(
                id="phases",
                kind="phases",
                label=f"write IR phases to {target.name}",
                deps=tuple(compile_ids),
                action=lambda ctx: write_phases(app, request, target, ctx.dep_outputs),
                inputs={"output": json.dumps(str(target))},
                cacheable=False,
            )
        )
    if request.compile_to is None:
        nodes.append(
            Node(
                id="compose",
                kind="compose",
                label=f"compose {request.output.name}",
                deps=deps,
                action=lambda ctx: compose_artifact(app, request, ctx.dep_outputs),
                inputs={"output": json.dumps(str(request.output))},
                cacheable=False,
            )
        )
    return Plan(nodes)


def _encode_node(graph: GraphSpec, policy: CodecPolicy) -> Node:
    """Weight codecs on the imported IR and the parameter data (see myelin.codecs); the policy
    is in the key, and the weights node's output when the graph reads a weights package."""
    import_id = import_node_id(graph)
    weights = graph.weights if graph.weights is not None and graph.weights.source else None
    weights_id = weights_node_id(weights) if weights is not None else None
    return Node(
        id=encode_node_id(graph),
        kind="encode",
        label=f"encode weights of {graph.ref}",
        deps=(import_id,) + ((weights_id,) if weights_id else ()),
        action=lambda ctx: steps.run_encode(
            ctx.out_dir,
            imported_dir=ctx.dep_outputs[import_id],
            weights_dir=ctx.dep_outputs[weights_id] if weights_id else None,
            weights_scope=weights.scope if weights is not None else None,
            policy=policy,
            what=graph.ref,
        ),
        inputs={"policy": json_digest(policy.to_json()), "codecs": str(CODECS_FORMAT)},
        heavy=True,
    )


def _compile_node(
    app: AppSpec,
    request: BuildRequest,
    unit: ModuleUnit,
    variant: VariantSpec,
    node_id: str,
    import_id: str,
    resume: PhaseFile | None,
) -> Node:
    flags = variant_flags(app, variant)
    attributes = FAVOR_ATTRIBUTES[app.favor]
    devices = [target_device(d) for d in variant.devices]
    entrypoints = list(unit.entrypoints) if unit.entrypoints is not None else None
    arg_names = {k: list(v) for k, v in unit.graph.arg_names.items()}
    dump = request.dump_phases is not None
    inputs = {
        "flags": json_digest(flags),
        "module_attributes": json_digest(attributes),
        "entrypoints": json_digest(entrypoints),
        "arg_names": json_digest(arg_names),
        "requirements": json_digest([device_requirements(d) for d in variant.devices]),
    }
    if unit.shard is not None:
        inputs["module"] = json_digest({"name": unit.name, "export_only": unit.export_only})
    placement = placement_rules(app, unit)
    if placement:
        inputs["placement"] = json_digest(placement)
    if dump:
        inputs["dump_phases"] = "all"
    if request.compile_to is not None:
        inputs["compile_to"] = request.compile_to
    if resume is not None:
        inputs["resume"] = bytes_digest(resume.text.encode())
    fields = phase_fields(unit, variant, app)
    what = f"{unit.ref} ({variant.name})"
    return Node(
        id=node_id,
        kind="compile",
        label=f"compile {unit.ref} for {variant.name}",
        deps=(import_id,),
        action=lambda ctx: steps.run_compile(
            ctx.out_dir,
            imported_dir=ctx.dep_outputs[import_id],
            devices=devices,
            module_attributes=attributes,
            entrypoints=entrypoints,
            arg_names=arg_names,
            what=what,
            extra_flags=CANCELLABLE_FLAGS if app.cancellable else (),
            module_name=unit.name if unit.shard is not None else None,
            export_only=unit.export_only,
            dump_phases=dump,
            stop_at=request.compile_to,
            resume=resume,
            phase_fields=fields,
            placement=placement,
        ),
        inputs=inputs,
        heavy=True,
    )


def placement_rules(app: AppSpec, unit: ModuleUnit) -> list[tuple[str | None, str]]:
    """The `[placement]` rules about this module, as (function glob or None, device), in file
    order; `myelin.compiler.placement.resolve_placement` applies them per variant."""
    return [
        (rule.function_glob, rule.device)
        for rule in app.placement
        if rule.names_module(unit.graph.name, unit.name)
    ]


def _resume_files(app: AppSpec, request: BuildRequest) -> dict[tuple[str, str], PhaseFile]:
    """(module, variant) -> the phase file to resume it from, after checking that each file was
    written for a module and variant of this app, with today's flags and source."""
    if not request.resume:
        return {}
    units = {u.name: u for u in module_units(app)}
    variants = {v.name: v for v in app.variants}
    picked: dict[tuple[str, str], PhaseFile] = {}
    for phase_file in request.resume:
        name = phase_file.path or "a phase file"
        module, variant = phase_file.fields.get("module"), phase_file.fields.get("variant")
        if module not in units or variant not in variants:
            known = ", ".join(f"{m}/{v}" for m in units for v in variants)
            raise BuildError(
                f"{name} was written for module '{module}', variant '{variant}', which this app "
                f"does not build (it builds: {known}); resume only from phase files of this app"
            )
        expected = phase_fields(units[module], variants[variant], app)
        for key, what in (("flags", "compile flags or scheduling"), ("source", "graph source")):
            if phase_file.fields.get(key) != expected[key]:
                raise BuildError(
                    f"{name} was written with another {what} than module '{module}' has now; "
                    f"IR from it would not match. Write it again with `plex build --compile-to "
                    f"{phase_file.phase}` and redo the edit"
                )
        if (module, variant) in picked:
            raise BuildError(f"two phase files given for module '{module}', variant '{variant}'")
        picked[(module, variant)] = phase_file
    return picked
