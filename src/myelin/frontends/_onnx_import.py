"""ONNX proto -> torch-dialect MLIR with IREE's ONNX importer, weights as named parameters.

IREE's importer (`iree.compiler.extras.onnx_importer`) inlines every initializer as a
`dense_resource` constant. Its `--externalize-params` variant names parameters after randomly
generated strings when an initializer has no name, and writes an .irpa that PLeX would only read
back. So we subclass the base importer: each large initializer becomes a
`util.global` bound to `#flow.parameter.named<scope::key>` (key = the ONNX value name), and its
bytes are handed to PLeX as a numpy array, memory-mapped when the model keeps weights in
external data files, so a multi-GB model never has to fit in memory twice.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from iree.compiler import ir
from iree.compiler.dialects import func as func_dialect
from iree.compiler.dialects import util
from iree.compiler.extras import onnx_importer
from onnx import numpy_helper

from myelin.errors import CompileError
from myelin.frontends._onnx_host import node_of, replace_with_host_calls
from myelin.frontends._onnx_torch_ops import rewrite_onnx_ops
from myelin.frontends._torch_lowering import torch_to_linalg_pipeline

TP = onnx.TensorProto

# Element types whose initializers may become parameters: whole-byte types whose bytes IREE reads
# exactly as ONNX stores them. Others stay inline: f64 because IREE's input phase demotes f64
# globals to f32 (a parameter would then be read with the wrong size), bool/sub-byte/fp8 because
# their storage layout in IREE differs from ONNX's or PLeX's parameter table has no dtype for them.
_PARAMETER_TYPES: dict[int, tuple[str, str]] = {
    TP.FLOAT: ("f32", "float32"),
    TP.FLOAT16: ("f16", "float16"),
    TP.BFLOAT16: ("bf16", "bfloat16"),
    TP.INT8: ("i8", "int8"),
    TP.UINT8: ("i8", "uint8"),
    TP.INT16: ("i16", "int16"),
    TP.UINT16: ("i16", "uint16"),
    TP.INT32: ("i32", "int32"),
    TP.UINT32: ("i32", "uint32"),
    TP.INT64: ("i64", "int64"),
    TP.UINT64: ("i64", "uint64"),
}

# Small integer tensors are usually shapes, axes, pads or indices that the lowering must see as
# constants; they stay inline even above the parameter size threshold.
_INLINE_INTEGER_ELEMENTS = 1024
_INTEGER_TYPES = {TP.INT32, TP.INT64}


@dataclass
class ImportedOnnx:
    mlir: bytes  # MLIR bytecode
    parameters: dict[str, np.ndarray] = field(default_factory=dict)
    # node name -> op type of every ONNX op the ONNX->torch conversion could not lower
    unlowered: dict[str, str] = field(default_factory=dict)
    host_nodes: tuple = ()  # _onnx_host.HostNode: nodes that run on the host (host_fallback)


def tensor_array(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    """The values of an initializer, memory-mapped when they live in an external data file."""
    if tensor.data_location == TP.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        path = (base_dir / info["location"]).resolve()
        if not path.is_file():
            raise CompileError(
                f"initializer {tensor.name!r}: external data file {info['location']!r} not found "
                f"next to the model ({base_dir}); keep the .onnx and its data files together"
            )
        np_type = _PARAMETER_TYPES.get(tensor.data_type)
        if np_type is not None:
            offset = int(info.get("offset", 0))
            shape = tuple(int(d) for d in tensor.dims)
            return np.memmap(path, dtype=np_type[1], mode="r", offset=offset, shape=shape)
        return numpy_helper.to_array(tensor, base_dir=str(base_dir))
    if tensor.HasField("raw_data") and tensor.data_type in _PARAMETER_TYPES:
        dtype = np.dtype(_numpy_dtype(_PARAMETER_TYPES[tensor.data_type][1]))
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _should_externalize(tensor: onnx.TensorProto, min_bytes: int) -> bool:
    if tensor.data_type not in _PARAMETER_TYPES:
        return False
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_location == TP.EXTERNAL:
        return True
    if tensor.data_type in _INTEGER_TYPES and count < _INLINE_INTEGER_ELEMENTS:
        return False
    itemsize = _numpy_dtype(_PARAMETER_TYPES[tensor.data_type][1]).itemsize
    return count * itemsize >= min_bytes


class _ParameterImporter(onnx_importer.NodeImporter):
    """The base importer, but large initializers (and large Constant nodes) become globals bound to
    named parameters instead of inline constants."""

    def __init__(self, *args, scope: str, min_bytes: int, base_dir: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scope = scope
        self.min_bytes = min_bytes
        self.base_dir = base_dir
        self.parameters: dict[str, np.ndarray] = {}
        self._symbols = ir.SymbolTable(self._m)
        self._last_global: ir.Operation | None = None

    def import_initializer(
        self, initializer: onnx.TensorProto, extern_name: str | None = None
    ) -> ir.Value:
        key = extern_name or initializer.name
        if not _should_externalize(initializer, self.min_bytes):
            if initializer.data_location == TP.EXTERNAL:  # small, but only on disk: read it
                initializer = numpy_helper.from_array(
                    numpy_helper.to_array(initializer, base_dir=str(self.base_dir)), key
                )
            return super().import_initializer(initializer, extern_name)
        builtin_name, _ = _PARAMETER_TYPES[initializer.data_type]
        dims = tuple(int(d) for d in initializer.dims)
        with self._c, ir.Location.name(key):
            element = (
                ir.IntegerType.get_signless(int(builtin_name[1:]))
                if builtin_name.startswith("i")
                else ir.Type.parse(builtin_name)
            )
            tensor_type = ir.RankedTensorType.get(dims, element)
            with ir.InsertionPoint.at_block_begin(self._m.regions[0].blocks[0]):
                key_attr = ir.StringAttr.get(key)
                scope_attr = ir.StringAttr.get(self.scope)
                global_op = util.GlobalOp(
                    ir.StringAttr.get(_symbol_name(key)),
                    ir.TypeAttr.get(tensor_type),
                    sym_visibility=ir.StringAttr.get("private"),
                    initial_value=ir.Attribute.parse(
                        f"#flow.parameter.named<{scope_attr}::{key_attr}> : {tensor_type}"
                    ),
                )
            symbol = self._symbols.insert(global_op)  # renames on collision
            if self._last_global is not None:  # keep declaration order = ONNX order
                global_op.move_after(self._last_global)
            self._last_global = global_op
            vtensor_type = self._cc.get_vtensor_type(
                dims, self._cc.tensor_element_type(initializer.data_type)
            )
            with ir.InsertionPoint(self._b):
                load = util.GlobalLoadOp(tensor_type, ir.StringAttr(symbol).value)
                value = ir.Operation.create(
                    "torch_c.from_builtin_tensor", results=[vtensor_type], operands=[load.result]
                ).result
        self.parameters[key] = tensor_array(initializer, self.base_dir)
        self._nv_map[key] = value
        return value


def _symbol_name(key: str) -> str:
    name = "".join(c if c.isalnum() or c in "_." else "_" for c in key)
    return name if name and not name[0].isdigit() else f"p_{name}"


def _define_function(
    model_info: onnx_importer.ModelInfo, module: ir.Operation, **kwargs
) -> _ParameterImporter:
    """`NodeImporter.define_function`, but building our subclass (the base hardcodes its own)."""
    graph_info = model_info.main_graph
    cc = onnx_importer.ContextCache(module.context)
    mc = onnx_importer.ModuleCache(module, cc)
    with module.context, ir.Location.name(f"graph:{graph_info.graph_proto.name}"):
        body = module.regions[0].blocks[0]
        input_types = [cc.type_proto_to_type(i.type) for i in graph_info.input_map.values()]
        output_types = [cc.type_proto_to_type(o.type) for o in graph_info.graph_proto.output]
        func_op = func_dialect.FuncOp(
            graph_info.graph_proto.name,
            ir.FunctionType.get(input_types, output_types),
            ip=ir.InsertionPoint(body),
        )
        block = func_op.add_entry_block([ir.Location.name(k) for k in graph_info.input_map])
    imp = _ParameterImporter(
        graph_info,
        parent_op=func_op,
        block=block,
        context_cache=cc,
        module_op=module,
        module_cache=mc,
        **kwargs,
    )
    for name, value in zip(graph_info.input_map, block.arguments, strict=True):
        imp._nv_map[name] = value
    imp._populate_graph_attrs(func_op)
    return imp


def import_model(
    model: onnx.ModelProto,
    *,
    scope: str,
    min_bytes: int,
    base_dir: Path,
    host_fallback: str | None = None,
    host_first: set[str] | frozenset[str] = frozenset(),
) -> ImportedOnnx:
    """Import a preprocessed model (shapes inferred, graph named after the entrypoint).

    With `host_fallback` (the VM module name), the nodes in `host_first` (known to compute
    wrong in IREE) run on the host from the start, and a node that does not lower is moved to
    the host (myelin.frontends._onnx_host) and the import starts again, until the rest lowers:
    a node fails in whichever pass it fails, and only a fresh import can take it out before
    that pass.
    """
    if host_fallback is None:
        return _import_model(model, scope=scope, min_bytes=min_bytes, base_dir=base_dir)
    nodes = {n.name for n in model.graph.node}
    wanted: set[str] = set(host_first) & nodes
    for _ in range(len(nodes) + 1):
        try:
            imported = _import_model(
                model,
                scope=scope,
                min_bytes=min_bytes,
                base_dir=base_dir,
                host=(host_fallback, wanted),
            )
        except CompileError as e:
            node = getattr(e, "node", None)
            if node is None or node in wanted or node not in nodes:
                raise
            wanted.add(node)
            continue
        if not imported.unlowered:
            return imported
        more = set(imported.unlowered) & nodes - wanted
        if not more:
            return imported
        wanted |= more
    raise CompileError("host fallback did not converge")  # pragma: no cover: bounded above


def _import_model(
    model: onnx.ModelProto,
    *,
    scope: str,
    min_bytes: int,
    base_dir: Path,
    host: tuple[str, set[str]] | None = None,
) -> ImportedOnnx:
    context = ir.Context()
    model_info = onnx_importer.ModelInfo(model)
    module = model_info.create_module(context=context).operation
    try:
        imp = _define_function(
            model_info, module, scope=scope, min_bytes=min_bytes, base_dir=base_dir
        )
        imp.import_all()
    except onnx_importer.OnnxImportError as e:
        raise CompileError(f"the ONNX importer rejected the model: {_first_line(e)}") from e
    except (KeyError, TypeError, ValueError) as e:  # the importer's unmapped element types
        raise CompileError(f"the ONNX importer rejected the model: {_first_line(e)}") from e
    try:
        module.verify()
    except ir.MLIRError as e:
        raise CompileError(f"the imported ONNX model does not verify: {_first_line(e)}") from e
    rewrite_onnx_ops(module)
    host_nodes: list = []
    if host is not None and host[1]:
        host_nodes = replace_with_host_calls(module, model, host[0], host[1])
    unlowered = _unlowered_onnx_ops(module)
    if not unlowered:
        _lower_to_linalg(module, {n.name: n.op_type for n in model.graph.node})
        _name_arguments(module, model)
    buffer = io.BytesIO()
    module.write_bytecode(buffer)
    return ImportedOnnx(buffer.getvalue(), imp.parameters, unlowered, tuple(host_nodes))


# IREE's `--iree-input-type=onnx` pipeline is torch-mlir's ONNX->torch backend pipeline followed
# by IREE's `torch-to-iree`. We run both here, the second in the torch frontend's variant that
# ends in plain linalg functions, so PLeX can read the signature from IREE's ABI reflection.
_ONNX_TO_TORCH = "builtin.module(func.func(convert-torch-onnx-to-torch))"
_ONNX_TO_TORCH_BACKEND = "builtin.module(torch-onnx-to-torch-backend-pipeline)"


def _name_arguments(module: ir.Operation, model: onnx.ModelProto) -> None:
    """Carry ONNX input/output names into the signature (`iree.abi.name` shows in reflection)."""
    initialized = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initialized]
    outputs = [o.name for o in model.graph.output]
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name != "func.func":
            continue
        if ir.StringAttr(op.operation.attributes["sym_name"]).value != model.graph.name:
            continue
        with module.context:
            for key, names in (("arg_attrs", inputs), ("res_attrs", outputs)):
                op.operation.attributes[key] = ir.ArrayAttr.get(
                    [
                        ir.DictAttr.get({"iree.abi.name": ir.StringAttr.get(_abi_name(n))})
                        for n in names
                    ]
                )


def _abi_name(name: str) -> str:
    # PLeX parses names back from IREE's declaration string: keep them to [\w.$-].
    return re.sub(r"[^\w.$-]", "_", name) or "_"


def _unlowered_onnx_ops(module: ir.Operation) -> dict[str, str]:
    """Convert ONNX ops to torch ops in place; return {node: op} of those with no lowering."""
    _run(module, _ONNX_TO_TORCH, {})
    found: dict[str, str] = {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "torch.operator":
            op_name = ir.StringAttr(op.attributes["name"]).value
            if op_name.startswith("onnx."):
                found[node_of(op.location) or "?"] = op_name[len("onnx.") :]
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def _lower_to_linalg(module: ir.Operation, op_types: dict[str, str]) -> None:
    _run(module, _ONNX_TO_TORCH_BACKEND, op_types)
    _run(module, torch_to_linalg_pipeline(), op_types)


def _run(module: ir.Operation, pipeline: str, op_types: dict[str, str]) -> None:
    from iree.compiler.passmanager import PassManager

    with module.context:
        try:
            PassManager.parse(pipeline).run(module)
        except ir.MLIRError as e:
            error = CompileError(f"lowering the ONNX model failed: {_describe(e, op_types)}")
            # for host fallback: the node the failure names, else the one node left to blame
            error.node = _failing_node(e) or _sole_op_node(module, op_types)  # type: ignore[attr-defined]
            raise error from e


def _failing_node(error: ir.MLIRError) -> str | None:
    for diagnostic in error.error_diagnostics:
        node = node_of(diagnostic.location)
        if node:
            return node
    return None


def _sole_op_node(module: ir.Operation, op_types: dict[str, str] | None = None) -> str | None:
    """The node of the module's torch ops when exactly one node has any (constants aside).

    A conversion can fail on an op with no location (e.g. the `torch.constant.int` of a DFT
    whose axis is a constant), which names no node; the failed pass leaves the IR as it was,
    so in a model whose only non-constant node is that one, it is the node to blame. A pass
    that fails halfway leaves the node's ops partly lowered (RoiAlign: a
    `torch.torchvision.roi_align` next to linalg ops), so an op of any dialect located at a
    non-Constant node of `op_types` (node -> op type) counts too. With several candidates
    nothing is guessed (a guess would move a node that lowers to the host)."""
    op_types = op_types or {}
    nodes: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        node = node_of(op.location)
        if node and (
            op_types.get(node, "Constant") != "Constant"
            or op.name.startswith(("torch.aten.", "torch.prims.", "torch.operator"))
        ):
            nodes.add(node)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return next(iter(nodes)) if len(nodes) == 1 else None


def _describe(error: ir.MLIRError, op_types: dict[str, str]) -> str:
    """The first error diagnostic, with the ONNX node it came from."""
    for diagnostic in error.error_diagnostics:
        message = diagnostic.message.splitlines()[0]
        node = node_of(diagnostic.location)
        if node in op_types:
            return f"node {node!r} ({op_types[node]}): {message}"
        return message
    return _first_line(error)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
