"""Steps: run one job each (weights, import, encode, compile), registered with `synapse.step`.

Each step reads its job and its dependencies' records, writes files into its node's output
folder (plex.builder.records), and decides nothing: the plan made every decision.
"""

from __future__ import annotations

import errno
import json
import mmap
import tempfile
from dataclasses import asdict
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from myelin.codecs import (
    NO_CODEC,
    ParameterInput,
    check_encoded_module,
    encode_graph,
)
from myelin.compiler.index_ranges import index_ranges, input_range
from myelin.compiler.phases import HEADER_PREFIX, PHASES, phase_file_name, render_phase_file
from myelin.compiler.pipeline import CompiledModule, compile_module, import_graph
from myelin.compiler.scheduling import DEFAULT_FAVOR, favor_attributes
from myelin.compiler.targets import TargetDevice
from myelin.dtypes import numpy_dtype
from myelin.errors import CompileError
from myelin.frontends import DIRECT_INPUT_TYPES, FrontendRequest, frontend
from myelin.tuning.layout import LayoutRequest, LayoutResult, apply_layouts
from myelin.tuning.spec import CONFIG_DUMP_FLAG, count_marked, instrument_spec, spec_flag
from plex.builder.jobs import CompileJob, EncodeJob, ImportJob, KernelsJob, WeightsJob
from plex.builder.records import (
    COMPILE_META,
    COMPILED_MODULE,
    EXPORTED_DIR,
    IMPORT_META,
    IMPORTED_MODULE,
    PHASES_DIR,
    WEIGHTS_DIR,
    WEIGHTS_INDEX,
    codec_parts,
    read_import_meta,
    read_safetensors_header,
    read_weights_index,
)
from plex.errors import BuildError
from synapse import NodeContext, file_digest, step


@step(ImportJob)
def run_import(job: ImportJob, ctx: NodeContext) -> None:
    """Frontend (torch/onnx/jax) to MLIR if needed, then IREE's input phase and weight export.

    Weights a frontend externalized and constants PLeX moved out of the IR both land in
    `exported/`, in the graph's own parameter scope.
    """
    out_dir, what, frontend_name = ctx.out_dir, job.what, job.frontend
    request = FrontendRequest(
        source=job.source.path,
        symbol=job.symbol,
        module_name=job.module_name,
        scope=job.scope,
        entrypoints=job.entrypoints,
        dynamic=job.dynamic,
        host_fallback=job.host_fallback,
        max_seq=job.max_seq,
        max_batch=job.max_batch,
        dtype=job.dtype,
        prefill_lengths=job.prefill_lengths,
    )
    # the name locations carry in the module: not the build folder, so that the same model
    # builds to the same bytes anywhere; an error names the real file instead (_shown_path)
    source_name = f"{request.module_name}/{request.source.name}"
    frontend_warnings: list[str] = []
    host_nodes: tuple = ()
    dim_names: dict[str, dict[int, str]] = {}
    dim_limits: dict[str, dict[str, dict[int, list]]] = {}
    try:
        if frontend_name in DIRECT_INPUT_TYPES:
            _refuse_phase_file(request.source, what)
            source: Path | bytes = request.source
            input_type = DIRECT_INPUT_TYPES[frontend_name]
            frontend_parameters: dict = {}
        else:
            result = frontend(frontend_name)(request)
            source, input_type = result.mlir, result.input_type
            frontend_parameters = result.parameters
            # Recorded, and raised as BuildWarnings by compose on every build of the artifact,
            # cached or not: a warned-about graph never builds silently.
            frontend_warnings = list(result.warnings)
            dim_names = result.dim_names
            dim_limits = result.dim_limits
            host_nodes = result.host_nodes
        imported = import_graph(
            source,
            input_type=input_type,
            module_name=request.module_name,
            scope=request.scope,
            min_parameter_bytes=job.min_parameter_bytes,
            what=what,
            source_name=source_name,
            source_root=request.source.parent,
        )
    except CompileError as e:
        notes = "".join(f" [frontend warning: {w}]" for w in frontend_warnings)
        message = str(e)
        if frontend_name in DIRECT_INPUT_TYPES:  # its locations are lines of the user's file
            message = message.replace(f"{source_name}:", f"{_shown_path(request.source)}:")
        raise BuildError(f"import of graph {what} failed: {message}{notes}") from e
    (out_dir / IMPORTED_MODULE).write_bytes(imported.module_bytecode)
    exported_dir = out_dir / EXPORTED_DIR
    exported_dir.mkdir()
    exported = []
    values = dict(imported.exported)
    for key, array in frontend_parameters.items():
        values[key] = np.ascontiguousarray(array).tobytes()
    for i, (key, data) in enumerate(sorted(values.items())):
        name = f"{i:05d}.bin"
        (exported_dir / name).write_bytes(data)
        exported.append({"key": key, "file": name})
    meta = {
        "phase": imported.phase,
        "functions": list(imported.functions),
        "parameters": [asdict(p) for p in imported.parameters],
        "exported": exported,
        "exported_scope": request.scope,
        "imports": list(imported.imports),
        "warnings": frontend_warnings,
        # JSON keys are strings: {"image": {"0": "N"}}
        "dim_names": dim_names,
        # function -> input -> {axis: [largest size, why]} the source bounds (JSON keys: strings)
        "dim_limits": dim_limits,
        # host fallback: one-node ONNX models the runtime's host module runs (host/<fn>.onnx)
        "host_nodes": _write_host_nodes(out_dir, host_nodes),
    }
    (out_dir / IMPORT_META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def _shown_path(path: Path) -> str:
    """`path` as a user finds it: relative to the working folder when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _write_host_nodes(out_dir: Path, host_nodes: tuple) -> list[dict]:
    records = []
    if host_nodes:
        (out_dir / "host").mkdir()
    for node in host_nodes:
        (out_dir / "host" / f"{node.function}.onnx").write_bytes(node.model)
        records.append({**node.to_json(), "file": f"host/{node.function}.onnx"})
    return records


def _refuse_phase_file(source: Path, what: str) -> None:
    """IR saved at a later phase, given as a graph source, would go through the input pipeline
    again and silently miscompile; it must be resumed from its recorded phase instead."""
    try:
        with source.open("rb") as f:
            head = f.read(len(HEADER_PREFIX) + 16)
    except OSError:
        return  # the import reports unreadable sources
    if head.startswith(HEADER_PREFIX.encode()):
        raise BuildError(
            f"graph {what}: {source.name} is IR saved by plex build at a later compile phase; "
            f"resume from it with `plex build --resume-from {source.name}`, and keep the graph's "
            "source pointing at the original model"
        )


@step(WeightsJob)
def run_weights(job: WeightsJob, ctx: NodeContext) -> None:
    """Split a safetensors file into one raw file per tensor (the .mln stores each as a
    page-aligned parameter section, streamed from these files).

    One tensor is in memory at a time (a codec's encode needs the whole tensor), so the step's
    temporary memory is its largest tensor: `plex.builder.plan.weights_temp_bytes`, which the
    executor's memory budget (`[build] temp_memory`) schedules by. Each tensor's buffer is an
    anonymous mapping, returned to the OS as soon as the tensor is written (malloc would keep
    freed blocks of large tensors in per-thread arenas).
    """
    out_dir, source, what = ctx.out_dir, job.source.path, job.what
    tensors_dir = out_dir / WEIGHTS_DIR
    tensors_dir.mkdir()
    index = []
    try:
        with source.open("rb") as f:
            for i, tensor in enumerate(read_safetensors_header(source, what=what)):
                name = f"{i:05d}.bin"
                size = tensor["end"] - tensor["begin"]
                with (
                    mmap.mmap(-1, max(size, 1)) as buffer,
                    memoryview(buffer)[:size] as data,
                    open(tensors_dir / name, "wb") as out,
                ):
                    f.seek(tensor["begin"])
                    if f.readinto(data) != size:
                        raise OSError(f"tensor '{tensor['key']}' is cut short")
                    out.write(data)
                index.append(
                    {
                        "key": tensor["key"],
                        "dtype": tensor["dtype"],
                        "shape": tensor["shape"],
                        "file": name,
                    }
                )
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the output's disk is full, not the source unreadable: SYNaPSe says where
        raise BuildError(f"weights {what}: cannot read {source.name}: {e}") from e
    (out_dir / WEIGHTS_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))


@step(EncodeJob)
def run_encode(job: EncodeJob, ctx: NodeContext) -> None:
    """Apply weight codecs to an imported graph (myelin.codecs). Writes what an import node
    writes (module, import.json, exported/) for the compile nodes, with `parameters` now the
    stored parts, each `exported` entry carrying its scope, and `codecs`: one record per
    parameter (codec, why, logical and stored shapes). Weight layouts (`job.layouts`) then
    re-lay-out parameters no codec took: their data is written here transposed and
    `weight_layouts` records each. Parameters kept as they are still come from the import node
    or the weights node."""
    out_dir, what, policy, weights_scope = ctx.out_dir, job.what, job.policy, job.weights_scope
    imported_dir = ctx.output(job.imported)
    weights_dir = ctx.output(job.weights) if job.weights is not None else None
    meta = read_import_meta(imported_dir)
    exported = {e["key"]: imported_dir / EXPORTED_DIR / e["file"] for e in meta["exported"]}
    tensors = (
        {t["key"]: t for t in read_weights_index(weights_dir)} if weights_dir is not None else {}
    )

    def load_value(p: ParameterInput) -> np.ndarray | None:
        if p.scope == meta["exported_scope"] and p.key in exported:
            path = exported[p.key]
        elif p.scope == weights_scope and p.key in tensors:
            t = tensors[p.key]
            if t["dtype"] != p.dtype or list(t["shape"]) != list(p.shape):
                return None  # compose reports the mismatch
            assert weights_dir is not None
            path = weights_dir / WEIGHTS_DIR / t["file"]
        else:
            return None
        return np.fromfile(path, dtype=numpy_dtype(p.dtype)).reshape(p.shape)

    parameters = [
        ParameterInput(p["scope"], p["key"], p["dtype"], tuple(p["shape"]), p["global_name"])
        for p in meta["parameters"]
    ]
    try:
        encoded = encode_graph(
            (imported_dir / IMPORTED_MODULE).read_bytes(),
            parameters,
            load_value,
            policy,
            what=what,
        )
    except CompileError as e:
        raise BuildError(f"encoding the weights of graph {what} failed: {e}") from e
    module_bytecode, laid_out, layout_warnings = _weight_layouts(
        job, encoded.module_bytecode, encoded.records, parameters, what
    )
    (out_dir / IMPORTED_MODULE).write_bytes(module_bytecode)
    exported_dir = out_dir / EXPORTED_DIR
    exported_dir.mkdir()
    stored = []
    tensors_out = [(t.scope, t.key, t.data) for t in encoded.stored]
    for p, result in laid_out:  # the data in its stored axis order
        value = load_value(p)
        if value is not None:
            stored_data = np.ascontiguousarray(value.transpose(result.order))
            tensors_out.append((p.scope, p.key, stored_data))
    for i, (scope, key, data) in enumerate(tensors_out):
        name = f"{i:05d}.bin"
        data.tofile(exported_dir / name)
        stored.append({"scope": scope, "key": key, "file": name})
    by_key = {(p["scope"], p["key"]): p for p in meta["parameters"]}
    stored_shapes = {(p.scope, p.key): list(r.stored_shape(p.shape)) for p, r in laid_out}
    parameters_out = []
    for record in encoded.records:
        if record.codec == NO_CODEC:
            kept = by_key[(record.scope, record.key)]
            shape = stored_shapes.get((record.scope, record.key))
            parameters_out.append(kept if shape is None else {**kept, "shape": shape})
            continue
        for part in record.parts:  # byte-exact dtype and shape, for compose's size check
            dtype, shape = part["dtype"], list(part["shape"])
            if dtype == "uint4":
                dtype, shape = "uint8", [*shape[:-1], shape[-1] // 2]
            parameters_out.append(
                {
                    "scope": record.scope,
                    "key": part["key"],
                    "dtype": dtype,
                    "shape": shape,
                    "global_name": "",
                }
            )
    (out_dir / IMPORT_META).write_text(
        json.dumps(
            {
                **meta,
                "parameters": parameters_out,
                "exported": stored,
                "codecs": [r.to_json() for r in encoded.records],
                "codec_policy": policy.to_json(),
                "codec_warnings": [*encoded.warnings, *layout_warnings],
                # (scope, key) -> the stored layout, for the .mln's parameter records
                "weight_layouts": [
                    {**r.to_json(), "logical_shape": list(p.shape)} for p, r in laid_out
                ],
                "weight_layouts_unmatched": _unmatched_layouts(job, encoded.records),
            },
            indent=1,
            sort_keys=True,
        )
    )


def _weight_layouts(
    job: EncodeJob,
    module_bytecode: bytes,
    records: list,
    parameters: list[ParameterInput],
    what: str,
) -> tuple[bytes, list[tuple[ParameterInput, LayoutResult]], list[str]]:
    """Apply the job's weight layouts (myelin.tuning.layout) to the parameters no codec took:
    the rewritten IR, the parameters re-laid-out with their result, and one warning per rule
    that changed nothing (a layout that silently does nothing is a tuning that did not apply)."""
    if not job.layouts:
        return module_bytecode, [], []
    by_key = {(p.scope, p.key): p for p in parameters}
    requests, codec_of = [], {}
    for record in records:
        layout = _layout_for(record.scope, record.key, job.layouts)
        if layout is None:
            continue
        if record.codec != NO_CODEC:
            codec_of[(record.scope, record.key)] = record.codec
            continue
        p = by_key[(record.scope, record.key)]
        requests.append(LayoutRequest(p.global_name, p.scope, p.key, p.shape, layout))
    warnings = [
        f"weight layout not applied to {scope}::{key}: it has codec {codec}, which stores it "
        "in its consumer's order already"
        for (scope, key), codec in codec_of.items()
    ]
    if not requests:
        return module_bytecode, [], warnings
    try:
        module_bytecode, results = apply_layouts(module_bytecode, requests, what=what)
    except CompileError as e:
        raise BuildError(f"weight layouts of graph {what} failed: {e}") from e
    laid_out = []
    for request, result in zip(requests, results, strict=True):
        if result.order:
            laid_out.append((by_key[(request.scope, request.key)], result))
        elif not result.reason.startswith("already stored"):
            warnings.append(
                f"weight layout {request.layout} not applied to {request.scope}::{request.key}: "
                f"{result.reason}"
            )
    return module_bytecode, laid_out, warnings


def _unmatched_layouts(job: EncodeJob, records: list) -> list[str]:
    """The layout globs that name no parameter of this graph; the link step warns about those
    that name no parameter of any graph (a glob is meant for some graph of the app)."""
    return [
        pattern
        for pattern, _ in job.layouts
        if not any(fnmatchcase(n, pattern) for r in records for n in (f"{r.scope}::{r.key}", r.key))
    ]


def _layout_for(scope: str, key: str, rules: tuple[tuple[str, str], ...]) -> str | None:
    """The layout the last rule matching `scope::key` or `key` chooses, or None."""
    names = (f"{scope}::{key}", key)
    found = [layout for pattern, layout in rules if any(fnmatchcase(n, pattern) for n in names)]
    return found[-1] if found else None


@step(KernelsJob)
def run_kernels(job: KernelsJob, ctx: NodeContext) -> None:
    """Library kernels for one graph (myelin.kernels): writes the source node's `import.json`
    with `kernel_sites` added (every matmul: where, shape, its kernel or why none) and the
    rewritten IR. Parameters stay where the source node has them (link reads them there)."""
    from myelin.kernels import apply_kernels, tuned_configs

    source_dir = ctx.output(job.source)
    meta = read_import_meta(source_dir)
    tuned = {}
    if job.tuned is not None:
        try:
            tuned = tuned_configs(job.tuned.path.read_text(), job.arch, what=str(job.tuned.path))
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            raise BuildError(
                f"kernel configs of {job.tuned_ref}: {e}; fix the file or run plex tune again"
            ) from e
    try:
        result = apply_kernels(
            (source_dir / IMPORTED_MODULE).read_bytes(),
            library=job.library,
            arch=job.arch,
            what=job.what,
            tuned=tuned,
        )
    except CompileError as e:
        raise BuildError(f"{job.library} kernels for graph {job.what} failed: {e}") from e
    (ctx.out_dir / IMPORTED_MODULE).write_bytes(result.module_bytecode)
    meta = {k: v for k, v in meta.items() if k != "exported"}  # its files are the source's
    meta.update(kernel_sites=list(result.sites), kernels=list(result.kernels))
    (ctx.out_dir / IMPORT_META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def _codec_check(
    meta: dict, imported_dir: Path, flags: list[str], what: str, devices: tuple[TargetDevice, ...]
) -> tuple[list[str], list[str]]:
    """The no-materialization check of an encoded graph for one variant (its flags and
    devices): one message per dispatch that writes a decoded weight on its own, and
    ("scope::key") the parameters decoded at load into data tiling's packed layout, as
    data-tiled variants do by design (myelin.codecs.finalize)."""
    parts = {
        key: f"{v['record']['scope']}::{v['record']['key']}"
        for key, v in codec_parts(meta).items()
        if v["part"] is not None
    }
    sizes = {
        f"{r['scope']}::{r['key']}": int(np.prod(r["shape"], dtype=np.int64))
        for r in meta.get("codecs", [])
        if r["codec"] != NO_CODEC
    }
    if not parts:
        return [], []
    found = check_encoded_module(
        (imported_dir / IMPORTED_MODULE).read_bytes(),
        flags,
        parts,
        sizes,
        devices=devices,
        what=what,
    )
    at_load = sorted({p for m in found if m.at_load for p in m.parameters})
    return [f"graph {what}: {m.message()}" for m in found if not m.at_load], at_load


@step(CompileJob)
def run_compile(job: CompileJob, ctx: NodeContext) -> None:
    """Compile one module for one variant: from the imported IR, or from a phase file (`resume`).

    `module_name`/`export_only` make a shard's module out of its graph's imported IR. With
    `dump_phases` or `stop_at`, the IR of each phase (or of `stop_at` alone) is written to
    `phases/` with its phase recorded (`phase_fields` go into the header); with `stop_at` no VM
    bytecode is written. The footprint of each entrypoint (what a call allocates) is recorded
    from the same compile's Stream IR.
    """
    out_dir, what, resume, stop_at = ctx.out_dir, job.what, job.resume, job.stop_at
    imported_dir = ctx.output(job.source)
    meta = read_import_meta(imported_dir)
    functions = list(job.entrypoints) if job.entrypoints is not None else meta["functions"]
    missing = [f for f in functions if f not in meta["functions"]]
    if missing:
        raise BuildError(
            f"graph {what}: entrypoint(s) {', '.join(missing)} not found; the graph exports: "
            f"{', '.join(meta['functions']) or 'nothing'}"
        )
    phases_dir = out_dir / PHASES_DIR
    on_phase = None
    if job.dump_phases or stop_at is not None:
        phases_dir.mkdir()

        def on_phase(phase: str, text: str) -> None:
            if job.dump_phases or phase == stop_at:
                page = render_phase_file(text, {"phase": phase, **job.phase_fields})
                (phases_dir / phase_file_name(phase)).write_text(page, encoding="utf-8")

    tuning_dir = tempfile.TemporaryDirectory(prefix="plex-tuning-")
    try:
        if resume is None and meta["phase"] != "input":
            raise CompileError(f"imported IR is at phase '{meta['phase']}', not 'input'")
        extra_flags, instrumented = _tuning_flags(job, Path(tuning_dir.name))
        compiled = compile_module(
            resume.text if resume is not None else (imported_dir / IMPORTED_MODULE).read_bytes(),
            phase=resume.phase if resume is not None else meta["phase"],
            devices=job.devices,
            cancellable=job.cancellable,
            favor=job.favor if resume is None else DEFAULT_FAVOR,  # a phase file has its own
            functions=functions,
            arg_names=job.arg_names,
            module_name=job.module_name if resume is None else None,
            export_only=job.export_only if resume is None else None,
            stop_at=stop_at,
            on_phase=on_phase,
            placement=job.placement,
            backend_ops=job.backend_ops,
            extra_flags=extra_flags,
            what=what,
        )
        tuning = _tuning_record(job, Path(tuning_dir.name), instrumented, stop_at)
        codec_violations, codecs_at_load = (
            _codec_check(
                meta,
                imported_dir,
                list(compiled.flags),
                what,
                job.devices,
            )
            if stop_at is None and resume is None and meta.get("codecs")
            else ([], [])
        )
    except CompileError as e:
        raise BuildError(f"compile of graph {what} failed: {e}") from e
    finally:
        tuning_dir.cleanup()
    if stop_at is None:
        (out_dir / COMPILED_MODULE).write_bytes(compiled.vmfb)
    signatures = {
        name: {
            "inputs": [t.to_json() for t in sig.inputs],
            "outputs": [t.to_json() for t in sig.outputs],
        }
        for name, sig in compiled.signatures.items()
    }
    (out_dir / COMPILE_META).write_text(
        json.dumps(
            {
                "flags": list(compiled.flags),
                "module_attributes": favor_attributes(job.favor),
                "signatures": signatures,
                "footprints": _footprints(job, compiled, functions),
                "module": job.module_name or "",
                "stopped_at": stop_at,
                "function_devices": compiled.function_devices,
                "resumed_from": resume.phase if resume is not None else None,
                "functions": functions,
                "warnings": list(compiled.warnings),
                "kernel_sites": meta.get("kernel_sites", []),
                "cuda_codegen_convolutions": list(compiled.cuda_codegen_convolutions),
                "codec_violations": codec_violations,
                "codecs_at_load": codecs_at_load,
                "backend_calls": [c.to_json() for c in compiled.backend_calls],
                "index_ranges": _index_ranges(job, compiled, imported_dir, functions, what),
                "tuning": tuning,
            },
            indent=1,
            sort_keys=True,
        )
    )


def _tuning_flags(job: CompileJob, work: Path) -> tuple[list[str], int]:
    """The flags applying the job's tuning spec (myelin.tuning.spec_flag: the one its target
    honours) plus a configuration dump to count what it matched; and how many configs the
    spec sets (PLeX marks each, so the dump shows which ops took one)."""
    if job.tuning_spec is None:
        return [], 0
    assert job.tuning_target is not None
    text, instrumented = instrument_spec(job.tuning_spec.path.read_text(encoding="utf-8"))
    spec = work / "spec.mlir"
    spec.write_text(text, encoding="utf-8")
    dump = work / "configurations"
    return [spec_flag(job.tuning_target, spec), f"{CONFIG_DUMP_FLAG}={dump}"], instrumented


def _tuning_record(job: CompileJob, work: Path, instrumented: int, stop_at: str | None) -> dict:
    """What the spec did to this module: ops configured per dispatch, and a warning when it
    configured none (a spec that silently matches nothing is the usual tuning failure)."""
    if job.tuning_spec is None:
        return {}
    matched = count_marked(work / "configurations")
    record: dict = {
        "spec": job.tuning_ref,
        "target": job.tuning_target,
        "sha256": file_digest(job.tuning_spec.path),
        "matched_ops": sum(matched.values()) if instrumented else None,
        "dispatches": matched,
        "warning": None,
    }
    configured_at = PHASES.index("executable-configurations")
    configured = stop_at is None or PHASES.index(stop_at) >= configured_at
    if not instrumented:
        record["warning"] = (
            f"tuning spec {job.tuning_ref}: sets no compilation_info that PLeX can count; it "
            "was applied, but how many ops it matched is unknown"
        )
    elif configured and not matched:
        record["warning"] = (
            f"tuning spec {job.tuning_ref} matched no op of {job.what}: check its matchers "
            "(types, indexing maps, dims_equal sizes; a dynamic size never equals a number)"
        )
    return record


def _index_ranges(
    job: CompileJob, compiled: CompiledModule, imported_dir: Path, functions: list[str], what: str
) -> dict:
    """Entrypoint -> `ranges` (per input, the [lo, hi) its values must lie in because they index
    a table, or None), `limits` (per input and axis, None or [largest size, why] of a dynamic
    dim whose positions index a table) and `unchecked` (indices the runtime cannot check at the
    boundary), from
    the imported IR (myelin.compiler.index_ranges); the link step writes them into the .mln."""
    if job.resume is not None or job.stop_at is not None:
        why = "resumed from a phase file: indices were not analysed"
        return {fn: {"ranges": [], "unchecked": [why]} for fn in functions}
    try:
        found = index_ranges((imported_dir / IMPORTED_MODULE).read_bytes(), functions, what=what)
    except CompileError as e:
        raise BuildError(f"index analysis of graph {what} failed: {e}") from e
    records = {}
    for fn in functions:
        result = found.get(fn)
        inputs = compiled.signatures[fn].inputs if fn in compiled.signatures else ()
        ranges: list[list[int] | None] = []
        unchecked = list(result.unchecked) if result is not None else []
        for position, spec in enumerate(inputs):
            valid = result.valid.get(position) if result is not None else None
            if valid is None:
                ranges.append(None)
                continue
            try:
                bounds = input_range(valid, result.widths[position], spec.dtype)
            except ValueError as e:
                unchecked.append(f"input '{spec.name}': {e}")
                bounds = None
            ranges.append(list(bounds) if bounds is not None else None)
        limits = [
            [
                list(result.dim_bounds[(position, axis)])
                if result is not None and (position, axis) in result.dim_bounds
                else None
                for axis in range(len(spec.shape or ()))
            ]
            for position, spec in enumerate(inputs)
        ]
        records[fn] = {"ranges": ranges, "unchecked": unchecked, "limits": limits}
    return records


def _footprints(job: CompileJob, compiled: CompiledModule, functions: list[str]) -> dict:
    """Entrypoint -> its recorded footprint (the `memory` field of the .mln), or why unknown, so
    that a memory budget refuses rather than guesses."""
    why = compiled.footprints_unknown
    if job.resume is not None and why is None:
        why = f"resumed from an edited '{job.resume.phase}' phase file"
    if why is None and len(job.devices) > 1:
        why = "memory plans of multi-device variants are not derived yet"
    return {
        fn: {"unknown": why}
        if why is not None or fn not in compiled.footprints
        else compiled.footprints[fn].to_json()
        for fn in functions
    }
