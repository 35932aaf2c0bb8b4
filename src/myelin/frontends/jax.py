"""The JAX frontend: a Python function returning `(fn, params, example_args)` -> StableHLO with
`params` as named parameters.

`fn(params, *args)` is exported with `jax.export` over the flattened parameter leaves followed by
the arguments, so the exported `@main` takes every weight as an argument. We then add the
entrypoint (`forward`, or the one name in the manifest's `entrypoints`): it reads each leaf from
a `util.global` bound to `#flow.parameter.named<scope::key>` (key = the pytree path, e.g.
`dense/kernel`) and calls `@main`, which becomes private and is inlined by IREE. The weights
never appear in the IR, and the signature shows only the real arguments.

Dynamic dimensions (`FrontendRequest.dynamic`, keyed by the argument names of `fn` after
`params`) become `jax.export` symbolic dimensions. IREE 3.13 cannot compile a broadcast of a
dynamic dimension (softmax, `x - x.mean(-1, keepdims=True)`): such a graph is refused here with
the names of the dimensions, instead of failing deep in the compiler.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import func as func_dialect
from iree.compiler.dialects import util

from myelin.errors import CompileError
from myelin.frontends import FrontendRequest, FrontendResult
from myelin.frontends._jax_source import load_function


def to_mlir(request: FrontendRequest) -> FrontendResult:
    where = f"{request.source.name}:{request.symbol}"
    fn, params, example_args = _call_builder(load_function(request.source, request.symbol), where)
    entrypoint = request.single_entrypoint(
        f"{where}: a JAX graph exports one function; got entrypoints {{names}}"
    )
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    treedef = jax.tree_util.tree_structure(params)
    keys = [parameter_key(path) for path, _ in leaves]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise CompileError(f"{where}: parameter paths collide after flattening: {duplicates}")
    arrays = [np.asarray(leaf) for _, leaf in leaves]
    arg_specs = _argument_specs(fn, example_args, request.dynamic, where)
    count = len(arrays)

    def flat_fn(*flat: Any) -> Any:
        return fn(jax.tree_util.tree_unflatten(treedef, flat[:count]), *flat[count:])

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays] + arg_specs
    try:
        exported = jax.export.export(jax.jit(flat_fn, keep_unused=True))(*specs)
    except Exception as e:  # tracing errors are the user's code: show them in one line
        raise CompileError(f"{where}: jax.export failed: {_first_line(e)}") from e
    # jax traces with its own dtypes (float64 becomes float32 unless jax_enable_x64): store each
    # weight in the dtype the exported function actually reads.
    arrays = [
        a if a.dtype == aval.dtype else a.astype(aval.dtype)
        for a, aval in zip(arrays, exported.in_avals[:count], strict=True)
    ]
    mlir = _bind_parameters(
        exported.mlir_module(),
        keys=keys,
        scope=request.scope,
        entrypoint=entrypoint,
        arg_names=_argument_names(fn, len(arg_specs)),
        where=where,
    )
    return FrontendResult(
        mlir=mlir, input_type="stablehlo", parameters=dict(zip(keys, arrays, strict=True))
    )


def parameter_key(path: Sequence[Any]) -> str:
    """'dense/kernel' for params['dense']['kernel'], 'layers/0/w' for lists and tuples."""
    parts = []
    for entry in path:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts) or "params"


def _call_builder(builder: Callable[[], Any], where: str) -> tuple[Callable, Any, tuple]:
    try:
        built = builder()
    except Exception as e:
        raise CompileError(f"{where} raised {type(e).__name__}: {_first_line(e)}") from e
    if not (isinstance(built, tuple | list) and len(built) == 3 and callable(built[0])):
        raise CompileError(
            f"{where} must return (fn, params, example_args) with fn(params, *args) the model; "
            f"got {type(built).__name__}"
        )
    fn, params, example_args = built
    if not isinstance(example_args, tuple | list):
        example_args = (example_args,)
    return fn, params, tuple(example_args)


def _argument_names(fn: Callable, count: int) -> list[str]:
    """Names of fn's arguments after `params`, for `dynamic` keys and the signature."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        parameters = []
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][
        :count
    ]
    return names + [f"arg{i}" for i in range(len(names), count)]


def _argument_specs(
    fn: Callable, example_args: tuple, dynamic: Any, where: str
) -> list[jax.ShapeDtypeStruct]:
    names = _argument_names(fn, len(example_args))
    unknown = sorted(set(dynamic) - set(names))
    if unknown:
        raise CompileError(
            f"{where}: dynamic names unknown argument(s) {', '.join(unknown)}; "
            f"the arguments after params are: {', '.join(names) or 'none'}"
        )
    scope = jax.export.SymbolicScope()
    symbols: dict[str, Any] = {}
    specs = []
    for name, arg in zip(names, example_args, strict=True):
        array = np.asarray(arg)
        shape: list[Any] = list(array.shape)
        for index, symbol in dict(dynamic.get(name, {})).items():
            index = int(index)
            if not -len(shape) <= index < len(shape):
                raise CompileError(
                    f"{where}: dynamic dimension {index} of {name!r} does not exist "
                    f"(its example has shape {tuple(array.shape)})"
                )
            if symbol not in symbols:
                symbols[symbol] = jax.export.symbolic_shape(symbol, scope=scope)[0]
            shape[index] = symbols[symbol]
        specs.append(jax.ShapeDtypeStruct(tuple(shape), array.dtype))
    return specs


def _bind_parameters(
    text: str, *, keys: list[str], scope: str, entrypoint: str, arg_names: list[str], where: str
) -> bytes:
    """Add `entrypoint`: load each parameter from a named-parameter global, call @main."""
    context = ir.Context()
    with context, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise CompileError(f"{where}: exported StableHLO does not parse: {e}") from e
        body = module.body
        main = next(
            op
            for op in body.operations
            if op.operation.name == "func.func"
            and ir.StringAttr(op.operation.attributes["sym_name"]).value == "main"
        )
        _check_dynamic_broadcasts(module.operation, where)
        main.operation.attributes["sym_name"] = ir.StringAttr.get("jax_main")
        ftype = ir.FunctionType(ir.TypeAttr(main.operation.attributes["function_type"]).value)
        inputs, results = list(ftype.inputs), list(ftype.results)
        weight_types, arg_types = inputs[: len(keys)], inputs[len(keys) :]
        globals_ = []
        with ir.InsertionPoint.at_block_begin(body):
            for i, (key, t) in enumerate(zip(keys, weight_types, strict=True)):
                name = f"param_{i}"
                util.GlobalOp(
                    ir.StringAttr.get(name),
                    ir.TypeAttr.get(t),
                    sym_visibility=ir.StringAttr.get("private"),
                    initial_value=ir.Attribute.parse(
                        f"#flow.parameter.named<{ir.StringAttr.get(scope)}::"
                        f"{ir.StringAttr.get(key)}> : {t}"
                    ),
                )
                globals_.append((name, t))
        main.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
        with ir.InsertionPoint(body):
            forward = func_dialect.FuncOp(entrypoint, ir.FunctionType.get(arg_types, results))
            forward.operation.attributes["arg_attrs"] = ir.ArrayAttr.get(
                [ir.DictAttr.get({"iree.abi.name": ir.StringAttr.get(n)}) for n in arg_names]
            )
            block = forward.add_entry_block()
        with ir.InsertionPoint(block):
            loads = [util.GlobalLoadOp(t, name).result for name, t in globals_]
            call = func_dialect.CallOp(
                results, ir.FlatSymbolRefAttr.get("jax_main"), [*loads, *block.arguments]
            )
            func_dialect.ReturnOp(call.results)
        module.operation.verify()
        return module.operation.get_asm(binary=True)


def _check_dynamic_broadcasts(module: ir.Operation, where: str) -> None:
    bad: list[str] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.dynamic_broadcast_in_dim":
            operand = op.operands[0].type
            if isinstance(operand, ir.RankedTensorType) and not operand.has_static_shape:
                bad.append(str(operand))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    if bad:
        raise CompileError(
            f"{where}: a dynamic dimension is broadcast ({bad[0]}, e.g. by softmax or "
            "keepdims reductions), which IREE 3.13 cannot compile; make that dimension static "
            "(remove it from `dynamic`) or build one graph per shape"
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
