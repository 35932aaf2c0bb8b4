"""Rewrites that make an ONNX model importable by IREE 3.13 without changing what it computes.

Each step fixes a failure class of the raw importer measured over ONNX's backend node tests
(docs/onnx-coverage.md):
- old opsets: torch-mlir lowers only the newer forms of some ops (MaxPool and
  BatchNormalization at opset 9 fail), so models below MIN_OPSET are upgraded with onnx's
  version converter;
- ops torch-mlir has no lowering for, but whose ONNX schema defines them as a function of simpler
  ops (Attention, RMSNormalization, RotaryEmbedding, ...), are expanded into that function body;
- values computable at build time (Shape of a static tensor, arithmetic on constants) are folded
  into constants, because the lowering needs axes, pads, starts or shapes as constants, and an
  If on such a value is replaced by the branch it takes (IREE cannot lower If);
- a few ops get rewritten into forms IREE has (MatMul on vectors; casts between float8 and
  float16, through float32; CumProd, prepared for the rewrite to torch.aten.cumprod in
  _onnx_torch_ops);
- shape inference runs last, so every value has the type the importer needs.
The graph-input helpers at the end (static_operand_inputs, freeze_inputs) serve the build warning
and tools/onnx_coverage.py.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
import onnx.inliner
import onnx.version_converter
from onnx import helper, numpy_helper

from myelin.frontends._onnx_checks import FP8_TYPES

# Models below this default-domain opset are upgraded (17: the opset these rewrites were
# measured at).
MIN_OPSET = 17

# (domain, op) pairs that torch-mlir (IREE 3.13) does not lower, but whose schema gives a function
# body built from ops it does lower. Expanding them is exactly what onnx's own *_expanded backend
# tests do, and those pass through IREE. NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss do
# have a lowering, but it fails for most attribute combinations, while their bodies compile.
EXPAND_OPS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "Attention"),
        ("", "RMSNormalization"),
        ("", "RotaryEmbedding"),
        ("", "Swish"),
        ("", "LinearAttention"),
        ("", "CausalConvWithState"),
        ("", "AffineGrid"),
        ("", "NegativeLogLikelihoodLoss"),
        ("", "SoftmaxCrossEntropyLoss"),
        ("ai.onnx.preview", "FlexAttention"),
    }
)


# Constants and folded values larger than this are left to the compiler: folding is for the small
# integer computations (shapes, axes) that the lowering needs to see, not for weights.
FOLD_MAX_BYTES = 64 * 1024

# Ops whose results are not a function of their inputs (or that carry sub-graphs): never folded.
_NOT_FOLDABLE = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "If",
        "Loop",
        "Scan",
        "SequenceMap",
    }
)

# (op type) -> indices of inputs that IREE's lowering needs as build-time constants.
STATIC_OPERANDS: dict[str, tuple[int, ...]] = {
    **{
        op: (1,)
        for op in (
            "ReduceSum",
            "ReduceMean",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceSumSquare",
            "Unsqueeze",
            "Squeeze",
            "Tile",
            "Expand",
            "Reshape",
            "CumSum",
            "CumProd",
            "Split",
            "TopK",
            "OneHot",
            "Trilu",
            "CenterCropPad",
            "AffineGrid",
            "Upsample",
        )
    },
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Dropout": (1, 2),
    "Col2Im": (1, 2),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "NonMaxSuppression": (2, 3, 4),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "EyeLike": (),
}


def default_opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return 0


def upgrade_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Upgrade a model below MIN_OPSET; returns the model and a note when that was impossible."""
    version = default_opset(model)
    if not version or version >= MIN_OPSET:
        return model, None
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter raises bare RuntimeErrors from C++
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return model, f"could not upgrade opset {version} to {MIN_OPSET} ({first}); kept {version}"
    if _interface(upgraded) != _interface(model):
        # e.g. Scan 8 -> 9 drops the batch axis from the graph's inputs and outputs: the
        # upgraded model is a different function, so the original is kept
        return model, (
            f"upgrading opset {version} to {MIN_OPSET} would change the graph's inputs or "
            f"outputs; kept {version}"
        )
    return upgraded, None


def _interface(model: onnx.ModelProto) -> list[str]:
    """The graph's inputs and outputs with their types, as text (for comparing two models)."""
    return [str(v.type) for v in (*model.graph.input, *model.graph.output)]


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is best effort: the importer reports missing types itself
        try:
            return onnx.shape_inference.infer_shapes(model, data_prop=False)
        except Exception:
            return model


def name_nodes(model: onnx.ModelProto) -> None:
    """Give unnamed nodes a stable name, so errors and warnings can point at them."""
    seen = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in seen:
                name += "_"
            node.name = name
            seen.add(name)


def expand_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Inline the schema function bodies of EXPAND_OPS nodes; returns the ops expanded."""
    present = sorted({(_domain(n.domain), n.op_type) for n in _all_nodes(model.graph)} & EXPAND_OPS)
    if not present:
        return model, []
    typed = {vi.name for vi in [*model.graph.input, *model.graph.value_info]}
    for init in model.graph.initializer:  # the inliner needs every operand's type
        if init.name not in typed:
            model.graph.value_info.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    try:  # all of EXPAND_OPS: a body may itself use one (SoftmaxCrossEntropyLoss -> NLL)
        expanded = onnx.inliner.inline_selected_functions(
            model, sorted(EXPAND_OPS), inline_schema_functions=True
        )
    except Exception:  # the inliner could not specialize a body: leave the op for the report
        return model, []
    left = {(_domain(n.domain), n.op_type) for n in _all_nodes(expanded.graph)}
    return expanded, [op for _, op in present if (_, op) not in left]


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def fold_constants(model: onnx.ModelProto, *, max_rounds: int = 6) -> tuple[onnx.ModelProto, int]:
    """Replace nodes whose results are known at build time by Constant nodes.

    Rounds alternate with shape inference, since folding a shape makes more shapes static.
    Returns the model and the number of nodes folded.
    """
    total = 0
    for _ in range(max_rounds):
        model = infer_shapes(model)
        folded = _fold_round(model)
        total += folded
        if not folded:
            break
    if total:
        _remove_dead_nodes(model.graph)
        model = infer_shapes(model)
    return model, total


def _fold_round(model: onnx.ModelProto) -> int:
    graph = model.graph
    opsets = {o.domain or "": int(o.version) for o in model.opset_import}
    consts: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if (
            init.data_location != onnx.TensorProto.EXTERNAL
            and _tensor_bytes(init) <= FOLD_MAX_BYTES
        ):
            with contextlib.suppress(Exception):  # types numpy cannot hold: not foldable
                consts[init.name] = numpy_helper.to_array(init)
    shapes = _static_shapes(graph)
    new_nodes: list[onnx.NodeProto] = []
    folded = 0
    for node in graph.node:
        branch = _constant_branch(node, consts)
        if branch is not None:  # If on a build-time condition: splice in the branch taken
            new_nodes.extend(branch.node)
            graph.initializer.extend(branch.initializer)
            for result, name in zip(branch.output, node.output, strict=True):
                if name:
                    new_nodes.append(
                        helper.make_node("Identity", [result.name], [name], name=f"{name}_branch")
                    )
            folded += 1
            continue
        values = _evaluate(node, consts, shapes, opsets)
        if values is None:
            new_nodes.append(node)
            continue
        for name, value in zip(node.output, values, strict=True):
            consts[name] = value
        if node.op_type == "Constant":
            new_nodes.append(node)
            continue
        folded += 1
        for name, value in zip(node.output, values, strict=True):
            if name:
                new_nodes.append(
                    helper.make_node(
                        "Constant",
                        [],
                        [name],
                        name=f"{node.name or name}_folded",
                        value=numpy_helper.from_array(np.asarray(value), name),
                    )
                )
    if folded:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return folded


def _constant_branch(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> onnx.GraphProto | None:
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or node.input[0] not in consts:
        return None
    taken = (
        "then_branch" if bool(np.asarray(consts[node.input[0]]).reshape(-1)[0]) else "else_branch"
    )
    for attr in node.attribute:
        if attr.name == taken:
            return attr.g
    return None


def _evaluate(
    node: onnx.NodeProto,
    consts: dict[str, np.ndarray],
    shapes: dict[str, tuple[int, ...]],
    opsets: dict[str, int],
) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
        shape = shapes[node.input[0]]
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end")
        return [np.array(shape[start:end], dtype=np.int64)]
    if node.op_type in _NOT_FOLDABLE:
        return None
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return None
    inputs = [i for i in node.input if i]
    if any(i not in consts for i in inputs):
        return None
    from onnx.reference import ReferenceEvaluator

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            evaluator = ReferenceEvaluator(node, opsets={"": opsets.get("", MIN_OPSET)})
            results = evaluator.run(None, {i: consts[i] for i in inputs})
    except Exception:
        return None
    arrays = [np.asarray(r) for r in results]
    if any(a.dtype == object for a in arrays):
        return None
    if sum(a.nbytes for a in arrays) > FOLD_MAX_BYTES:
        return None
    return arrays


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if all(d is not None for d in dims):
            shapes[vi.name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    for init in graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _tensor_bytes(t: onnx.TensorProto) -> int:
    count = int(np.prod(t.dims, dtype=np.int64))
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        itemsize = 8
    return count * itemsize


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                yield from _all_nodes(sub)


def _subgraphs(attr: onnx.AttributeProto) -> Iterable[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name read by a node of `graph` or of its sub-graphs (outer-scope reads)."""
    used: set[str] = set()
    for node in _all_nodes(graph):
        used.update(i for i in node.input if i)
    return used


def _remove_dead_nodes(graph: onnx.GraphProto) -> None:
    outputs = {o.name for o in graph.output}
    while True:
        used = _used_names(graph) | outputs
        keep = [n for n in graph.node if any(o in used for o in n.output if o)]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    used = _used_names(graph) | outputs
    initializers = [t for t in graph.initializer if t.name in used]
    dropped = {t.name for t in graph.initializer} - {t.name for t in initializers}
    if dropped:
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        # IR < 4 models list initializers as inputs too; a dropped one must not become an input.
        inputs = [i for i in graph.input if i.name not in dropped]
        del graph.input[:]
        graph.input.extend(inputs)


def decompose_vector_matmuls(model: onnx.ModelProto) -> int:
    """MatMul with a 1-D operand -> Unsqueeze, MatMul, Squeeze (torch-mlir leaves the 1-D
    forms of aten.matmul unlowered). Returns the number of nodes rewritten."""
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]
        if vi.type.tensor_type.HasField("shape")
    }
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in model.graph.node:
        a, b = (node.input[0], node.input[1]) if node.op_type == "MatMul" else ("", "")
        if node.domain not in ("", "ai.onnx") or 1 not in (ranks.get(a), ranks.get(b)):
            nodes.append(node)
            continue
        rewritten += 1
        prefix = f"{node.name}_vector"
        axes_a, axes_b = f"{prefix}_axes_a", f"{prefix}_axes_b"
        nodes.append(_int64_constant(axes_a, [0]))
        nodes.append(_int64_constant(axes_b, [-1]))
        squeeze: list[int] = []
        if ranks[b] == 1:
            nodes.append(helper.make_node("Unsqueeze", [b, axes_b], [f"{prefix}_b"]))
            b = f"{prefix}_b"
            squeeze.insert(0, -1)
        if ranks[a] == 1:
            nodes.append(helper.make_node("Unsqueeze", [a, axes_a], [f"{prefix}_a"]))
            a = f"{prefix}_a"
            squeeze.insert(0, -2)
        nodes.append(helper.make_node("MatMul", [a, b], [f"{prefix}_mm"], name=node.name))
        nodes.append(_int64_constant(f"{prefix}_squeeze", squeeze))
        nodes.append(
            helper.make_node("Squeeze", [f"{prefix}_mm", f"{prefix}_squeeze"], [node.output[0]])
        )
    if rewritten:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return rewritten


def split_fp8_half_casts(model: onnx.ModelProto) -> int:
    """Cast/CastLike between float8 and float16 -> two casts through float32. IREE 3.13's CPU
    code generation has no `arith.extf`/`arith.truncf` between f8 and f16 vectors (the compile
    fails), but converts both to and from f32. Exact: float16 -> float32 and float8 -> float32
    are exact, so the float8 rounding (and `saturate`) happens once, in the second cast.
    Returns the number of nodes rewritten; shapes must be inferred again after it."""
    graph = model.graph
    elem = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in [*graph.input, *graph.value_info, *graph.output]
    }
    elem.update({t.name: t.data_type for t in graph.initializer})
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Cast":
            target = attrs.get("to")
        elif node.op_type == "CastLike":
            target = elem.get(node.input[1])
        else:
            target = None
        pair = {elem.get(node.input[0]) if node.input else None, target}
        if node.domain not in ("", "ai.onnx") or not (
            f16 in pair and len(pair) == 2 and pair - {f16} <= FP8_TYPES
        ):
            nodes.append(node)
            continue
        # the second cast keeps the node's op and attributes: IREE lowers CastLike f32->f8
        # but not Cast f32->f8 (that one falls back to the host, or fails the build)
        wide = f"{node.name}_f32"
        nodes.append(helper.make_node("Cast", [node.input[0]], [wide], name=wide, to=f32))
        second = onnx.NodeProto()
        second.CopyFrom(node)
        second.input[0] = wide
        nodes.append(second)
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def prepare_cumprod(model: onnx.ModelProto) -> int:
    """Ready CumProd nodes for the rewrite to torch.aten.cumprod (see _onnx_torch_ops): record
    the constant axis as an `axis` attribute and express `reverse` (Gather with reversed indices)
    and `exclusive` (shift in a 1) with ordinary ONNX ops. Runs last: the added attribute is not
    in the ONNX schema. Returns the number of nodes prepared."""
    graph = model.graph
    consts = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = node.attribute[0].t
    types = {vi.name: vi.type.tensor_type for vi in [*graph.input, *graph.value_info]}
    nodes: list[onnx.NodeProto] = []
    prepared = 0
    for node in graph.node:
        if (
            node.op_type != "CumProd"
            or node.domain not in ("", "ai.onnx")
            or (node.input[1] not in consts)
        ):
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        exclusive, reverse = attrs.get("exclusive", 0), attrs.get("reverse", 0)
        x, t = node.input[0], types.get(node.input[0])
        shape = (
            [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if (t is not None and t.HasField("shape"))
            else None
        )
        if shape is None or (None in shape and (exclusive or reverse)):
            nodes.append(node)
            continue
        axis = int(numpy_helper.to_array(consts[node.input[1]]).reshape(-1)[0]) % len(shape)
        n, elem, prefix = shape[axis], t.elem_type, f"{node.name}_cumprod"

        def info(name: str, dims: list, elem: int = elem) -> None:
            graph.value_info.append(helper.make_tensor_value_info(name, elem, dims))

        current = x
        if reverse:
            nodes.append(_int64_constant(f"{prefix}_rev", list(range(n - 1, -1, -1))))
            nodes.append(
                helper.make_node("Gather", [current, f"{prefix}_rev"], [f"{prefix}_in"], axis=axis)
            )
            info(f"{prefix}_in", shape)
            current = f"{prefix}_in"
        if exclusive:
            one_shape = [1 if i == axis else d for i, d in enumerate(shape)]
            ones = np.ones(one_shape, helper.tensor_dtype_to_np_dtype(elem))
            nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [f"{prefix}_one"],
                    value=numpy_helper.from_array(ones, f"{prefix}_one"),
                )
            )
            for suffix, values in (("start", [0]), ("end", [n - 1]), ("axes", [axis])):
                nodes.append(_int64_constant(f"{prefix}_{suffix}", values))
            nodes.append(
                helper.make_node(
                    "Slice",
                    [current, f"{prefix}_start", f"{prefix}_end", f"{prefix}_axes"],
                    [f"{prefix}_head"],
                )
            )
            info(f"{prefix}_head", [n - 1 if i == axis else d for i, d in enumerate(shape)])
            nodes.append(
                helper.make_node(
                    "Concat", [f"{prefix}_one", f"{prefix}_head"], [f"{prefix}_shifted"], axis=axis
                )
            )
            info(f"{prefix}_shifted", shape)
            current = f"{prefix}_shifted"
        result = f"{prefix}_out" if reverse else node.output[0]
        nodes.append(
            helper.make_node(
                "CumProd", [current, node.input[1]], [result], name=node.name, axis=axis
            )
        )
        if reverse:
            info(result, shape)
            nodes.append(
                helper.make_node("Gather", [result, f"{prefix}_rev"], [node.output[0]], axis=axis)
            )
        prepared += 1
    if prepared:
        del graph.node[:]
        graph.node.extend(nodes)
    return prepared


def _int64_constant(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name)
    )


def static_operand_inputs(model: onnx.ModelProto) -> dict[str, str]:
    """Graph inputs that feed an operand IREE needs as a constant: {input name: "Op 'node'"}."""
    inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for index in STATIC_OPERANDS.get(node.op_type, ()):
            if index < len(node.input) and node.input[index] in inputs:
                found.setdefault(node.input[index], f"{node.op_type} {node.name!r}")
    return found


def freeze_inputs(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn graph inputs into initializers with the given values (what an exporter does for
    axes, pads and shapes that are fixed for a deployment). Returns a new model."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    graph = frozen.graph
    kept = [i for i in graph.input if i.name not in values]
    del graph.input[:]
    graph.input.extend(kept)
    for name, value in values.items():
        graph.node.insert(
            0,
            helper.make_node(
                "Constant",
                [],
                [name],
                name=f"{name}_frozen",
                value=numpy_helper.from_array(np.asarray(value), name),
            ),
        )
    return frozen
