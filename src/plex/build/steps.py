"""The work of each build node. Each step reads its inputs, writes files into its node's output
folder, and decides nothing: what to build and with which options was decided by the plan."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from myelin.compiler.parameters import ParameterRef
from myelin.compiler.pipeline import compile_imported, import_graph
from myelin.compiler.targets import TargetDevice
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


def run_import(
    out_dir: Path, *, request: FrontendRequest, frontend_name: str,
    min_parameter_bytes: int, what: str,
) -> None:
    """Frontend (torch/onnx/jax) to MLIR if needed, then IREE's input phase and weight export.

    Weights a frontend externalized and constants PLeX moved out of the IR both land in
    `exported/`, in the graph's own parameter scope.
    """
    try:
        if frontend_name in DIRECT_INPUT_TYPES:
            source: Path | bytes = request.source
            input_type = DIRECT_INPUT_TYPES[frontend_name]
            frontend_parameters: dict = {}
        else:
            result = frontend(frontend_name)(request)
            source, input_type = result.mlir, result.input_type
            frontend_parameters = result.parameters
        imported = import_graph(
            source, input_type=input_type, module_name=request.module_name,
            scope=request.scope, min_parameter_bytes=min_parameter_bytes, what=what,
            source_name=f"{request.module_name}/{request.source.name}",
        )
    except CompileError as e:
        raise BuildError(f"import of graph {what} failed: {e}") from e
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
    }
    (out_dir / IMPORT_META).write_text(json.dumps(meta, indent=1, sort_keys=True))


def read_import_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / IMPORT_META).read_text())


def run_weights(out_dir: Path, *, source: Path, what: str) -> None:
    """Split a safetensors file into one raw file per tensor (the .mln stores each as a
    page-aligned parameter section, streamed from these files)."""
    from safetensors import SafetensorError, safe_open

    tensors_dir = out_dir / WEIGHTS_DIR
    tensors_dir.mkdir()
    index = []
    try:
        with safe_open(str(source), framework="numpy") as f:
            for i, key in enumerate(sorted(f.keys())):
                array = f.get_tensor(key)
                name = f"{i:05d}.bin"
                array.tofile(tensors_dir / name)
                index.append(
                    {"key": key, "dtype": str(array.dtype), "shape": list(array.shape),
                     "file": name}
                )
    except (SafetensorError, OSError, TypeError, ValueError) as e:
        raise BuildError(f"weights {what}: cannot read {source.name}: {e}") from e
    (out_dir / WEIGHTS_INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))


def read_weights_index(out_dir: Path) -> list[dict]:
    return json.loads((out_dir / WEIGHTS_INDEX).read_text())


def run_compile(
    out_dir: Path, *, imported_dir: Path, devices: list[TargetDevice],
    module_attributes: dict[str, str], entrypoints: list[str] | None,
    arg_names: dict[str, list[str]], what: str,
) -> None:
    meta = read_import_meta(imported_dir)
    functions = entrypoints if entrypoints is not None else meta["functions"]
    missing = [f for f in functions if f not in meta["functions"]]
    if missing:
        raise BuildError(
            f"graph {what}: entrypoint(s) {', '.join(missing)} not found; the graph exports: "
            f"{', '.join(meta['functions']) or 'nothing'}"
        )
    try:
        compiled = compile_imported(
            (imported_dir / IMPORTED_MODULE).read_bytes(),
            phase=meta["phase"], devices=devices, module_attributes=module_attributes,
            functions=functions, arg_names=arg_names, what=what,
        )
    except CompileError as e:
        raise BuildError(f"compile of graph {what} failed: {e}") from e
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
            {"flags": list(compiled.flags), "module_attributes": module_attributes,
             "signatures": signatures,
             "functions": functions, "warnings": list(compiled.warnings)},
            indent=1, sort_keys=True,
        )
    )


def read_compile_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / COMPILE_META).read_text())


def parameter_ref(data: dict) -> ParameterRef:
    return ParameterRef(
        scope=data["scope"], key=data["key"], dtype=data["dtype"],
        shape=tuple(data["shape"]), global_name=data["global_name"],
    )
