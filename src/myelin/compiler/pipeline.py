"""The two compiler steps a graph goes through: import (target-independent) and compile
(per variant). Splitting at the `input` phase lets one imported graph feed every variant and lets
SYNaPSe cache the two steps separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from iree.compiler import ir

from myelin.compiler.parameters import (
    ParameterRef,
    export_parameters,
    named_parameters,
    outline_constants,
)
from myelin.compiler.session import CompilerSession
from myelin.compiler.targets import TargetDevice, target_flags
from myelin.errors import CompileError
from myelin.signature import Signature, parse_abi_declaration

# The phase at which imported IR is saved. Resuming from any other phase silently miscompiles
# in IREE 3.13, so the phase travels with the saved IR (ImportedGraph.phase) and is checked.
IMPORT_PHASE = "input"

# Constants at least this large become parameters; smaller ones (shape constants, tiny tables)
# stay in the module where the compiler can fold them.
DEFAULT_MIN_PARAMETER_BYTES = 256

# Flags for the import step: it stops before any target-specific pass, but the session still
# needs a target device to be configured.
_IMPORT_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)


@dataclass(frozen=True)
class ImportedGraph:
    """A graph after import: IR bytecode at `phase`, plus the weights moved out of it."""

    module_bytecode: bytes
    phase: str
    parameters: tuple[ParameterRef, ...]
    exported: dict[str, bytes]  # key -> raw little-endian bytes, for constants that were inline
    functions: tuple[str, ...]


def import_graph(
    source: Path | bytes,
    *,
    input_type: str,
    module_name: str,
    scope: str,
    min_parameter_bytes: int = DEFAULT_MIN_PARAMETER_BYTES,
    what: str = "graph",
    source_name: str | None = None,
) -> ImportedGraph:
    """Parse MLIR (a file, or text/bytecode from a frontend), lower it to the input phase and
    externalize inline weights. `input_type` is IREE's --iree-input-type (auto, stablehlo,
    torch, onnx, ...)."""
    flags = [*_IMPORT_FLAGS, f"--iree-input-type={input_type}"]
    with CompilerSession(flags) as session:
        module = session.parse(source, compile_to=IMPORT_PHASE, what=what, source_name=source_name)
        with session.context:
            # The VM module takes the graph's name so several graphs can share one VM context.
            module.attributes["sym_name"] = ir.StringAttr.get(module_name)
            outline_constants(module, min_bytes=min_parameter_bytes)
            exported = export_parameters(module, scope=scope, min_bytes=min_parameter_bytes)
            parameters = tuple(named_parameters(module))
            functions = _public_functions(module)
            bytecode = _module_bytecode(module)
    return ImportedGraph(bytecode, IMPORT_PHASE, parameters, exported, functions)


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


def compile_flags(devices: Sequence[TargetDevice], extra: Sequence[str] = ()) -> list[str]:
    return [*target_flags(devices), *extra]


def compile_imported(
    module_bytecode: bytes,
    *,
    phase: str,
    devices: Sequence[TargetDevice],
    extra_flags: Sequence[str] = (),
    module_attributes: dict[str, str] | None = None,
    functions: Sequence[str] | None = None,
    arg_names: dict[str, Sequence[str]] | None = None,
    what: str = "module",
) -> CompiledModule:
    """Compile imported IR for one variant's devices to VM bytecode and read its signatures.

    `module_attributes` are set on the module before compiling: some options (Stream
    partitioning) are module attributes because the compiler C API does not register their flags.
    """
    if phase != IMPORT_PHASE:
        raise CompileError(
            f"{what}: imported IR is at phase '{phase}', expected '{IMPORT_PHASE}'; "
            "resuming from the wrong phase would silently miscompile"
        )
    flags = compile_flags(devices, extra_flags)
    with CompilerSession(flags) as session:
        module = session.parse(module_bytecode, what=what)
        if module_attributes:
            with session.context:
                for name, text in module_attributes.items():
                    module.attributes[name] = ir.Attribute.parse(text)
        vmfb, diagnostics = session.compile(module, compile_from=phase, what=what)
    signatures = read_signatures(vmfb, functions, arg_names or {})
    warnings = tuple(m for s, m in diagnostics.messages if s == "warning")
    return CompiledModule(vmfb, tuple(flags), signatures, warnings)


def read_signatures(
    vmfb: bytes, functions: Sequence[str] | None, arg_names: dict[str, Sequence[str]]
) -> dict[str, Signature]:
    """Signatures of the exported functions, from the module's reflection metadata."""
    import iree.runtime as rt

    instance = rt.VmInstance()
    module = rt.VmModule.copy_buffer(instance, vmfb)
    signatures = {}
    for name in module.function_names:
        if name.startswith("__"):
            continue
        if functions is not None and name not in functions:
            continue
        fn = module.lookup_function(name)
        declaration = fn.reflection.get("iree.abi.declaration")
        if declaration is None:
            continue
        signatures[name] = parse_abi_declaration(declaration, arg_names.get(name))
    return signatures
