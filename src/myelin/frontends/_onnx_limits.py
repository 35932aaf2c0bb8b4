"""Largest sizes of an ONNX graph's dynamic input dims, where the graph slices a stored table up
to that size (BERT's `position_ids[:, :seq]`, exported as `Slice(table, 0, Shape(input_ids)[1])`).

ONNX clamps a slice's end to the table, so past the table's length the slice comes out short and
the ops after it combine tensors of different sizes: onnxruntime fails there (`Attempting to
broadcast an axis by a dimension other than 1. 128 by 129`), while IREE, which compiles without
broadcast checks, returns finite garbage. The IR analysis (myelin.compiler.index_ranges) cannot
see this bound once the slice is lowered (the clamp makes every size valid there), so it is read
here from the ONNX graph and recorded as the dim's limit; the runtime refuses larger sizes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# ops that pass one-element shape values through unchanged
_PASS_THROUGH = {"Unsqueeze", "Squeeze", "Cast", "Identity", "Reshape"}


def sliced_table_limits(model: onnx.ModelProto) -> dict[str, dict[int, list]]:
    """Graph input name -> {axis -> [largest size, why]} for dynamic dims that bound the end of
    a Slice of a constant table (start a constant, step 1): the size is the table's length there
    minus the start."""
    graph = model.graph
    # stored tensors by name; only small ones (indices, axes) are ever read, so a model's
    # weights, in memory or in external data files, are never loaded here
    stored = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            stored[node.output[0]] = node.attribute[0].t
    constants = _SmallConstants(stored)
    producers = {out: node for node in graph.node for out in node.output}
    dynamic = _dynamic_dims(graph)

    def dim_of(value: str) -> tuple[str, int] | None:
        """(graph input, axis) when `value` is one element of a graph input's shape."""
        node = producers.get(value)
        if node is None:
            return None
        if node.op_type in _PASS_THROUGH:
            return dim_of(node.input[0])
        if node.op_type != "Gather" or node.input[1] not in constants:
            return None
        shape = producers.get(node.input[0])
        index = constants[node.input[1]]
        if shape is None or shape.op_type != "Shape" or index.size != 1:
            return None
        start = next((a.i for a in shape.attribute if a.name == "start"), 0)
        key = (shape.input[0], start + int(index.ravel()[0]))
        return key if key in dynamic else None

    limits: dict[str, dict[int, list]] = {}
    for node in graph.node:
        if node.op_type != "Slice" or len(node.input) < 3 or node.input[0] not in stored:
            continue
        table = tuple(stored[node.input[0]].dims)
        parts = [constants.get(v) if v else None for v in node.input[1:5]]
        starts, axes, steps = parts[0], _part(parts, 2), _part(parts, 3)
        if starts is None or starts.size != 1:
            continue  # one sliced axis: the form position tables are exported in
        axis = int(axes.ravel()[0]) if axes is not None else 0
        if steps is not None and int(steps.ravel()[0]) != 1:
            continue
        found = dim_of(node.input[2])
        start = int(starts.ravel()[0])
        if found is None or not table or not 0 <= start < table[axis % len(table)]:
            continue
        name, input_axis = found
        largest = table[axis % len(table)] - start
        why = (
            f"positions along it are sliced from a stored table ({node.input[0]}, node "
            f"{node.name!r}) of {largest} entries; past that the slice comes out short "
            "(onnxruntime fails there)"
        )
        known = limits.setdefault(name, {}).get(input_axis)
        if known is None or largest < known[0]:
            limits[name][input_axis] = [largest, why]
    return limits


class _SmallConstants:
    """name -> the value of a stored integer tensor of at most 8 elements (None otherwise)."""

    def __init__(self, stored: dict[str, onnx.TensorProto]) -> None:
        self._stored = stored

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __getitem__(self, name: str) -> np.ndarray:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str) -> np.ndarray | None:
        tensor = self._stored.get(name)
        if (
            tensor is None
            or tensor.data_location == onnx.TensorProto.EXTERNAL
            or tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
            or int(np.prod(tensor.dims)) > 8
        ):
            return None
        return numpy_helper.to_array(tensor)


def _part(parts: list[np.ndarray | None], index: int) -> np.ndarray | None:
    return parts[index] if index < len(parts) else None


def _dynamic_dims(graph: onnx.GraphProto) -> set[tuple[str, int]]:
    initializers = {t.name for t in graph.initializer}
    found = set()
    for value in graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                found.add((value.name, axis))
    return found
