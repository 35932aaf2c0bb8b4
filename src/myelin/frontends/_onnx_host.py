"""Host fallback: ONNX nodes IREE 3.13 cannot lower become calls into a host VM module.

Opt-in per graph (`[graph.x] host_fallback = true`). After the ONNX->torch conversion, every
`torch.operator "onnx.<Op>"` left (no lowering exists) is replaced by a call of an external
function `@plex_host.<module>_<n>`; IREE compiles it as a VM import taking and returning
buffer views. Each such node is also saved as a one-node ONNX model, which the runtime runs
with ONNX Runtime when the import is called (myelin.runtime.host_ops). A call costs a device
sync, a host round trip and the op on one CPU thread, so the build lists every fallen-back node
with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
from iree.compiler import ir

from myelin.signature import HOST_MODULE

# An op's location as the ONNX importer writes it: the name of the node it came from.
_NODE_LOCATION = re.compile(r'loc\("([^"]*)"')


def node_of(location: ir.Location) -> str | None:
    """The ONNX node an op (or a diagnostic) came from, by its location; None if unnamed."""
    m = _NODE_LOCATION.search(str(location))
    return m.group(1) if m else None


@dataclass(frozen=True)
class HostNode:
    """One ONNX node that runs on the host: its function, its one-node model, its signature."""

    function: str  # the import's name in HOST_MODULE
    node: str
    op_type: str
    model: bytes  # a one-node ONNX model: inputs are the call's arguments, in order
    inputs: tuple[str, ...]  # numpy dtype names of the arguments
    outputs: tuple[str, ...]  # numpy dtype names of the results

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "node": self.node,
            "op_type": self.op_type,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    types = {v.name: v.type for v in (*graph.input, *graph.output, *graph.value_info)}
    for t in graph.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, t.dims))
    return types


def _numpy_name(t: onnx.TypeProto) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type).name


def _one_node_model(
    model: onnx.ModelProto, node: onnx.NodeProto, inputs: list[str], types: dict
) -> bytes:
    """The node alone, as a model whose inputs are the non-empty node inputs."""
    graph = onnx.helper.make_graph(
        [node],
        f"host_{node.name or node.op_type}",
        [onnx.helper.make_value_info(n, types[n]) for n in inputs],
        [onnx.helper.make_value_info(n, types[n]) for n in node.output if n],
    )
    one = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    return one.SerializeToString()


def replace_with_host_calls(
    module: ir.Operation, model: onnx.ModelProto, module_name: str, wanted: set[str]
) -> list[HostNode]:
    """Replace the `torch.operator "onnx.*"` ops of the nodes in `wanted` (of the main graph)
    with calls of host functions; returns the nodes replaced, in order. Call on the imported
    IR, before the ONNX->torch conversion."""
    nodes = {n.name: n for n in model.graph.node}
    types = _value_types(model)
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = ir.StringAttr(op.attributes["name"]).value if op.name == "torch.operator" else ""
        if name.startswith("onnx."):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    host: list[HostNode] = []
    block = module.regions[0].blocks[0]
    with module.context:
        for i, op in enumerate(found):
            name = node_of(op.location) or ""
            node = nodes.get(name)
            if node is None or name not in wanted:
                continue  # not a node of the main graph (a subgraph's): left to fail loudly
            present = [n for n in node.input if n]
            operands = [v for v in op.operands if "vtensor" in str(v.type)]
            if len(operands) != len(present) or any(n not in types for n in present):
                continue
            if any(n not in types for n in node.output if n):
                continue
            # an omitted optional output (LSTM's Y when only Y_h is asked for) is a !torch.none
            # result: not a tensor of the call, the VM has no such type
            kept = [k for k, r in enumerate(op.results) if "vtensor" in str(r.type)]
            if len(kept) != len([n for n in node.output if n]):
                continue
            function = f"{module_name}_{i}"
            symbol = f"{HOST_MODULE}.{function}"
            arg_types = [v.type for v in operands]
            result_types = [op.results[k].type for k in kept]
            declaration = ir.Operation.create(
                "func.func",
                attributes={
                    "sym_name": ir.StringAttr.get(symbol),
                    "function_type": ir.TypeAttr.get(ir.FunctionType.get(arg_types, result_types)),
                    "sym_visibility": ir.StringAttr.get("private"),
                },
                regions=1,
                loc=op.location,
            )
            # the ONNX->torch pass reads the opset of every function, declarations included
            parent = op.parent
            while parent is not None and parent.name != "func.func":
                parent = parent.parent
            if parent is not None:
                for i in range(len(parent.attributes)):
                    attr = parent.attributes[i]
                    if attr.name.startswith("torch.onnx_meta."):
                        declaration.attributes[attr.name] = attr.attr
            ir.InsertionPoint.at_block_begin(block).insert(declaration)
            call = ir.Operation.create(
                "func.call",
                results=result_types,
                operands=list(operands),
                attributes={"callee": ir.FlatSymbolRefAttr.get(symbol)},
                loc=op.location,
            )
            ir.InsertionPoint(op).insert(call)
            for k, new in zip(kept, call.results, strict=True):
                op.results[k].replace_all_uses_with(new)
            for k, result in enumerate(op.results):
                if k not in kept:
                    none = ir.Operation.create(
                        "torch.constant.none", results=[result.type], loc=op.location
                    )
                    ir.InsertionPoint(op).insert(none)
                    result.replace_all_uses_with(none.result)
            op.erase()
            host.append(
                HostNode(
                    function=function,
                    node=name,
                    op_type=node.op_type,
                    model=_one_node_model(model, node, present, types),
                    inputs=tuple(_numpy_name(types[n]) for n in present),
                    outputs=tuple(_numpy_name(types[n]) for n in node.output if n),
                )
            )
    return host
