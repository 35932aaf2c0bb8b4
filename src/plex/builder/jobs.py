"""Jobs: the work of every build node, as values (pure data; the plan makes them, steps run them).

Each job is a frozen dataclass whose every field enters its node's cache key (synapse.Job):
files by content (`InputFile`, `InputTree`), other nodes' outputs by their keys (`Output`), the
rest by value. A field left out of the key says why (`keyless`). Adding a field to a job adds it
to the key; there is no second list to forget. Jobs pickle, so any step can run in a worker
process or on another machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from myelin.codecs import CodecPolicy
from myelin.compiler.phases import PhaseFile
from myelin.compiler.targets import TargetDevice
from synapse import InputFile, InputTree, Job, Output, keyless


@dataclass(frozen=True)
class WeightsJob(Job):
    """Split a safetensors file into one raw file per tensor."""

    kind = "weights"
    step_module = "plex.builder.steps"
    source: InputFile
    format: str
    what: str  # "package:name", for messages


@dataclass(frozen=True)
class ImportJob(Job):
    """Frontend (torch/onnx/jax) to MLIR if needed, then IREE's input phase and weight export."""

    kind = "import"
    step_module = "plex.builder.steps"
    source: InputFile
    frontend: str
    symbol: str | None  # Python sources: the function that returns the model
    module_name: str  # the VM module name
    scope: str  # parameter scope of the graph's inline constants
    entrypoints: tuple[str, ...] | None
    dynamic: dict  # argument -> {axis -> dim name}
    min_parameter_bytes: int
    # A Python model file may import any module of its package: their contents are inputs too.
    python_sources: InputTree | None
    what: str
    host_fallback: bool = False  # ONNX nodes IREE cannot lower run in a host VM module
    max_seq: int | None = None  # causal-lm: KV cache slots per sequence
    max_batch: int | None = None  # causal-lm: sequences per call
    dtype: str | None = None  # causal-lm: compute and KV cache dtype
    prefill_lengths: tuple[int, ...] | None = None  # causal-lm: static prefill lengths


@dataclass(frozen=True)
class EncodeJob(Job):
    """Weight codecs on the imported IR and the parameter data (myelin.codecs)."""

    kind = "encode"
    step_module = "plex.builder.steps"
    imported: Output
    weights: Output | None  # the weights node, when the graph reads a weights package
    weights_scope: str | None
    policy: CodecPolicy
    codecs_format: int  # myelin.codecs.FORMAT_VERSION: a new storage format re-encodes
    what: str
    # the selected tuning specs' weight layouts (myelin.tuning.layout), (parameter glob,
    # "nk" | "kn") in order, the last match winning: applied to the parameters no codec takes
    layouts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class KernelsJob(Job):
    """Library kernels (myelin.kernels) for a graph's contractions: the kernels it needs,
    compiled for `arch`, and its input-phase IR with the matched ops rewritten to them. Writes
    what an import node writes for the compile nodes, plus the match report."""

    kind = "kernels"
    step_module = "plex.builder.steps"
    source: Output  # the import node, or the encode node when a codec applies
    library: str  # [devices.<gpu>] kernels
    arch: str  # the kernels' CUDA arch (myelin.platforms.KERNELS_CUDA_ARCH)
    toolchain: str  # the generator's version (Triton's): new code for the same source
    what: str
    # `[tuning.<name>] kernels`: the tuning database (by content) whose kernel-config entries
    # choose configs per shape, and its `package:name` (for messages)
    tuned: InputFile | None = None
    tuned_ref: str | None = None


@dataclass(frozen=True)
class CompileJob(Job):
    """Compile one module for one variant's devices, from imported IR or from a phase file.

    The memory footprint of each entrypoint is read from the Stream IR on the way (one compile).
    """

    kind = "compile"
    step_module = "plex.builder.steps"
    source: Output  # the import node, or the encode node when a codec applies
    devices: tuple[TargetDevice, ...]
    # What the runtime must find to run code compiled for each device (the host CPU's features
    # for `cpu = "host"`): part of the key, since the same flags compile other code elsewhere.
    requirements: tuple[dict, ...]
    cancellable: bool  # entrypoints take wait/signal fences (IREE's async-external ABI)
    favor: str  # [scheduling] favor: Stream partitioning
    entrypoints: tuple[str, ...] | None
    arg_names: dict  # function -> argument names
    module_name: str | None  # a shard's module name (`<graph>_<shard>`)
    export_only: tuple[str, ...] | None  # a shard that splits its graph's source
    placement: tuple[tuple[str | None, str], ...]  # (function glob or None, device), in order
    dump_phases: bool
    stop_at: str | None  # --compile-to
    resume: PhaseFile | None  # --resume-from, its path dropped (only its text and fields count)
    phase_fields: dict  # what a phase file written by this compile records in its header
    what: str
    # ops placed on external backend devices, rewritten into calls at the input phase
    # (myelin.compiler.backend_ops): (device, backend, op, min_flops) in [placement] order
    backend_ops: tuple[tuple[str, str, str, int], ...] = ()
    # myelin.codecs.kernels_key(devices): the CPU matvec kernels (and the C compiler building
    # them) that this compile links into encoded matvecs
    codecs_kernels: str = ""
    # `[myelin] tuning`: the spec file for this variant's target (by content) and its
    # `package:name` and target (for the flag that applies it, the report and the provenance)
    tuning_spec: InputFile | None = None
    tuning_ref: str | None = None
    tuning_target: str | None = None


@dataclass(frozen=True)
class BackendJob(Job):
    """Build an external backend's executable plugin with gcc (or take its prebuilt one) and
    collect the vendor libraries the .mln bundles (myelin.backends). Sources are inputs by
    content: editing one rebuilds the plugin, and the compile nodes do not depend on it."""

    kind = "backend"
    step_module = "plex.builder.backends"
    name: str
    sources: tuple[InputFile, ...]
    library: InputFile | None  # a prebuilt plugin instead of sources
    abi: tuple[InputFile, ...]  # PLeX's plugin shim and backend header (myelin/backends/abi)
    include_dirs: tuple[InputTree, ...]
    libraries: tuple[InputFile, ...]  # vendor shared libraries, by content
    library_names: tuple[str, ...]  # their file names (the plugin links them by soname)
    static_libraries: tuple[InputFile, ...]  # vendor archives linked into the plugin, by content
    cflags: tuple[str, ...]
    compiler: str  # `gcc --version`, first line: another compiler is another plugin
    ops: tuple[str, ...]
    what: str


@dataclass(frozen=True)
class WeightsSource:
    """The weights package a graph reads, as the link step needs it to bind parameters."""

    output: Output
    ref: str
    scope: str
    name: str
    file: str  # the weights file's name, for messages


@dataclass(frozen=True)
class ImportedGraph:
    """One imported graph (or shard with its own source), as the link step reads it."""

    ref: str
    name: str  # graph name, for manifest hints
    imported: Output
    encoded: Output | None
    weights: WeightsSource | None
    source: InputFile  # recorded in the provenance by digest


@dataclass(frozen=True)
class ModuleLink:
    """One VM module of the artifact: where its compiled forms are, per variant."""

    name: str
    ref: str
    imported_ref: str  # the ImportedGraph it comes from
    imported: Output  # its import node (for the functions it imports, dim names)
    compiled: tuple[Output, ...]  # per variant, in LinkJob.variants order
    dynamic: dict  # the manifest's `dynamic` of its graph


@dataclass(frozen=True)
class DeviceLink:
    name: str
    target: str
    driver: str
    options: dict  # the device's target options that were set
    requires: dict
    backend: Output | None = None  # the backend node of an external backend's device
    # options the app left unset and the build chose for the CPU it targets:
    # option -> {"value": ..., "reason": ...} (plex.builder.plan.data_tiling_of)
    host_chosen: dict = field(default_factory=dict)
    driver_pinned: bool = False  # the app named the driver (DeviceSpec.driver_pinned)


@dataclass(frozen=True)
class VariantLink:
    name: str
    devices: tuple[DeviceLink, ...]
    flags: tuple[str, ...]
    module_attributes: dict


@dataclass(frozen=True)
class LinkJob(Job):
    """Decide what only the steps' outputs can tell (module registration order, entrypoint
    names where two modules export one name, parameter binding) and write the artifact
    manifest plus the list of sections to pack."""

    kind = "link"
    step_module = "plex.builder.link"
    app: dict  # {"name", "version"}
    policies: dict
    graphs: tuple[ImportedGraph, ...]
    modules: tuple[ModuleLink, ...]
    variants: tuple[VariantLink, ...]
    packages: dict  # name -> {"version", "fingerprint"}
    favor: str
    versions: dict  # tool versions, recorded in the provenance (they are in the salt too)
    compile_records: tuple[Output, ...]  # every compile node, for recorded warnings


@dataclass(frozen=True)
class ComposeJob(Job):
    """Pack the linked manifest and sections into one .mln, atomically (not cached)."""

    kind = "compose"
    step_module = "plex.builder.compose"
    link: Output
    sections: tuple[Output, ...]  # every node whose files become sections
    strict: bool  # a decode IREE did not fuse is an error, not a warning
    output: Path = keyless("the user's destination; compose is not cached")


@dataclass(frozen=True)
class PhasesJob(Job):
    """Copy the IR phase files of every compile to a folder (or one file), not cached."""

    kind = "phases"
    step_module = "plex.builder.compose"
    compiled: tuple[tuple[str, str, Output], ...]  # (module, variant, compile node)
    single_file: bool  # --compile-to with a `.mlir` target
    target: Path = keyless("the user's destination; writing phases is not cached")
