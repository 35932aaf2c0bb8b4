"""PyTorch frontend: a Python function that returns a model becomes torch-dialect MLIR whose
weights are named parameters, through iree-turbine's AOT export.

Steps, per entrypoint: torch.export (non-strict, with the manifest's dynamic dims) -> our
decomposition table -> the float-scalar comparison rewrite; then one turbine import of all
entrypoints together, so that a tensor two entrypoints share (prefill and decode reading the same
weights) becomes one `util.global` and one parameter. Weights are bound to
`#flow.parameter.named<request.scope::fqn>`, never inlined. Finally the torch dialect is lowered
to linalg here (see _torch_lowering for why not by IREE's torch input type), so that an op IREE
cannot lower is reported in one line naming the op and the user's source line.
"""

from __future__ import annotations

import io
import re
import threading
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from iree.compiler import ir
from iree.turbine import aot
from iree.turbine.aot.compiled_module import ExportTargetDef
from iree.turbine.aot.decompositions import extend_aot_decompositions
from iree.turbine.aot.fx_programs import FxPrograms, FxProgramsBuilder
from iree.turbine.aot.tensor_traits import ExternalTensorTrait

from myelin.compiler.parameters import named_parameters
from myelin.compiler.session import CompilerSession
from myelin.errors import CompileError
from myelin.frontends import FrontendRequest, FrontendResult
from myelin.frontends._torch_fixes import (
    constant_attention_masks,
    decomposition_table,
    eager_attention_as_sdpa,
    float_scalar_comparisons,
    lowering_failure,
)
from myelin.frontends._torch_lowering import LOWERED_INPUT_TYPE, lower_torch
from myelin.frontends._torch_source import (
    Entry,
    call_source,
    entries,
    imported_source,
    one_line,
    user_line,
    where,
)

# torch.export, sys.path and sys.modules are process-global: one torch export at a time, even
# when the build runs several import nodes in threads.
_EXPORT_LOCK = threading.Lock()

# torch.export's message when a dim marked Dim.DYNAMIC is fixed by the model
_SPECIALIZED = re.compile(
    r"L\[(?P<where>[^\n]*?)\]\.size\(\)\[(?P<axis>\d+)\] as dynamic but your code "
    r"specialized it to be a constant \((?P<size>-?\d+)\)"
)

# A compiler session only hosts the passes here; the target is never used.
_SESSION_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)


def to_mlir(request: FrontendRequest) -> FrontendResult:
    if request.symbol is None:
        raise CompileError(
            f"the torch frontend needs a Python source 'file.py:function', got {request.source}"
        )
    what = where(request.source, request.symbol)
    notes: list[str] = []
    with _EXPORT_LOCK, _quiet_export_warnings(), imported_source(request.source) as module:
        value = call_source(module, request.source, request.symbol)
        found = entries(value, what=what, entrypoints=request.entrypoints)
        _check_dynamic_args(found, request.dynamic, what)
        notes += _caches_off(found)
        found = [_widened(e, _dims_for(e, request.dynamic), notes) for e in found]
        programs = {e.name: _export(e, request, what) for e in found}
        wrapped = {
            e.name
            for e in found
            if not isinstance(e.target, torch.nn.Module | torch.export.ExportedProgram)
        }
        tensors = _externalize(programs, wrapped, request.scope, what)
        torch_mlir = _import(programs)
        names = {
            name: (
                [_abi_name(n) for n in p.graph_signature.user_inputs],
                [_abi_name(n) for n in output_names(p)],
            )
            for name, p in programs.items()
        }
    mlir, keys = _lower(torch_mlir, programs, names, request, what)
    return FrontendResult(
        mlir=mlir,
        input_type=LOWERED_INPUT_TYPE,
        parameters=_values(keys, tensors, request, what),
        warnings=notes,
        dim_limits={name: _derived_limits(p) for name, p in programs.items()},
    )


def _derived_limits(program: torch.export.ExportedProgram) -> dict[str, dict[int, list]]:
    """Input name -> {axis -> [largest size, why]} for dynamic dims whose range torch.export
    bounded above while tracing (BERT's positions: `seq <= 512`, from slicing a 512-row buffer):
    the graph is valid only there."""
    from torch.utils._sympy.numbers import int_oo

    limits: dict[str, dict[int, list]] = {}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name in program.graph_signature.user_inputs:
        value = placeholders[name].meta.get("val") if name in placeholders else None
        for axis, size in enumerate(getattr(value, "shape", ())):
            if not isinstance(size, torch.SymInt):
                continue
            bounds = program.range_constraints.get(size.node.expr)
            if bounds is None or bounds.upper == int_oo:
                continue
            limits.setdefault(_abi_name(name), {})[axis] = [
                int(bounds.upper),
                "torch.export found that the model supports no larger size (while tracing it)",
            ]
    return limits


class _quiet_export_warnings(warnings.catch_warnings):
    """Silence the two warnings every export prints (both harmless; named below)."""

    def __enter__(self) -> None:
        super().__enter__()
        warnings.filterwarnings("ignore", message="When strict_export == False")
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")


# -- dynamic dims ---------------------------------------------------------------------------------


def _check_dynamic_args(
    found: list[Entry], dynamic: Mapping[str, Mapping[int, str]], what: str
) -> None:
    """Every `dynamic` key must name an argument the example gives: `arg` (any entrypoint) or
    `entry.arg`. An argument the function has but the example leaves out keeps its default and
    is no input, so it cannot have dynamic dims."""
    used, known = set(), set()
    for e in found:
        for name in e.used_args():
            used.update((name, f"{e.name}.{name}"))
        for name in e.arg_names() or ():
            known.update((name, f"{e.name}.{name}"))
    for key in dynamic:
        if key in used:
            continue
        if key in known:
            raise CompileError(
                f"{what}: dynamic names argument {key!r}, which the example inputs do not give "
                f"(they give {', '.join(sorted(k for k in used if '.' not in k)) or 'none'}); "
                "add it to the example, or drop it from `dynamic`"
            )
        raise CompileError(
            f"{what}: dynamic names argument {key!r}, which no entrypoint has; arguments: "
            f"{', '.join(sorted(k for k in known if '.' not in k)) or 'none'}"
        )


def _dims_for(entry: Entry, dynamic: Mapping[str, Mapping[int, str]]) -> dict[str, dict[int, str]]:
    """arg name -> {dim index -> dim name} for one entrypoint (`entry.arg` overrides `arg`)."""
    out: dict[str, dict[int, str]] = {}
    for arg in entry.used_args():
        dims = {**dynamic.get(arg, {}), **dynamic.get(f"{entry.name}.{arg}", {})}
        if dims:
            out[arg] = {int(i): n for i, n in dims.items()}
    return out


def _caches_off(found: list[Entry]) -> list[str]:
    """Turn off a Hugging Face model's key/value cache (`config.use_cache`) for the export.

    With it on, the model returns a `DynamicCache`, which is no tensor and fails the export. A
    graph of one call has no use for it; a model that does want a cache takes it as example
    inputs (`past_key_values`) and keeps the setting.
    """
    notes = []
    for e in found:
        config = getattr(e.root, "config", None)
        if getattr(config, "use_cache", None) is not True or "past_key_values" in e.used_args():
            continue
        config.use_cache = False
        notes.append(
            f"{e.name}: {type(e.root).__name__} has config.use_cache = True; turned off for the "
            "export (the graph returns no key/value cache)"
        )
    return notes


def _widened(entry: Entry, dims: dict[str, dict[int, str]], notes: list[str]) -> Entry:
    """The entry with example tensors of size 1 in a dynamic dim repeated to size 2.

    torch.export specializes sizes 0 and 1 (the graph would only take that size), yet a batch of
    one is the example users have. Repeating it keeps the values valid for the model; every
    argument that has the dim (by name) is widened together, so equal names stay equal sizes.
    """
    ones = {
        name
        for arg, arg_dims in dims.items()
        for index, name in arg_dims.items()
        if _size(entry.example(arg), index) == 1
    }
    if not ones:
        return entry

    def widen(arg: str, value: Any) -> Any:
        for index, name in dims.get(arg, {}).items():
            if name in ones and _size(value, index) == 1:
                value = torch.cat([value, value], dim=index)
        return value

    names = entry.arg_names() or []
    args = tuple(widen(n, a) for n, a in zip(names, entry.args, strict=False))
    args += entry.args[len(args) :]
    kwargs = {k: widen(k, v) for k, v in entry.kwargs.items()}
    for name in sorted(ones):
        notes.append(
            f"{entry.name}: the example has size 1 in dynamic dim {name!r}; repeated to size 2 "
            "for the export (torch.export specializes size 1)"
        )
    return replace(entry, args=args, kwargs=kwargs)


def _size(value: Any, index: int) -> int | None:
    if isinstance(value, torch.Tensor) and index < value.dim():
        return int(value.shape[index])
    return None


def _dynamic_shapes(entry: Entry, dims: dict[str, dict[int, str]], what: str) -> dict | None:
    """torch.export `dynamic_shapes`, keyed by the arguments the example gives (torch.export
    refuses keys for the others): `Dim.DYNAMIC` for every declared dim.

    Not one named `Dim` per name: a named Dim must come with the range the model allows, and
    when the model bounds it (BERT: seq <= 512 positions) torch.export fails and suggests the
    range, so every such model was exported twice. `Dim.DYNAMIC` lets torch.export derive the
    range in one export, and still fails when the model fixes the size. Dims of one name are
    then separate symbols where the model does not relate them: the graph is at least as
    general, and MyeLiN refuses calls whose dims of one name differ.
    """
    if not dims:
        return None
    spec: dict[str, Any] = {}
    for arg in entry.used_args():
        arg_dims = dims.get(arg)
        if not arg_dims:
            spec[arg] = None
            continue
        example = entry.example(arg)
        if not isinstance(example, torch.Tensor):
            raise CompileError(f"{what}: dynamic argument {arg!r} of {entry.name} is not a tensor")
        for index, name in arg_dims.items():
            if index >= example.dim():
                raise CompileError(
                    f"{what}: dynamic dim {index} ({name!r}) of {entry.name}({arg}) is out of "
                    f"range: the example has rank {example.dim()}"
                )
            if example.shape[index] < 1:
                raise CompileError(
                    f"{what}: the example for {entry.name}({arg}) has size 0 in dynamic dim "
                    f"{index} ({name!r}); torch.export specializes sizes 0 and 1, so give an "
                    "example of size >= 1"
                )
        spec[arg] = {i: torch.export.Dim.DYNAMIC for i in arg_dims}
    return spec


def output_names(program: torch.export.ExportedProgram) -> list[str]:
    """The names of a program's flattened outputs, as the model names them.

    A `ModelOutput` or dict gives its keys (`logits`, `last_hidden_state`), nested tuples their
    positions (`hidden_states.0`); outputs in a top-level tuple, or a single tensor, are
    `output0`, `output1`, ... as IREE names them.
    """
    spec = program.call_spec.out_spec
    if spec is None:
        return []
    names: list[str] = []

    def walk(node: Any, path: list[str]) -> None:
        if node.is_leaf():
            names.append(".".join(path))
            return
        children = node.children()
        keys = node.context
        if isinstance(keys, list | tuple) and len(keys) == len(children):
            labels = [str(k) for k in keys]
        else:
            labels = [str(i) for i in range(len(children))]
        if not path and not all(isinstance(k, str) for k in keys or ()):
            labels = [f"output{i}" for i in range(len(children))]
        for label, child in zip(labels, children, strict=True):
            walk(child, [*path, label])

    walk(spec, [])
    if names == [""]:
        return ["output0"]
    return names


# -- export ---------------------------------------------------------------------------------------


def _export(entry: Entry, request: FrontendRequest, what: str) -> torch.export.ExportedProgram:
    dims = _dims_for(entry, request.dynamic)
    if isinstance(entry.target, torch.export.ExportedProgram):
        program = entry.target
        _check_exported_dims(program, dims, entry, what)
    else:
        program = _trace(
            entry, _dynamic_shapes(entry, dims, what), dims, request.source.parent, what
        )
    program = program.run_decompositions(decomposition_table())
    float_scalar_comparisons(program)
    eager_attention_as_sdpa(program)
    constant_attention_masks(program)
    return program


def _trace(
    entry: Entry,
    dynamic_shapes: dict | None,
    dims: dict[str, dict[int, str]],
    folder: Path,
    what: str,
) -> torch.export.ExportedProgram:
    """torch.export one entrypoint; a declared dynamic dim that the model fixes is refused."""
    try:
        return _trace_once(entry, dynamic_shapes)
    except Exception as e:
        fixed = _SPECIALIZED.search(str(e))
        if fixed is not None:
            arg = next((a for a in dims if f"'{a}'" in fixed["where"]), fixed["where"].strip("'"))
            axis = int(fixed["axis"])
            name = dims.get(arg, {}).get(axis, f"{arg}.{axis}")
            raise CompileError(
                f"{what}: dim {axis} of {entry.name}({arg}) is declared dynamic ({name!r}) but "
                f"the model fixes it to {fixed['size']}; remove it from `dynamic` or make the "
                "model shape-generic"
            ) from e
        raise _export_error(e, entry, folder, what) from e


def _trace_once(entry: Entry, dynamic_shapes: dict | None) -> torch.export.ExportedProgram:
    if isinstance(entry.target, torch.nn.Module):
        return torch.export.export(
            entry.target,
            entry.args,
            kwargs=dict(entry.kwargs),
            dynamic_shapes=dynamic_shapes,
            strict=False,
        )
    # A method of a module: turbine's builder wraps it in a module whose forward keeps the
    # method's signature (dynamic_shapes refer to arguments by name). The empty decomposition
    # table stops the builder from decomposing; _export applies ours to every program.
    builder = FxProgramsBuilder(entry.root)
    with extend_aot_decompositions(from_current=False):
        return builder.export_program(
            entry.target.__func__,
            args=entry.args,
            kwargs=dict(entry.kwargs),
            dynamic_shapes=dynamic_shapes,
            strict=False,
            name=entry.name,
        )


def _check_exported_dims(
    program: torch.export.ExportedProgram, dims: dict[str, dict[int, str]], entry: Entry, what: str
) -> None:
    """An ExportedProgram's shapes were fixed by its export; `dynamic` can only confirm them."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for arg, arg_dims in dims.items():
        value = placeholders[arg].meta.get("val") if arg in placeholders else None
        for index, name in arg_dims.items():
            if value is None or isinstance(value.shape[index], int):
                raise CompileError(
                    f"{what}: dim {index} ({name!r}) of {entry.name}({arg}) is static in the "
                    "returned ExportedProgram; pass dynamic_shapes to torch.export.export"
                )


def _export_error(e: Exception, entry: Entry, folder: Path, what: str) -> CompileError:
    return CompileError(
        f"{what}: torch.export of {entry.name} failed: {one_line(e)}{user_line(e, folder)}"
    )


# -- parameters -----------------------------------------------------------------------------------


def _externalize(
    programs: dict[str, torch.export.ExportedProgram], wrapped: set[str], scope: str, what: str
) -> dict[str, torch.Tensor]:
    """Bind every parameter, buffer and lifted constant to a named parameter in `scope`.

    The name is the tensor's path in the user's module (`layers.0.attn.wq.weight`), minus the
    `root.` prefix that turbine's method wrapper adds to the programs named in `wrapped`. Tensors
    are matched by identity, so a weight two entrypoints share gets one name.
    """
    by_key: dict[str, torch.Tensor] = {}
    for entry, program in programs.items():
        prefix = "root." if entry in wrapped else ""
        for key, tensor in [*program.state_dict.items(), *program.constants.items()]:
            if not isinstance(tensor, torch.Tensor):
                continue
            trait = ExternalTensorTrait.get(tensor)
            if trait is not None and trait.external_scope == scope:
                continue  # seen in an earlier entrypoint
            name = key.removeprefix(prefix)
            other = by_key.get(name)
            if other is not None and other is not tensor and not torch.equal(other, tensor):
                raise CompileError(
                    f"{what}: two different tensors are both named {name!r}; entrypoints "
                    "that share weights must use the same module"
                )
            ExternalTensorTrait(external_scope=scope, external_name=name).set(tensor)
            by_key.setdefault(name, tensor)
    return by_key


def _import(programs: dict[str, torch.export.ExportedProgram]) -> bytes:
    fx = FxPrograms()
    for name, program in programs.items():
        fx.programs[name] = ExportTargetDef(program)
    output = aot.export(fx)
    buffer = io.BytesIO()
    output.mlir_module.write_bytecode(buffer)
    return buffer.getvalue()


def _values(
    keys: list[tuple[str, str]],
    tensors: dict[str, torch.Tensor],
    request: FrontendRequest,
    what: str,
) -> dict[str, np.ndarray]:
    """The values of exactly the parameters the IR reads."""
    values = {}
    for scope, key in keys:
        if scope != request.scope or key not in tensors:
            raise CompileError(
                f"{what}: the exported graph reads parameter {scope}::{key}, which the "
                "model does not hold"
            )
        values[key] = _numpy(tensors[key])
    return values


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# -- lowering -------------------------------------------------------------------------------------


def _abi_name(name: str) -> str:
    # PLeX parses names back from IREE's declaration string: keep them to [\w.$-].
    return re.sub(r"[^\w.$-]", "_", name) or "_"


def _lower(
    torch_mlir: bytes,
    programs: dict[str, torch.export.ExportedProgram],
    names: dict[str, tuple[list[str], list[str]]],
    request: FrontendRequest,
    what: str,
) -> tuple[bytes, list[tuple[str, str]]]:
    """torch dialect -> linalg (see _torch_lowering), naming the op IREE cannot lower and its
    source line in one line. Returns the lowered bytecode and the (scope, key) of every named
    parameter it reads."""
    with CompilerSession(_SESSION_FLAGS) as session:
        module = session.parse(torch_mlir, what=what)
        _name_signature(module, names)
        try:
            lower_torch(module)
        except CompileError as e:
            failure = lowering_failure(str(e), list(programs.values()), request.source.parent)
            raise CompileError(f"{what}: {failure}") from None
        with session.context:
            keys = [(ref.scope, ref.key) for ref in named_parameters(module)]
        buffer = io.BytesIO()
        module.write_bytecode(buffer)
    return buffer.getvalue(), keys


def _name_signature(module: ir.Operation, names: dict[str, tuple[list[str], list[str]]]) -> None:
    """`iree.abi.name` on each argument and result, so the signature says `input_ids` and
    `logits`, not `input0` and `output0`."""
    with module.context:
        for op in module.regions[0].blocks[0].operations:
            if op.operation.name != "func.func":
                continue
            found = names.get(ir.StringAttr(op.operation.attributes["sym_name"]).value)
            if found is None:
                continue
            function_type = ir.FunctionType(
                ir.TypeAttr(op.operation.attributes["function_type"]).value
            )
            for attribute, wanted, count in (
                ("arg_attrs", found[0], len(function_type.inputs)),
                ("res_attrs", found[1], len(function_type.results)),
            ):
                if len(wanted) != count:
                    continue
                op.operation.attributes[attribute] = ir.ArrayAttr.get(
                    [ir.DictAttr.get({"iree.abi.name": ir.StringAttr.get(n)}) for n in wanted]
                )
