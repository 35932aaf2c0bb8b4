"""The ONNX frontend: an .onnx file -> linalg MLIR (lowered through torch-mlir the way IREE's
`--iree-input-type=onnx` does) with its initializers as named parameters.

Steps (each fixes a failure class measured on onnx's backend node tests, docs/onnx-coverage.md):
load without external data (weights are memory-mapped at import), upgrade old opsets, expand ops
IREE lacks into their ONNX function bodies, refuse op domains and element types IREE cannot
handle, fold build-time-computable values into constants, rewrite a few ops into forms IREE has,
import with IREE's ONNX importer, warn about ops known to compute wrong values in IREE 3.13,
refuse ops the ONNX->torch conversion cannot lower (naming them and their nodes), and lower the
rest to linalg. With host fallback, the unlowerable, the known-wrong and the foreign-domain nodes
run on the host instead. docs/frontends.md lists every step for users."""

from __future__ import annotations

from pathlib import Path

import onnx

from myelin.compiler.options import DEFAULT_MIN_PARAMETER_BYTES
from myelin.errors import CompileError
from myelin.frontends import DEFAULT_ENTRYPOINT, FrontendRequest, FrontendResult
from myelin.frontends import _onnx_checks as checks
from myelin.frontends import _onnx_preprocess as prep
from myelin.frontends._onnx_import import import_model
from myelin.frontends._onnx_limits import sliced_table_limits


def to_mlir(request: FrontendRequest) -> FrontendResult:
    entrypoint = request.single_entrypoint(
        f"{request.source.name}: an ONNX model has one graph, so one entrypoint; "
        "got {names} (list one name in entrypoints)"
    )
    model, warnings = prepare(
        request.source, entrypoint=entrypoint, host_fallback=request.host_fallback
    )
    # with host fallback, nodes IREE 3.13 is known to compute wrong, and nodes of other
    # domains (ai.onnx.ml, training), run on the host from the start
    wrong = checks.silently_wrong_nodes(model) if request.host_fallback else {}
    foreign = checks.foreign_ops(model) if request.host_fallback else {}
    imported = import_model(
        model,
        scope=request.scope,
        min_bytes=DEFAULT_MIN_PARAMETER_BYTES,
        base_dir=request.source.parent,
        host_fallback=request.module_name if request.host_fallback else None,
        host_first=set(wrong) | set(foreign),
    )
    if imported.unlowered:
        raise CompileError(
            f"{request.source.name}: IREE 3.13 cannot lower ONNX op(s) "
            f"{checks.describe_ops(imported.unlowered)}; replace them in the exporter, or "
            "check docs/onnx-coverage.md for supported variants"
        )
    warnings += checks.silently_wrong(model, skip={n.node for n in imported.host_nodes})
    for node in imported.host_nodes:
        if node.node in wrong:
            why = f"IREE 3.13 computes it wrong: {wrong[node.node]}"
        elif node.node in foreign:
            why = f"IREE 3.13 lowers no {foreign[node.node]!r}, an op outside ai.onnx"
        else:
            why = "IREE 3.13 cannot lower it"
        warnings.append(
            f"node {node.node!r} ({node.op_type}) runs on the host (host_fallback: {why}): each "
            "call waits for the device, copies its results back and runs the op in ONNX Runtime"
        )
    return FrontendResult(
        mlir=imported.mlir,
        input_type="none",
        parameters=imported.parameters,
        warnings=warnings,
        dim_names=dim_names(model),
        host_nodes=imported.host_nodes,
        dim_limits={entrypoint: limits} if (limits := sliced_table_limits(model)) else {},
    )


def dim_names(model: onnx.ModelProto) -> dict[str, dict[int, str]]:
    """The graph inputs' symbolic dims (`dim_param`, e.g. "batch"): ONNX gives dims of one name
    one size, which the runtime then checks."""
    initializers = {t.name for t in model.graph.initializer}
    names: dict[str, dict[int, str]] = {}
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        named = {axis: d.dim_param for axis, d in enumerate(dims) if d.dim_param}
        if named:
            names[value.name] = named
    return names


def prepare(
    path: Path, *, entrypoint: str = DEFAULT_ENTRYPOINT, host_fallback: bool = False
) -> tuple[onnx.ModelProto, list[str]]:
    """Load and preprocess a model for import; returns it with the build warnings. With
    `host_fallback`, ops outside ai.onnx are kept (they will run on the host)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError, OSError
        raise CompileError(f"{path.name}: not a readable ONNX model ({e})") from e
    if not prep.default_opset(model):
        if not host_fallback:
            raise CompileError(
                f"{path.name}: the model imports no default-domain (ai.onnx) opset; models made "
                "only of ai.onnx.ml or training ops are not supported by IREE (with "
                "host_fallback = true they run on the host)"
            )
        # IREE's importer and ONNX->torch pass read the default opset of every function
        model.opset_import.append(onnx.helper.make_opsetid("", prep.MIN_OPSET))
    prep.name_nodes(model)
    warnings: list[str] = []
    model, note = prep.upgrade_opset(model)
    if note:
        warnings.append(note)
    model = prep.infer_shapes(model)
    model, _ = prep.expand_functions(model)
    prep.name_nodes(model)  # inlined function bodies come with unnamed nodes
    foreign = checks.foreign_ops(model)
    if foreign and not host_fallback:
        raise CompileError(
            f"{path.name}: ops outside the ai.onnx domain are not supported by IREE 3.13: "
            f"{checks.describe_ops(foreign)} (with host_fallback = true they run on the host)"
        )
    model, _ = prep.fold_constants(model)
    if prep.decompose_vector_matmuls(model) + prep.split_fp8_half_casts(model):
        prep.name_nodes(model)
        model = prep.infer_shapes(model)
    problems = checks.unsupported_types(model)
    if problems:
        raise CompileError(
            f"{path.name}: IREE 3.13 cannot compile {'; '.join(problems)}; cast them to a "
            "supported type (float32/float16/bfloat16/int8/...) in the exporter"
        )
    for name, user in prep.static_operand_inputs(model).items():
        warnings.append(
            f"graph input {name!r} feeds {user}, which IREE needs as a build-time constant; "
            "if the build fails, make it an initializer"
        )
    prep.prepare_cumprod(model)  # last: it adds an attribute ONNX's schema does not know
    model.graph.name = entrypoint
    return model, warnings
