"""The two compiler steps a graph goes through: import (target-independent) and compile
(per variant). Splitting at the `input` phase lets one imported graph feed every variant and lets
SYNaPSe cache the two steps separately.
"""

from __future__ import annotations

import os
import re
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from iree.compiler import ir

from myelin.codecs import finalize
from myelin.compiler.backend_ops import BackendCall, BackendOpRule, place_backend_ops
from myelin.compiler.cpu_attention import applies as cpu_attention_applies
from myelin.compiler.cpu_attention import decompose_cpu_attentions
from myelin.compiler.cpu_compute import demote_contractions
from myelin.compiler.cpu_convolution import rewrite_cpu_convolutions
from myelin.compiler.cpu_matmul_tiles import retile_cpu_matmuls
from myelin.compiler.cpu_max_reduction import rewrite_cpu_max_reductions
from myelin.compiler.cpu_reductions import retile_cpu_reductions
from myelin.compiler.cpu_relayout_tiles import retile_cpu_relayouts
from myelin.compiler.cuda_convolution import half_convolutions
from myelin.compiler.options import DEFAULT_MIN_PARAMETER_BYTES, variant_flags
from myelin.compiler.parameters import (
    ParameterRef,
    export_parameters,
    named_parameters,
    outline_constants,
)
from myelin.compiler.phases import PHASE_ATTRIBUTE, RESUMABLE_PHASES, PhaseFileError
from myelin.compiler.placement import (
    PLACEMENT_PHASE,
    PlacementRule,
    apply_placement,
    resolve_dispatch_affinities,
    resolve_placement,
)
from myelin.compiler.scheduling import DEFAULT_FAVOR, favor_attributes
from myelin.compiler.session import PHASES, CompilerSession
from myelin.compiler.storage_twins import add_storage_twins
from myelin.compiler.stream_analysis import STREAM_PHASE, CallFootprint, call_footprints
from myelin.compiler.targets import TargetDevice
from myelin.errors import CompileError
from myelin.signature import STORAGE_TWIN_SUFFIX, Signature, parse_abi_declaration
from myelin.tuning.gate import process_wide_spec

# The phase at which imported IR is saved. Resuming from any other phase silently miscompiles
# in IREE 3.13, so the phase travels with the saved IR (ImportedGraph.phase) and is checked.
IMPORT_PHASE = "input"
# where IREE has chosen each dispatch's tiles (myelin.compiler.cpu_matmul_tiles edits them)
CONFIGURATION_PHASE = "executable-configurations"

# Flags for the import step: it stops before any target-specific pass, but the session still
# needs a target device to be configured.
_IMPORT_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    # IREE demotes every f64 tensor to f32 by default: a float64 model would silently compute
    # in float32. Keep the precision the model asked for.
    "--iree-input-demote-f64-to-f32=false",
)


@dataclass(frozen=True)
class ImportedGraph:
    """A graph after import: IR bytecode at `phase`, plus the weights moved out of it."""

    module_bytecode: bytes
    phase: str
    parameters: tuple[ParameterRef, ...]
    exported: dict[str, bytes]  # key -> raw little-endian bytes, for constants that were inline
    functions: tuple[str, ...]
    # VM modules whose functions this graph calls (declared `func.func private @mod.fn(...)`):
    # they must be registered before it in a VM context.
    imports: tuple[str, ...] = ()


def import_graph(
    source: Path | bytes,
    *,
    input_type: str,
    module_name: str,
    scope: str,
    min_parameter_bytes: int = DEFAULT_MIN_PARAMETER_BYTES,
    what: str = "graph",
    source_name: str | None = None,
    source_root: Path | None = None,
) -> ImportedGraph:
    """Parse MLIR (a file, or text/bytecode from a frontend), lower it to the input phase and
    externalize inline weights. `input_type` is IREE's --iree-input-type (auto, stablehlo,
    torch, onnx, ...).

    Debug locations keep file names and lines (compile errors point into the model file) but
    no absolute path: files under `source_root` (the package folder) become
    `<module_name>/<path in the package>`, see `portable_locations`.
    """
    flags = [*_IMPORT_FLAGS, f"--iree-input-type={input_type}"]
    with CompilerSession(flags) as session:
        module = session.parse(source, compile_to=IMPORT_PHASE, what=what, source_name=source_name)
        with session.context:
            portable_locations(module, source_root, module_name)
            # The VM module takes the graph's name so several graphs can share one VM context.
            module.attributes["sym_name"] = ir.StringAttr.get(module_name)
            outline_constants(module, min_bytes=min_parameter_bytes)
            exported = export_parameters(module, scope=scope, min_bytes=min_parameter_bytes)
            parameters = tuple(named_parameters(module))
            functions = _public_functions(module)
            imports = _imported_modules(module)
            bytecode = _module_bytecode(module)
    return ImportedGraph(bytecode, IMPORT_PHASE, parameters, exported, functions, imports)


# Where Python's own files live, with the name that replaces each folder in a location: a
# frame inside torch reads `site-packages/torch/...` on every machine (the Diagnostic's
# library-frame test still recognises it).
def _library_roots() -> list[tuple[Path, str]]:
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]): "site-packages" for k in ("purelib", "platlib")}
    roots.update({Path(paths[k]): "python-stdlib" for k in ("stdlib", "platstdlib")})
    # Longest first: site-packages lies inside the standard library's folder on some layouts.
    return sorted(roots.items(), key=lambda item: len(item[0].parts), reverse=True)


def portable_path(filename: str, source_root: Path | None, prefix: str) -> str:
    """The name a debug location keeps for `filename`: independent of where the checkout, the
    virtual environment or a temporary folder lives.

    Relative names are kept; a file under `source_root` becomes `<prefix>/<relative path>`, one
    in Python's library folders `site-packages/...` or `python-stdlib/...`, any other absolute
    path its base name.
    """
    if not os.path.isabs(filename):
        return filename
    path = Path(filename)
    candidates: list[tuple[Path, str]] = []
    if source_root is not None:
        candidates += [(source_root, prefix), (source_root.resolve(), prefix)]
    for root, name in candidates + _library_roots():
        if path.is_relative_to(root):
            return f"{name}/{path.relative_to(root).as_posix()}"
    return path.name


def portable_locations(module: ir.Operation, source_root: Path | None, prefix: str) -> None:
    """Rewrite every file path in the module's debug locations with `portable_path`.

    Frontends record where each op came from (torch.export: the model file's stack frames) as
    absolute paths. They end up in the compiled module's debug info, while the cache key leaves
    paths out (a moved checkout stays cached): without this, the same model built in two
    folders gives two different artifacts, and a warm cache gives other bytes than a cold
    build. Must be called inside the module's context.
    """
    memo: dict[str, ir.Location] = {}

    def rewrite(loc: ir.Location) -> ir.Location:
        if isinstance(loc, ir.FileLineColLoc):
            name = portable_path(loc.filename, source_root, prefix)
            if name == loc.filename:
                return loc
            return ir.Location.file(name, loc.start_line, loc.start_col, loc.end_line, loc.end_col)
        if isinstance(loc, ir.CallSiteLoc):
            return ir.Location.callsite(rewrite(loc.callee), [rewrite(loc.caller)])
        if isinstance(loc, ir.FusedLoc):
            return ir.Location.fused([rewrite(part) for part in loc.locations], loc.metadata)
        if isinstance(loc, ir.NameLoc):
            return ir.Location.name(loc.name_str, rewrite(loc.child_loc))
        return loc

    def portable(loc: ir.Location) -> ir.Location | None:
        """The rewritten location, or None where it names no absolute path."""
        text = str(loc)
        if '"/' not in text:
            return None
        if text not in memo:
            memo[text] = rewrite(loc)
        return memo[text]

    def visit(op: ir.Operation) -> ir.WalkResult:
        new = portable(op.location)
        if new is not None:
            op.location = new
        for region in op.regions:
            for block in region.blocks:
                for argument in block.arguments:
                    new = portable(argument.location)
                    if new is not None:
                        argument.set_location(new)
        return ir.WalkResult.ADVANCE

    module.walk(visit)


def _public_functions(module: ir.Operation) -> tuple[str, ...]:
    names = []
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name not in ("util.func", "func.func"):
            continue
        attrs = op.operation.attributes
        if "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value != "public":
            continue
        names.append(ir.StringAttr(attrs["sym_name"]).value)
    return tuple(names)


def _functions(module: ir.Operation):
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name in ("util.func", "func.func"):
            yield op.operation


def _imported_modules(module: ir.Operation) -> tuple[str, ...]:
    """Modules named by external declarations `@module.function` (no body), in order."""
    names: list[str] = []
    for fn in _functions(module):
        name = ir.StringAttr(fn.attributes["sym_name"]).value
        if len(fn.regions[0].blocks) == 0 and "." in name:
            module_name = name.partition(".")[0]
            if module_name not in names:
                names.append(module_name)
    return tuple(names)


def _export_only(module: ir.Operation, functions: Sequence[str]) -> None:
    """Make every public function not in `functions` private, so the module exports only those
    (the others stay if something calls them, else dead-code elimination drops them)."""
    keep = set(functions)
    for fn in _functions(module):
        attrs = fn.attributes
        if len(fn.regions[0].blocks) == 0:
            continue  # a declaration of an import
        public = "sym_visibility" not in attrs or (
            ir.StringAttr(attrs["sym_visibility"]).value == "public"
        )
        if public and ir.StringAttr(attrs["sym_name"]).value not in keep:
            attrs["sym_visibility"] = ir.StringAttr.get("private")


def _module_bytecode(module: ir.Operation) -> bytes:
    import io

    buffer = io.BytesIO()
    module.write_bytecode(buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class CompiledModule:
    vmfb: bytes
    flags: tuple[str, ...]
    signatures: dict[str, Signature]
    warnings: tuple[str, ...]
    function_devices: dict[str, str] = field(default_factory=dict)  # exported function -> device
    # Exported function -> what a call allocates, read from the Stream IR on the way; empty with
    # `footprints_unknown` saying why when the compile did not pass the Stream phase.
    footprints: dict[str, CallFootprint] = field(default_factory=dict)
    footprints_unknown: str | None = None
    # ops placed on external backends: where each went, or why it stayed codegen
    backend_calls: tuple[BackendCall, ...] = ()
    # "scope::key" of each encoded parameter use decoded once at load into the packed layout
    # (a data-tiled variant, myelin.codecs._loadtime), in IR order
    decoded_at_load: tuple[str, ...] = ()
    # f16/bf16 convolutions a CUDA device computes with IREE's own codegen, one phrase each
    # (myelin.compiler.cuda_convolution: measured wrong on an H100)
    cuda_codegen_convolutions: tuple[str, ...] = ()


def compile_imported(
    module_bytecode: bytes,
    *,
    phase: str,
    devices: Sequence[TargetDevice],
    cancellable: bool = False,
    favor: str = DEFAULT_FAVOR,
    extra_flags: Sequence[str] = (),
    functions: Sequence[str] | None = None,
    arg_names: dict[str, Sequence[str]] | None = None,
    placement: Sequence[PlacementRule] = (),
    what: str = "module",
) -> CompiledModule:
    """Compile imported IR for one variant's devices to VM bytecode and read its signatures."""
    if phase != IMPORT_PHASE:
        raise CompileError(
            f"{what}: imported IR is at phase '{phase}', expected '{IMPORT_PHASE}'; "
            "resuming from the wrong phase would silently miscompile"
        )
    return compile_module(
        module_bytecode,
        phase=phase,
        devices=devices,
        cancellable=cancellable,
        favor=favor,
        extra_flags=extra_flags,
        functions=functions,
        arg_names=arg_names,
        placement=placement,
        what=what,
    )


def compile_module(
    source: bytes | str,
    *,
    phase: str,
    devices: Sequence[TargetDevice],
    cancellable: bool = False,
    favor: str = DEFAULT_FAVOR,
    extra_flags: Sequence[str] = (),
    functions: Sequence[str] | None = None,
    arg_names: dict[str, Sequence[str]] | None = None,
    module_name: str | None = None,
    export_only: Sequence[str] | None = None,
    stop_at: str | None = None,
    on_phase: Callable[[str, str], None] | None = None,
    placement: Sequence[PlacementRule] = (),
    what: str = "module",
    backend_ops: Sequence[BackendOpRule] = (),
) -> CompiledModule:
    """Compile IR at `phase` (bytecode or text) for one variant's devices.

    At the import phase the module may first be renamed (`module_name`, the VM module name),
    restricted to exporting `export_only`, and given the Stream partitioning of `favor`;
    `extra_flags` follow the variant's flags (e.g. a tuning spec). IR at
    any later phase must carry the `plex.phase` attribute with that phase (see
    myelin.compiler.phases): IREE would silently miscompile IR resumed from the wrong phase.

    The pipeline runs in one session, stopping only where PLeX acts between phases; the VM
    bytecode is the same as a one-shot compile's. It stops at `stream` to read each function's
    footprint (what a call allocates, how it is scheduled), so no second compile is needed for
    it. With `on_phase`, it stops after every phase and calls `on_phase(phase, text)` with the
    IR (text, with its `plex.phase` attribute). With `stop_at`, compilation ends after that
    phase and the result has no VM bytecode (`vmfb == b""`, no signatures).

    `placement` rules, `(function glob or None, device)` in order, place the module and its
    public functions on named devices (myelin.compiler.placement). With several devices the
    compile stops at the dispatch-creation phase, where PLeX's dispatch pass gives every
    dispatch its one resolved device.
    """
    if phase not in RESUMABLE_PHASES:
        raise CompileError(f"{what}: cannot compile from phase {phase!r}")
    if stop_at is not None and (
        stop_at not in RESUMABLE_PHASES or PHASES.index(stop_at) < PHASES.index(phase)
    ):
        raise CompileError(
            f"{what}: cannot stop at phase {stop_at!r}: the IR is at '{phase}' already; "
            f"phases after it: {', '.join(RESUMABLE_PHASES[RESUMABLE_PHASES.index(phase) :])}"
        )
    flags = [*variant_flags(devices, cancellable=cancellable), *extra_flags]
    backend_calls: list[BackendCall] = []
    decoded_at_load: list[str] = []
    cuda_convolutions: list[str] = []
    # IREE keeps the tuning-spec path process-wide: name it in every compile, and compile with
    # a spec on one thread (both in myelin.tuning.gate)
    with (
        process_wide_spec(flags) as (flags, applies_a_spec),
        CompilerSession(flags, threaded=not applies_a_spec) as session,
    ):
        module = session.parse(source, what=what)
        with session.context:
            _take_recorded_phase(module, phase, what)
            placed = resolve_placement(
                placement, _public_functions(module), [d.name for d in devices], what=what
            )
            if phase == IMPORT_PHASE:
                if module_name is not None:
                    module.attributes["sym_name"] = ir.StringAttr.get(module_name)
                if export_only is not None:
                    _export_only(module, export_only)
                for name, text in favor_attributes(favor).items():
                    module.attributes[name] = ir.Attribute.parse(text)
                if len(devices) > 1:  # one device: nothing to place
                    apply_placement(module, placed)
                # `f$into` twins that write results into runtime-allocated storage (DLPack out)
                if any(d.result_storage for d in devices):
                    add_storage_twins(module)
                # the codec's choices for these devices (CPU tiles, the q4 AVX2 kernel, load-time
                # decode under data tiling; q4 kernel forms left: the fused decode)
                decoded_at_load = list(finalize(module, devices).decoded_at_load)
                if backend_ops:  # calls of external backends (myelin.compiler.backend_ops)
                    host = [d.name for d in devices if d.target in ("llvm-cpu", "vmvx")]
                    backend_calls = place_backend_ops(module, backend_ops, host, what=what)
                # llvm-cpu and vulkan-spirv: attentions left become two matmuls and a softmax
                # (not IREE's fused op); llvm-cpu: 1-D convolutions gathered columns times the
                # filter (not a direct loop), under data tiling a batch of 2-D ones one image at
                # a time (each IREE's packed batch-1 case)
                if cpu_attention_applies(devices):
                    decompose_cpu_attentions(module, devices)
                if any(d.target == "cuda" for d in devices):  # what the kernels step left
                    cuda_convolutions = half_convolutions(module)
                if devices and all(d.target == "llvm-cpu" for d in devices):
                    images = all(d.data_tiling and d.conv_batch == "images" for d in devices)
                    rewrite_cpu_convolutions(module, by_image=images)
                    rewrite_cpu_max_reductions(module)  # a written-out softmax's row maxima
                # llvm-cpu `compute = "bf16"`: contraction inputs rounded to bf16, last, so
                # that the matmuls of the rewrites above are covered too
                demote_contractions(module, devices)
            elif module_name is not None or export_only is not None:
                raise CompileError(
                    f"{what}: renaming and export lists apply only to IR at phase '{IMPORT_PHASE}'"
                )
        # llvm-cpu "rows" matmul tiles: set on IREE's configs of the packed matmuls; "vector"
        # reductions: 2 x 64 vector tiles on IREE's configs of the row reductions; "whole"
        # relayout tiles: on those of the unpack -> elementwise -> pack dispatches
        retile = any(
            d.target == "llvm-cpu" and d.data_tiling and d.matmul_tiles == "rows" for d in devices
        )
        reduce = any(d.target == "llvm-cpu" and d.reductions == "vector" for d in devices)
        relayout = any(
            d.target == "llvm-cpu" and d.data_tiling and d.relayout_tiles == "whole"
            for d in devices
        )
        stops = _stops(
            phase,
            stop_at,
            every_phase=on_phase is not None,
            place=len(devices) > 1,
            configure=retile or reduce or relayout,
        )
        footprints: dict[str, CallFootprint] = {}
        current = phase
        for step in stops:
            if step != current:
                module = session.advance(module, compile_from=current, compile_to=step, what=what)
                current = step
            with session.context:
                if step == PLACEMENT_PHASE and len(devices) > 1:
                    resolve_dispatch_affinities(module, what=what)
                if step == STREAM_PHASE:
                    footprints = call_footprints(module, functions)
                if step == CONFIGURATION_PHASE and retile:
                    retile_cpu_matmuls(module)
                if step == CONFIGURATION_PHASE and reduce:
                    retile_cpu_reductions(module)
                if step == CONFIGURATION_PHASE and relayout:
                    retile_cpu_relayouts(module)
                if on_phase is not None:
                    on_phase(step, _text_with_phase(module, step, session.context))
        if stop_at is not None:
            return CompiledModule(b"", tuple(flags), {}, ())
        vmfb, diagnostics = session.compile(module, compile_from=current, what=what)
    signatures = read_signatures(vmfb, functions, arg_names or {})
    warnings = tuple(m for s, m in diagnostics.messages if s == "warning")
    devices_of = {name: placed.device_of(name, devices[0].name) for name in signatures}
    unknown = None
    if PHASES.index(phase) > PHASES.index(STREAM_PHASE):
        unknown = f"compiled from phase '{phase}', after the Stream phase it is read at"
    footprints = {name: footprints[name] for name in signatures if name in footprints}
    return CompiledModule(
        vmfb,
        tuple(flags),
        signatures,
        warnings,
        devices_of,
        footprints,
        unknown,
        backend_calls=tuple(backend_calls),
        decoded_at_load=tuple(decoded_at_load),
        cuda_codegen_convolutions=tuple(cuda_convolutions),
    )


def _stops(
    phase: str, stop_at: str | None, *, every_phase: bool, place: bool, configure: bool = False
) -> list[str]:
    """The phases, from `phase` on, where the compile pauses for PLeX: the placement pass, the
    footprint read at `stream`, the CPU matmul, reduction and relayout tiles at
    `executable-configurations` with `configure`, every phase with `every_phase`, and the last
    one with `stop_at`. The compile resumes from the last stop to the end."""
    later = RESUMABLE_PHASES[RESUMABLE_PHASES.index(phase) :]
    end = stop_at or RESUMABLE_PHASES[-1]
    wanted = set(later) if every_phase else {phase, STREAM_PHASE}
    if place:
        wanted.add(PLACEMENT_PHASE)
    if configure:
        wanted.add(CONFIGURATION_PHASE)
    if stop_at is not None:
        wanted.add(stop_at)
    stops = [p for p in later if p in wanted]
    return stops[: stops.index(end) + 1] if end in stops else stops


def _take_recorded_phase(module: ir.Operation, phase: str, what: str) -> None:
    """Check the `plex.phase` attribute against the phase we resume from, then drop it."""
    if PHASE_ATTRIBUTE not in module.attributes:
        if phase != IMPORT_PHASE:
            raise PhaseFileError(
                f"{what}: IR resumed from phase '{phase}' must carry the {PHASE_ATTRIBUTE} "
                "attribute that records its phase; IREE cannot check it and would silently "
                "miscompile IR of another phase"
            )
        return
    recorded = ir.StringAttr(module.attributes[PHASE_ATTRIBUTE]).value
    if recorded != phase:
        raise PhaseFileError(
            f"{what}: the IR records phase '{recorded}' but is being compiled from '{phase}'; "
            "IREE would silently miscompile it"
        )
    del module.attributes[PHASE_ATTRIBUTE]


# IREE 3.13 prints `#stream.partitioning_config<"max-concurrency">` as `<favor-max-concurrency>`,
# which its own parser rejects ("expected string"): phase files get the parseable spelling.
_UNPARSEABLE_FAVOR = re.compile(r"#stream\.partitioning_config<favor-([a-z-]+)>")


def _text_with_phase(module: ir.Operation, phase: str, context: ir.Context) -> str:
    """The module as text that parses back to the same IR (debug locations included, so a
    resumed compile gives the same VM bytecode), with its phase recorded as a module attribute.
    """
    with context:
        module.attributes[PHASE_ATTRIBUTE] = ir.StringAttr.get(phase)
        try:
            text = module.get_asm(enable_debug_info=True)
        finally:
            del module.attributes[PHASE_ATTRIBUTE]
    return _UNPARSEABLE_FAVOR.sub(r'#stream.partitioning_config<"\1">', text)


def read_signatures(
    vmfb: bytes, functions: Sequence[str] | None, arg_names: dict[str, Sequence[str]]
) -> dict[str, Signature]:
    """Signatures of the exported functions, from the module's reflection metadata."""
    import iree.runtime as rt

    instance = rt.VmInstance()
    module = rt.VmModule.copy_buffer(instance, vmfb)
    signatures = {}
    for name in module.function_names:
        if name.startswith("__") or name.endswith(STORAGE_TWIN_SUFFIX):
            continue
        if functions is not None and name not in functions:
            continue
        fn = module.lookup_function(name)
        declaration = fn.reflection.get("iree.abi.declaration")
        if declaration is None:
            continue
        signatures[name] = parse_abi_declaration(declaration, arg_names.get(name))
    return signatures
