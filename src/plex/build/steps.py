"""The work of each build node. Each step reads its inputs, writes files into its node's output
folder, and decides nothing: what to build and with which options was decided by the plan."""

from __future__ import annotations

import json
import mmap
from dataclasses import asdict
from pathlib import Path

import numpy as np

from myelin.codecs import NO_CODEC, CodecPolicy, ParameterInput, check_encoded_module, encode_graph
from myelin.compiler.parameters import ParameterRef
from myelin.compiler.phases import (
    HEADER_PREFIX,
    PhaseFile,
    phase_file_name,
    render_phase_file,
)
from myelin.compiler.pipeline import compile_module, import_graph
from myelin.compiler.placement import resolve_placement
from myelin.compiler.targets import TargetDevice
from myelin.dtypes import itemsize, numpy_dtype
from myelin.errors import CompileError
from myelin.frontends import DIRECT_INPUT_TYPES, FrontendRequest, frontend
from plex.errors import BuildError

IMPORTED_MODULE = "module.mlirbc"
IMPORT_META = "import.json"
EXPORTED_DIR = "exported"
WEIGHTS_INDEX = "weights.json"
WEIGHTS_DIR = "tensors"
COMPILED_MODULE = "module.vmfb"
COMPILE_META = "compile.json"
PHASES_DIR = "phases"


class BuildWarning(UserWarning):
    """A build step succeeded but its result may be wrong (e.g. an op IREE is known to miscompute);
    also recorded as `warnings` in the node's import.json."""


def run_import(
    out_dir: Path,
    *,
    request: FrontendRequest,
    frontend_name: str,
    min_parameter_bytes: int,
    what: str,
) -> None:
    """Frontend (torch/onnx/jax) to MLIR if needed, then IREE's input phase and weight export.

    Weights a frontend externalized and constants PLeX moved out of the IR both land in
    `exported/`, in the graph's own parameter scope.
    """
    frontend_warnings: list[str] = []
    dim_names: dict[str, dict[int, str]] = {}
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
        imported = import_graph(
            source,
            input_type=input_type,
            module_name=request.module_name,
            scope=request.scope,
            min_parameter_bytes=min_parameter_bytes,
            what=what,
            source_name=f"{request.module_name}/{request.source.name}",
        )
    except CompileError as e:
        notes = "".join(f" [frontend warning: {w}]" for w in frontend_warnings)
        raise BuildError(f"import of graph {what} failed: {e}{notes}") from e
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
    }
    (out_dir / IMPORT_META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def read_import_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / IMPORT_META).read_text())


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


# safetensors dtype -> numpy dtype name (the names myelin.dtypes uses)
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_safetensors_header(source: Path, *, what: str) -> list[dict]:
    """The tensors of a safetensors file, sorted by key: key, dtype, shape and the absolute byte
    range [begin, end), every range checked against the header and the file size."""
    try:
        size = source.stat().st_size
        with source.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= size - 8:
                raise ValueError(f"header length {length} does not fit a {size}-byte file")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as e:
        raise BuildError(f"weights {what}: cannot read {source.name}: {e}") from e
    if not isinstance(header, dict):
        raise BuildError(f"weights {what}: {source.name} has no tensor table")
    tensors = []
    for key, entry in sorted(header.items()):
        if key == "__metadata__":
            continue
        if isinstance(entry, dict) and entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' has dtype {entry.get('dtype')!r}, "
                f"which PLeX does not read (accepted: {', '.join(SAFETENSORS_DTYPES)})"
            )
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (8 + length + int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' has an unreadable entry: {e!r}"
            ) from e
        expected = itemsize(dtype) * int(np.prod(shape, dtype=np.int64))
        if end - begin != expected or begin < 8 + length or end > size:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' ({entry['dtype']}{shape}) "
                f"claims bytes [{begin}, {end}) of a {size}-byte file; the file is corrupt"
            )
        tensors.append({"key": key, "dtype": dtype, "shape": shape, "begin": begin, "end": end})
    return tensors


def run_weights(out_dir: Path, *, source: Path, what: str) -> None:
    """Split a safetensors file into one raw file per tensor (the .mln stores each as a
    page-aligned parameter section, streamed from these files).

    One tensor is in memory at a time (a codec's encode needs the whole tensor), so the step's
    temporary memory is its largest tensor: `plex.build.plan.weights_temp_bytes`, which the
    executor's memory budget (`[build] temp_memory`) schedules by. Each tensor's buffer is an
    anonymous mapping, returned to the OS as soon as the tensor is written (malloc would keep
    freed blocks of large tensors in per-thread arenas).
    """
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
        raise BuildError(f"weights {what}: cannot read {source.name}: {e}") from e
    (out_dir / WEIGHTS_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))


def read_weights_index(out_dir: Path) -> list[dict]:
    return json.loads((out_dir / WEIGHTS_INDEX).read_text())


def run_encode(
    out_dir: Path,
    *,
    imported_dir: Path,
    weights_dir: Path | None,
    weights_scope: str | None,
    policy: CodecPolicy,
    what: str,
) -> None:
    """Apply weight codecs to an imported graph (myelin.codecs). Writes what an import node
    writes (module, import.json, exported/) for the compile nodes, with `parameters` now the
    stored parts, each `exported` entry carrying its scope, and `codecs`: one record per
    parameter (codec, why, logical and stored shapes). Parameters kept as they are still come
    from the import node or the weights node."""
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
    (out_dir / IMPORTED_MODULE).write_bytes(encoded.module_bytecode)
    exported_dir = out_dir / EXPORTED_DIR
    exported_dir.mkdir()
    stored = []
    for i, tensor in enumerate(encoded.stored):
        name = f"{i:05d}.bin"
        tensor.data.tofile(exported_dir / name)
        stored.append({"scope": tensor.scope, "key": tensor.key, "file": name})
    by_key = {(p["scope"], p["key"]): p for p in meta["parameters"]}
    parameters_out = []
    for record in encoded.records:
        if record.codec == NO_CODEC:
            parameters_out.append(by_key[(record.scope, record.key)])
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
                "codec_warnings": encoded.warnings,
            },
            indent=1,
            sort_keys=True,
        )
    )


def codec_parts(meta: dict) -> dict[tuple[str, str], dict]:
    """(scope, stored key) -> {"record": parameter record, "part": part or None} of an encode
    node's meta; `part` is None for a parameter kept as it was (the record says why)."""
    parts: dict[tuple[str, str], dict] = {}
    for record in meta.get("codecs", []):
        if record["codec"] == NO_CODEC:
            parts[(record["scope"], record["key"])] = {"record": record, "part": None}
            continue
        for part in record["parts"]:
            parts[(record["scope"], part["key"])] = {"record": record, "part": part}
    return parts


def _codec_check(meta: dict, imported_dir: Path, flags: list[str], what: str) -> list[str]:
    """The no-materialization check of an encoded graph for one variant's flags: one message
    per dispatch that writes a decoded weight on its own."""
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
        return []
    found = check_encoded_module(
        (imported_dir / IMPORTED_MODULE).read_bytes(), flags, parts, sizes, what=what
    )
    return [f"graph {what}: {m.message()}" for m in found]


def run_compile(
    out_dir: Path,
    *,
    imported_dir: Path,
    devices: list[TargetDevice],
    module_attributes: dict[str, str],
    entrypoints: list[str] | None,
    arg_names: dict[str, list[str]],
    what: str,
    extra_flags: tuple[str, ...] = (),
    module_name: str | None = None,
    export_only: tuple[str, ...] | None = None,
    dump_phases: bool = False,
    stop_at: str | None = None,
    resume: PhaseFile | None = None,
    phase_fields: dict[str, str] | None = None,
    placement: list[tuple[str | None, str]] | None = None,
) -> None:
    """Compile one module for one variant: from the imported IR, or from a phase file (`resume`).

    `module_name`/`export_only` make a shard's module out of its graph's imported IR. With
    `dump_phases` or `stop_at`, the IR of each phase (or of `stop_at` alone) is written to
    `phases/` with its phase recorded (`phase_fields` go into the header); with `stop_at` no VM
    bytecode is written.
    """
    meta = read_import_meta(imported_dir)
    functions = entrypoints if entrypoints is not None else meta["functions"]
    missing = [f for f in functions if f not in meta["functions"]]
    if missing:
        raise BuildError(
            f"graph {what}: entrypoint(s) {', '.join(missing)} not found; the graph exports: "
            f"{', '.join(meta['functions']) or 'nothing'}"
        )
    phases_dir = out_dir / PHASES_DIR
    on_phase = None
    if dump_phases or stop_at is not None:
        phases_dir.mkdir()

        def on_phase(phase: str, text: str) -> None:
            if dump_phases or phase == stop_at:
                page = render_phase_file(text, {"phase": phase, **(phase_fields or {})})
                (phases_dir / phase_file_name(phase)).write_text(page, encoding="utf-8")

    try:
        placed = resolve_placement(
            placement or [], meta["functions"], [d.name for d in devices], what=what
        )
        if resume is not None:
            compiled = compile_module(
                resume.text,
                phase=resume.phase,
                devices=devices,
                extra_flags=extra_flags,
                functions=functions,
                arg_names=arg_names,
                stop_at=stop_at,
                on_phase=on_phase,
                placement=placed,
                what=what,
            )
        else:
            if meta["phase"] != "input":
                raise CompileError(f"imported IR is at phase '{meta['phase']}', not 'input'")
            compiled = compile_module(
                (imported_dir / IMPORTED_MODULE).read_bytes(),
                phase=meta["phase"],
                devices=devices,
                extra_flags=extra_flags,
                module_attributes=module_attributes,
                functions=functions,
                arg_names=arg_names,
                module_name=module_name,
                export_only=export_only,
                stop_at=stop_at,
                on_phase=on_phase,
                placement=placed,
                what=what,
            )
        codec_violations = (
            _codec_check(meta, imported_dir, list(compiled.flags), what)
            if stop_at is None and resume is None and meta.get("codecs")
            else []
        )
    except CompileError as e:
        raise BuildError(f"compile of graph {what} failed: {e}") from e
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
                "module_attributes": module_attributes,
                "signatures": signatures,
                "module": module_name or "",
                "stopped_at": stop_at,
                "devices": compiled.devices,
                "resumed_from": resume.phase if resume is not None else None,
                "functions": functions,
                "warnings": list(compiled.warnings),
                "codec_violations": codec_violations,
            },
            indent=1,
            sort_keys=True,
        )
    )


def read_compile_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / COMPILE_META).read_text())


def parameter_ref(data: dict) -> ParameterRef:
    return ParameterRef(
        scope=data["scope"],
        key=data["key"],
        dtype=data["dtype"],
        shape=tuple(data["shape"]),
        global_name=data["global_name"],
    )
