"""Plan: a resolved app becomes SYNaPSe nodes holding jobs (pure data; every decision is made here).

Node ids:  weights:<pkg>:<name>   import:<pkg>:<unit>   encode:<pkg>:<unit> (only where a codec
           policy applies)   compile:<pkg>:<module>:<variant>   link (the artifact manifest)
           compose (writes the .mln)   phases (writes --dump-phases / --compile-to IR)

A graph is one VM module named after it, or, with `shards`, one module per shard named
`<graph>_<shard>`. A shard with its own source file has its own import node (id: its module
name), so a change to that file re-imports and recompiles only that shard; shards that split the
graph's source by entrypoint share the graph's import node and differ only at compile time.

What a node's key covers is its job's fields (plex.builder.jobs): nothing is listed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from myelin import hostinfo
from myelin.codecs import FORMAT_VERSION as CODECS_FORMAT
from myelin.codecs import NO_CODEC, CodecPolicy, CodecRule, device_limits
from myelin.codecs import kernels_key as codecs_kernels_key
from myelin.compiler.options import DEFAULT_MIN_PARAMETER_BYTES, variant_flags
from myelin.compiler.phases import PhaseFile
from myelin.compiler.scheduling import favor_attributes
from myelin.compiler.targets import (
    BF16_COMPUTE_CODECS,
    HostChoice,
    TargetDevice,
    compute_choice,
    conv_batch_choice,
    data_tiling_choice,
    matmul_tiles_choice,
    reductions_choice,
    relayout_tiles_choice,
)
from myelin.platforms import KERNELS_CUDA_ARCH
from myelin.tuning.spec import spec_is_process_wide
from plex.builder import records
from plex.builder.jobs import (
    BackendJob,
    CompileJob,
    ComposeJob,
    DeviceLink,
    EncodeJob,
    ImportedGraph,
    ImportJob,
    KernelsJob,
    LinkJob,
    ModuleLink,
    PhasesJob,
    VariantLink,
    WeightsJob,
    WeightsSource,
)
from plex.builder.versions import versions
from plex.errors import BuildError
from plex.manifest import (
    AppSpec,
    BackendSpec,
    DeviceSpec,
    GraphSpec,
    ShardSpec,
    TuningSpec,
    VariantSpec,
    WeightsSpec,
)
from synapse import InputFile, InputTree, Node, Output, Plan, json_digest


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


def data_tiling_of(app: AppSpec, device: DeviceSpec) -> tuple[bool, HostChoice | None]:
    """A device's data tiling: the app's value where it pins one, else the host's choice
    (returned too, for the artifact's record). Only llvm-cpu devices tile, and a backend's
    device is left as the app says (its matmuls run in the library). An app that encodes
    weights keeps them encoded: under data tiling each encoded matmul weight would be decoded
    at load into fp32's packed copies (docs/codecs.md), spending what the codec saved; except a
    causal LM on a host with the matmul kernels (CAUSAL_LM_TILING), whose prefill they speed
    up 3x."""
    if device.target != "llvm-cpu" or (device.backend is not None and device.data_tiling is None):
        return False, None
    if device.data_tiling is not None:
        return device.data_tiling, None
    choice = data_tiling_choice(device.cpu, device.cpu_features)
    if any(not codec_policy(app, graph).trivial for graph in app.graphs):
        if choice.value and any(graph.frontend == CAUSAL_LM for graph in app.graphs):
            return True, HostChoice(True, CAUSAL_LM_TILING)
        return False, HostChoice(False, "the app encodes weights: they stay encoded in memory")
    return choice.value, choice


CAUSAL_LM = "causal-lm"
# Why a causal LM with encoded weights data-tiles where the host has the kernels: its prefill
# is a matmul of prompt-many rows, 3x faster on the packed kernels (docs/llm.md, "Prefill"),
# while its decode steps (matvecs) keep reading the encoded weights.
CAUSAL_LM_TILING = (
    "a causal LM's prefill runs IREE's AVX-512 matmul microkernels: its encoded matrices are "
    "also decoded at load into packed f32 copies (decode steps read the encoded ones); "
    "pin data_tiling = false to keep only the encoded bytes in memory"
)


def matmul_tiles_of(app: AppSpec, device: DeviceSpec) -> tuple[str, HostChoice | None]:
    """A device's workgroup tiles of its data-tiled matmuls: the app's value where it pins
    one, else the host's choice (myelin.compiler.targets.matmul_tiles_choice)."""
    if device.target != "llvm-cpu":
        return "iree", None
    if device.matmul_tiles is not None:
        return device.matmul_tiles, None
    choice = matmul_tiles_choice(data_tiling_of(app, device)[0], device.cpu, device.cpu_features)
    return str(choice.value), choice


def relayout_tiles_of(app: AppSpec, device: DeviceSpec) -> tuple[str, HostChoice | None]:
    """A device's vector tiles of the relayouts between its packed matmuls: the app's value
    where it pins one, else the host's choice (myelin.compiler.targets.relayout_tiles_choice)."""
    if device.target != "llvm-cpu":
        return "iree", None
    if device.relayout_tiles is not None:
        return device.relayout_tiles, None
    tiled = data_tiling_of(app, device)[0]
    choice = relayout_tiles_choice(tiled, device.cpu, device.cpu_features)
    return str(choice.value), choice


def compute_of(app: AppSpec, device: DeviceSpec) -> tuple[str, HostChoice | None]:
    """A device's matmul input precision: the app's value where it pins one, else the host's
    choice for the app's weight codecs (myelin.compiler.targets.compute_choice): "f32" unless
    every codec the app names is coarser than bf16."""
    if device.target != "llvm-cpu":
        return "f32", None
    if device.compute is not None:
        return device.compute, None
    policies = [codec_policy(app, graph) for graph in app.graphs]
    named = {c for p in policies for c in (p.default, *(r.codec for r in p.rules))} - {NO_CODEC}
    coarse = bool(named) and named <= set(BF16_COMPUTE_CODECS)
    tiled = data_tiling_of(app, device)[0]
    choice = compute_choice(tiled, coarse, device.cpu, device.cpu_features)
    return (str(choice.value), choice) if choice is not None else ("f32", None)


def conv_batch_of(app: AppSpec, device: DeviceSpec) -> tuple[str, HostChoice | None]:
    """How a device compiles a batch's 2-D convolutions: the app's value where it pins one,
    else the build's choice with data tiling (myelin.compiler.targets.conv_batch_choice)."""
    if device.target != "llvm-cpu":
        return "iree", None
    if device.conv_batch is not None:
        return device.conv_batch, None
    choice = conv_batch_choice(data_tiling_of(app, device)[0])
    return str(choice.value), choice


def reductions_of(device: DeviceSpec) -> tuple[str, HostChoice | None]:
    """A device's row reductions: the app's value where it pins one, else the host's choice
    (myelin.compiler.targets.reductions_choice)."""
    if device.target != "llvm-cpu":
        return "iree", None
    if device.reductions is not None:
        return device.reductions, None
    choice = reductions_choice(device.cpu, device.cpu_features)
    return str(choice.value), choice


def host_chosen(app: AppSpec, device: DeviceSpec) -> dict[str, dict]:
    """The artifact's record of the options the build chose for the CPU (empty: none)."""
    chosen = {}
    for option, (_, choice) in (
        ("data_tiling", data_tiling_of(app, device)),
        ("matmul_tiles", matmul_tiles_of(app, device)),
        ("compute", compute_of(app, device)),
        ("reductions", reductions_of(device)),
        ("relayout_tiles", relayout_tiles_of(app, device)),
        ("conv_batch", conv_batch_of(app, device)),
    ):
        if choice is not None:
            chosen[option] = {"value": choice.value, "reason": choice.reason}
    return chosen


def _rows(app: AppSpec, device: DeviceSpec) -> str | None:
    """ "rows" where a device's packed matmuls take PLeX's tiles (None: IREE's own)."""
    tiles = matmul_tiles_of(app, device)[0]
    return tiles if tiles == "rows" and data_tiling_of(app, device)[0] else None


def _reduced(app: AppSpec, device: DeviceSpec) -> str | None:
    """A device's compute mode where it is not the model's own precision (None: f32)."""
    value = compute_of(app, device)[0]
    return value if value != "f32" else None


def _vector(device: DeviceSpec) -> str | None:
    """ "vector" where a device's row reductions take PLeX's tiles (None: IREE's own)."""
    value = reductions_of(device)[0]
    return value if value == "vector" else None


def _whole(app: AppSpec, device: DeviceSpec) -> str | None:
    """ "whole" where a device's relayouts take PLeX's tiles (None: IREE's own)."""
    value = relayout_tiles_of(app, device)[0]
    return value if value == "whole" and data_tiling_of(app, device)[0] else None


def _images(app: AppSpec, device: DeviceSpec) -> str | None:
    """ "images" where a device splits a batch's convolutions by image (None: IREE's own)."""
    value = conv_batch_of(app, device)[0]
    return value if value == "images" and data_tiling_of(app, device)[0] else None


def target_device(app: AppSpec, device: DeviceSpec) -> TargetDevice:
    return TargetDevice(
        name=device.name,
        target=device.target,
        cpu=device.cpu,
        cpu_features=device.cpu_features,
        arch=device.arch,
        data_tiling=data_tiling_of(app, device)[0],
        result_storage=device.result_storage,
        compute=compute_of(app, device)[0],
        matmul_tiles=matmul_tiles_of(app, device)[0],
        reductions=reductions_of(device)[0],
        relayout_tiles=relayout_tiles_of(app, device)[0],
        conv_batch=conv_batch_of(app, device)[0],
    )


def device_requirements(device: DeviceSpec) -> dict:
    """What the runtime must find to run code compiled for this device."""
    if device.target == "llvm-cpu" and (device.cpu or "host") == "host":
        return {"cpu_flags": sorted(hostinfo.cpu_flags()), "machine": hostinfo.machine()}
    if device.kernels:  # library kernels are sm_90a code: compute capability 9.0 exactly
        return {"cuda_arch": KERNELS_CUDA_ARCH}
    return {}


def kernels_library(variant: VariantSpec) -> str | None:
    """The kernel library a variant's compile uses (`[devices.<gpu>] kernels`), or None.

    Only a variant of one device takes one: the rewrite puts kernels in place of the graph's
    ops, and with several devices an op's device is known only after placement."""
    wanted = [d for d in variant.devices if d.kernels]
    if not wanted:
        return None
    if len(variant.devices) > 1:
        raise BuildError(
            f"variant '{variant.name}': device '{wanted[0].name}' asks for kernels = "
            f'"{wanted[0].kernels}", which only a variant of one device can use yet; give it a '
            "variant of its own or remove kernels"
        )
    return wanted[0].kernels


def kernels_node_id(graph: GraphSpec, library: str) -> str:
    return f"kernels:{graph.package}:{graph.name}:{library}"


def _kernels_toolchain(library: str) -> str:
    """The kernel generator's version, part of the kernels node's key."""
    from importlib import metadata

    package = library.partition("-")[0]  # "triton-attention" is generated by Triton too
    try:
        return f"{library} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return f"{library} (not installed)"  # the kernels step says how to install it


def app_variant_flags(app: AppSpec, variant: VariantSpec) -> list[str]:
    devices = [target_device(app, d) for d in variant.devices]
    return variant_flags(devices, cancellable=app.cancellable)


def graph_scope(graph: GraphSpec) -> str:
    """Parameter scope of a graph's inline constants: unique per graph, so two graphs'
    `constant_0` never collide in one artifact."""
    return f"{graph.package}.{graph.name}"


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
    default = weights.codec if weights is not None else NO_CODEC
    rules = tuple(CodecRule(pattern, codec) for pattern, codec in app.codecs)
    return CodecPolicy(
        default=default,
        default_from=f"[weights.{weights.name}] of package {weights.package}" if weights else "",
        rules=rules,
        unsupported=device_limits(app.devices, sorted({default, *(r.codec for r in rules)})),
    )


def weight_layouts(app: AppSpec) -> tuple[tuple[str, str], ...]:
    """The stored weight layouts the app's tuning specs choose, (parameter glob, layout) in
    `[myelin] tuning` order: a parameter's stored bytes serve every variant, so they are the
    graph's, whichever target's tuning chose them."""
    return tuple(rule for spec in app.tuning for rule in spec.layouts)


def encodes(app: AppSpec, graph: GraphSpec) -> bool:
    """Whether a graph has an encode node: a codec may apply, or a weight layout."""
    return not codec_policy(app, graph).trivial or bool(weight_layouts(app))


def module_source_id(app: AppSpec, graph: GraphSpec) -> str:
    """The node holding an imported graph's input-phase IR and parameter list for compiling:
    its encode node when a codec or weight layout may apply, else its import node."""
    return encode_node_id(graph) if encodes(app, graph) else import_node_id(graph)


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


LINK_NODE = "link"
COMPOSE_NODE = "compose"
PHASES_NODE = "phases"


def phase_fields(unit: ModuleUnit, variant: VariantSpec, app: AppSpec) -> dict[str, str]:
    """What a phase file written for this module and variant records (and a resume checks)."""
    flags = {
        "flags": app_variant_flags(app, variant),
        "module_attributes": favor_attributes(app.favor),
    }
    source = unit.imported.source
    assert source is not None
    return {
        "module": unit.name,
        "variant": variant.name,
        "flags": json_digest(flags),
        "source": records.source_digest(source),
    }


def weights_temp_bytes(weights: WeightsSpec) -> int:
    """Peak temporary memory of encoding these weights: one tensor is held at a time."""
    if weights.source is None or weights.format != "safetensors":
        return 0
    tensors = records.read_safetensors_header(weights.source, what=weights.ref)
    return max((t["end"] - t["begin"] for t in tensors), default=0)


def placement_rules(app: AppSpec, unit: ModuleUnit) -> tuple[tuple[str | None, str], ...]:
    """The `[placement]` rules about this module, as (function glob or None, device), in file
    order; the compile applies them to the module's functions (myelin.compiler.placement)."""
    return tuple(
        (rule.function_glob, rule.device)
        for rule in app.placement
        if rule.names_module(unit.graph.name, unit.name) and rule.op is None
    )


def backend_node_id(backend: BackendSpec) -> str:
    return f"backend:{backend.package}:{backend.name}"


def backend_ops(
    app: AppSpec, unit: ModuleUnit, variant: VariantSpec
) -> tuple[tuple[str, str, str, int], ...]:
    """The `[placement]` op rules about this module whose backend device is in the variant, as
    (device, backend, op, min_flops) in file order: the compile rewrites those ops into calls."""
    backends = {d.name: d.backend for d in variant.devices if d.backend is not None}
    return tuple(
        (rule.device, backend.name, rule.op, backend.min_flops)
        for rule in app.placement
        if rule.op is not None
        and (backend := backends.get(rule.device)) is not None
        and rule.names_module(unit.graph.name, unit.name)
    )


def _backend_nodes(app: AppSpec) -> list[Node]:
    """One node per backend some variant's device uses: its plugin, built once."""
    from myelin.backends import ABI_FILES, compiler_version

    backends = {
        backend_node_id(d.backend): d.backend
        for v in app.variants
        for d in v.devices
        if d.backend is not None
    }
    nodes = []
    for node_id, b in backends.items():
        job = BackendJob(
            name=b.name,
            sources=tuple(InputFile(s) for s in b.sources),
            library=InputFile(b.library) if b.library is not None else None,
            abi=tuple(InputFile(f) for f in ABI_FILES),
            include_dirs=tuple(InputTree(d, ".h") for d in b.include_dirs),
            libraries=tuple(InputFile(lib) for lib in b.libraries),
            library_names=tuple(lib.name for lib in b.libraries),
            static_libraries=tuple(InputFile(lib) for lib in b.static_libraries),
            cflags=b.cflags,
            compiler=compiler_version() if b.sources else "",
            ops=b.ops,
            what=f"backend {b.ref}",
        )
        nodes.append(Node(node_id, job, label=f"build backend {b.ref}"))
    return nodes


def _weights_of(graph: GraphSpec) -> WeightsSpec | None:
    return graph.weights if graph.weights is not None and graph.weights.source else None


def plan_build(app: AppSpec, request: BuildRequest) -> Plan:
    """The build's nodes: weights, import, encode, compile per variant, then link and compose
    (or phases, for --dump-phases / --compile-to)."""
    nodes: list[Node] = []
    weights_seen: dict[str, WeightsSpec] = {}
    for graph in app.graphs:
        weights = _weights_of(graph)
        if weights is not None:
            weights_seen.setdefault(weights_node_id(weights), weights)
    for node_id, weights in weights_seen.items():
        assert weights.source is not None
        job = WeightsJob(InputFile(weights.source), weights.format or "", weights.ref)
        label = f"weights {weights.ref}"
        nodes.append(Node(node_id, job, label=label, memory=weights_temp_bytes(weights)))
    package_dirs = {p.name: p.path for p in app.packages}
    for graph in import_units(app):
        nodes.append(_import_node(graph, package_dirs[graph.package]))
    nodes.extend(_backend_nodes(app))
    for graph in import_units(app):
        if encodes(app, graph):
            nodes.append(_encode_node(graph, codec_policy(app, graph), weight_layouts(app)))
    libraries = sorted({lib for v in app.variants if (lib := kernels_library(v)) is not None})
    for graph in import_units(app):
        for library in libraries:
            nodes.append(_kernels_node(app, graph, library))
    resume = _resume_files(app, request)
    compiled: list[tuple[ModuleUnit, VariantSpec, str]] = []
    for unit in module_units(app):
        for variant in app.variants:
            node = _compile_node(app, request, unit, variant, resume.get((unit.name, variant.name)))
            nodes.append(node)
            compiled.append((unit, variant, node.id))
    if request.dump_phases is not None or request.compile_to is not None:
        target = request.dump_phases if request.compile_to is None else request.output
        assert target is not None
        job = PhasesJob(
            compiled=tuple((u.name, v.name, Output(i)) for u, v, i in compiled),
            single_file=request.compile_to is not None and target.suffix == ".mlir",
            target=target,
        )
        label = f"write IR phases to {target.name}"
        nodes.append(Node(PHASES_NODE, job, label=label, cacheable=False))
    if request.compile_to is None:
        nodes.append(Node(LINK_NODE, _link_job(app), label="link the artifact manifest"))
        compose = ComposeJob(
            link=Output(LINK_NODE),
            sections=tuple(
                Output(n.id)
                for n in nodes
                if n.kind in ("weights", "import", "encode", "compile", "backend")
            ),
            strict=request.strict,
            output=request.output,
        )
        label = f"compose {request.output.name}"
        nodes.append(Node(COMPOSE_NODE, compose, label=label, cacheable=False))
    return Plan(nodes)


def _import_node(graph: GraphSpec, package_dir: Path) -> Node:
    assert graph.source is not None
    job = ImportJob(
        source=InputFile(graph.source),
        frontend=graph.frontend,
        symbol=graph.source_symbol,
        module_name=graph.name,
        scope=graph_scope(graph),
        entrypoints=graph.entrypoints,
        dynamic={k: dict(v) for k, v in graph.dynamic.items()},
        min_parameter_bytes=DEFAULT_MIN_PARAMETER_BYTES,
        python_sources=_source_tree(graph, package_dir),
        what=graph.ref,
        host_fallback=graph.host_fallback,
        max_seq=graph.max_seq,
        max_batch=graph.max_batch,
        dtype=graph.dtype,
        prefill_lengths=graph.prefill_lengths,
    )
    return Node(
        import_node_id(graph), job, label=f"import {graph.ref}", heavy=True, isolate=ISOLATE_STEPS
    )


def _source_tree(graph: GraphSpec, package_dir: Path) -> InputTree | None:
    """The files an import reads besides its source: a Python model file may import any module
    of its package; a causal-lm source (config.json) comes with its folder's weights and
    tokenizer."""
    if graph.frontend == "causal-lm":
        assert graph.source is not None
        return InputTree(graph.source.parent, "")
    return InputTree(package_dir, ".py") if graph.source_symbol is not None else None


# Import, encode and compile steps run in SYNaPSe worker processes (synapse._worker): a crash in
# the model's own code or in the in-process IREE compiler, or a sys.exit in a model file, is then
# one error naming the node instead of the end of `plex build`. The overhead is measured in
# docs/synapse.md ("Process isolation"); PLEX_BUILD_ISOLATE=0 runs them in threads again.
ISOLATE_STEPS = True


def _encode_node(
    graph: GraphSpec, policy: CodecPolicy, layouts: tuple[tuple[str, str], ...]
) -> Node:
    weights = _weights_of(graph)
    job = EncodeJob(
        imported=Output(import_node_id(graph)),
        weights=Output(weights_node_id(weights)) if weights is not None else None,
        weights_scope=weights.scope if weights is not None else None,
        policy=policy,
        codecs_format=CODECS_FORMAT,
        what=graph.ref,
        layouts=layouts,
    )
    label = f"encode weights of {graph.ref}"
    return Node(encode_node_id(graph), job, label=label, heavy=True, isolate=ISOLATE_STEPS)


def kernel_configs_of(app: AppSpec) -> TuningSpec | None:
    """The `[myelin] tuning` table whose `kernels` database chooses the kernel library's configs
    (cuda tables only take one; the app selects at most one table per target)."""
    return next((s for s in app.tuning if s.kernels is not None), None)


def _kernels_node(app: AppSpec, graph: GraphSpec, library: str) -> Node:
    tuned = kernel_configs_of(app)
    job = KernelsJob(
        source=Output(module_source_id(app, graph)),
        library=library,
        arch=KERNELS_CUDA_ARCH,
        toolchain=_kernels_toolchain(library),
        what=graph.ref,
        tuned=None if tuned is None or tuned.kernels is None else InputFile(tuned.kernels),
        tuned_ref=None if tuned is None else tuned.ref,
    )
    label = f"{library} kernels for {graph.ref}"
    return Node(kernels_node_id(graph, library), job, label=label, heavy=True)


def _compile_node(
    app: AppSpec,
    request: BuildRequest,
    unit: ModuleUnit,
    variant: VariantSpec,
    resume: PhaseFile | None,
) -> Node:
    writes_phases = request.dump_phases is not None or request.compile_to is not None
    devices = tuple(target_device(app, d) for d in variant.devices)
    job = CompileJob(
        source=Output(_compile_source_id(app, unit, variant)),
        devices=devices,
        requirements=tuple(device_requirements(d) for d in variant.devices),
        cancellable=app.cancellable,
        favor=app.favor,
        entrypoints=unit.entrypoints,
        arg_names={k: list(v) for k, v in unit.graph.arg_names.items()},
        module_name=unit.name if unit.shard is not None else None,
        export_only=unit.export_only,
        placement=placement_rules(app, unit),
        dump_phases=request.dump_phases is not None,
        stop_at=request.compile_to,
        resume=replace(resume, path=None) if resume is not None else None,
        # only phase files record them; a normal compile does not read them
        phase_fields=phase_fields(unit, variant, app) if writes_phases else {},
        what=f"{unit.ref} ({variant.name})",
        backend_ops=backend_ops(app, unit, variant),
        codecs_kernels=codecs_kernels_key(devices),
        **_tuning_fields(app, variant),
    )
    label = f"compile {unit.ref} for {variant.name}"
    # A spec IREE takes only process-wide (CUDA's library) must neither meet nor leave behind
    # another compile's global command line: a worker of its own (myelin.tuning.gate).
    target = job.tuning_target
    fresh = target is not None and spec_is_process_wide(target)
    return Node(
        compile_node_id(unit, variant),
        job,
        label=label,
        heavy=True,
        isolate=ISOLATE_STEPS,
        fresh_process=fresh,
    )


def tuning_spec_of(app: AppSpec, variant: VariantSpec) -> TuningSpec | None:
    """The `[myelin] tuning` spec that applies to a variant's compile nodes: the one for its
    devices' target. IREE takes one spec file per compile, for every target in it, so a variant
    that mixes targets cannot take a spec written for one of them."""
    targets = {d.target for d in variant.devices}
    specs = [spec for spec in app.tuning if spec.target in targets]
    if not specs:
        return None
    if len(targets) > 1:
        raise BuildError(
            f"variant '{variant.name}' mixes targets ({', '.join(sorted(targets))}); IREE 3.13 "
            f"applies one tuning spec to every target of a compile, so {specs[0].ref} (for "
            f"{specs[0].target}) cannot apply to it: give the variant devices of one target or "
            "remove [myelin] tuning"
        )
    return specs[0]


def _tuning_fields(app: AppSpec, variant: VariantSpec) -> dict:
    spec = tuning_spec_of(app, variant)
    if spec is None or spec.path is None:  # none, or weight layouts only (the encode node's)
        return {}
    return {
        "tuning_spec": InputFile(spec.path),
        "tuning_ref": spec.ref,
        "tuning_target": spec.target,
    }


def _compile_source_id(app: AppSpec, unit: ModuleUnit, variant: VariantSpec) -> str:
    """The IR a compile node compiles: its graph's kernels node when the variant uses a kernel
    library, else the graph's import (or encode) node."""
    library = kernels_library(variant)
    if library is not None:
        return kernels_node_id(unit.imported, library)
    return module_source_id(app, unit.imported)


def _link_job(app: AppSpec) -> LinkJob:
    graphs = []
    for graph in import_units(app):
        weights = _weights_of(graph)
        assert graph.source is not None
        graphs.append(
            ImportedGraph(
                ref=graph.ref,
                name=graph.name,
                imported=Output(import_node_id(graph)),
                encoded=Output(encode_node_id(graph)) if encodes(app, graph) else None,
                weights=WeightsSource(
                    Output(weights_node_id(weights)),
                    weights.ref,
                    weights.scope,
                    weights.name,
                    weights.source.name if weights.source else "",
                )
                if weights is not None
                else None,
                source=InputFile(graph.source),
            )
        )
    modules = tuple(
        ModuleLink(
            name=unit.name,
            ref=unit.ref,
            imported_ref=unit.imported.ref,
            imported=Output(import_node_id(unit.imported)),
            compiled=tuple(Output(compile_node_id(unit, v)) for v in app.variants),
            dynamic={k: dict(v) for k, v in unit.graph.dynamic.items()},
        )
        for unit in module_units(app)
    )
    variants = tuple(
        VariantLink(
            name=variant.name,
            devices=tuple(
                DeviceLink(
                    name=d.name,
                    target=d.target,
                    driver=d.driver,
                    options={
                        k: v
                        for k, v in (
                            ("cpu", d.cpu),
                            ("cpu_features", d.cpu_features),
                            ("data_tiling", data_tiling_of(app, d)[0]),
                            # recorded only when it is not the model's own precision
                            ("compute", _reduced(app, d)),
                            # recorded only where it changes IREE's tiles
                            ("matmul_tiles", _rows(app, d)),
                            # recorded only where it changes IREE's reductions
                            ("reductions", _vector(d)),
                            ("relayout_tiles", _whole(app, d)),
                            ("conv_batch", _images(app, d)),
                            ("arch", d.arch),
                            ("kernels", d.kernels),
                        )
                        if v
                    },
                    requires=device_requirements(d),
                    backend=Output(backend_node_id(d.backend)) if d.backend else None,
                    host_chosen=host_chosen(app, d),
                    driver_pinned=d.driver_pinned,
                )
                for d in variant.devices
            ),
            flags=tuple(app_variant_flags(app, variant)),
            module_attributes=favor_attributes(app.favor),
        )
        for variant in app.variants
    )
    profile = app.profile
    policies = {
        "residency": app.residency,
        "memory_budget": app.memory,
        "favor": app.favor,
        "profile": {"output": profile.output, "device_timing": profile.device_timing}
        if profile is not None
        else None,
    }
    return LinkJob(
        app={"name": app.name, "version": app.version},
        policies=policies,
        graphs=tuple(graphs),
        modules=modules,
        variants=variants,
        packages={
            p.name: {"version": p.version, "fingerprint": p.fingerprint} for p in app.packages
        },
        favor=app.favor,
        versions=dict(versions()),
        compile_records=tuple(o for m in modules for o in m.compiled),
    )


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
