"""Weights as named parameters: the IR side.

Two ways weights arrive in a graph: as inline constants (which PLeX moves out of the module into
.mln parameter sections), or as `util.global`s already bound to `#flow.parameter.named` (whose
values come from a weights package). Either way the compiled module reads them through IREE's
io_parameters provider, so the weights never live inside the VM bytecode.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from iree.compiler import ir
from iree.compiler.passmanager import PassManager

from myelin.dtypes import MLIR_TO_NUMPY
from myelin.errors import CompileError

_NAMED = re.compile(
    r'#(?:flow|stream)\.parameter\.named<(?:"(?P<scope>[^"]*)"::)?"(?P<key>[^"]*)">(?:\s*:.*)?'
)


@dataclass(frozen=True)
class ParameterRef:
    """A parameter the compiled module will ask its provider for."""

    scope: str
    key: str
    dtype: str
    shape: tuple[int, ...]
    global_name: str

    @property
    def nbytes(self) -> int:
        from myelin.dtypes import itemsize

        return int(np.prod(self.shape, dtype=np.int64)) * itemsize(self.dtype)


def _tensor_dtype_shape(t: ir.Type, where: str) -> tuple[str, tuple[int, ...]]:
    if not isinstance(t, ir.RankedTensorType):
        raise CompileError(f"{where}: parameter global must be a ranked tensor, got {t}")
    element = str(t.element_type)
    if element not in MLIR_TO_NUMPY:
        raise CompileError(f"{where}: unsupported parameter element type {element}")
    if not t.has_static_shape:
        raise CompileError(f"{where}: parameter global must have a static shape, got {t}")
    return MLIR_TO_NUMPY[element], tuple(int(d) for d in t.shape)


def _globals(module: ir.Operation) -> Iterator[ir.Operation]:
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "util.global":
            yield op.operation


def named_parameters(module: ir.Operation) -> list[ParameterRef]:
    """Every util.global bound to a named parameter, in module order."""
    refs = []
    for g in _globals(module):
        if "initial_value" not in g.attributes:
            continue
        m = _NAMED.fullmatch(str(g.attributes["initial_value"]))
        if m is None:
            continue
        name = ir.StringAttr(g.attributes["sym_name"]).value
        t = ir.TypeAttr(g.attributes["type"]).value
        dtype, shape = _tensor_dtype_shape(t, f"global @{name}")
        refs.append(ParameterRef(m.group("scope") or "", m.group("key"), dtype, shape, name))
    return refs


def outline_constants(module: ir.Operation, *, min_bytes: int) -> int:
    """Move large non-splat tensor constants out of functions into private util.globals.

    IREE's export pass only exports util.global initial values, and its own outlining pass only
    handles flow.tensor.constant, so inline `arith.constant` weights need this step first. Runs on
    the input-phase IR (where StableHLO constants are already arith.constant).
    Returns the number of constants moved.
    """
    candidates: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "arith.constant":
            value = op.attributes["value"]
            t = op.results[0].type
            if (
                isinstance(t, ir.RankedTensorType)
                and isinstance(value, ir.DenseElementsAttr)
                and not value.is_splat
                and _nbytes(t) >= min_bytes
            ):
                candidates.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    body = module.regions[0].blocks[0]
    existing = {ir.StringAttr(g.attributes["sym_name"]).value for g in _globals(module)}
    counter = 0
    with module.context, ir.Location.unknown():
        for op in candidates:
            while f"constant_{counter}" in existing:
                counter += 1
            name = f"constant_{counter}"
            existing.add(name)
            t = op.results[0].type
            with ir.InsertionPoint.at_block_begin(body):
                ir.Operation.create(
                    "util.global",
                    attributes={
                        "sym_name": ir.StringAttr.get(name),
                        "sym_visibility": ir.StringAttr.get("private"),
                        "type": ir.TypeAttr.get(t),
                        "initial_value": op.attributes["value"],
                    },
                )
            with ir.InsertionPoint(op):
                load = ir.Operation.create(
                    "util.global.load",
                    results=[t],
                    attributes={
                        "global": ir.FlatSymbolRefAttr.get(name),
                        "is_immutable": ir.UnitAttr.get(),
                    },
                )
            op.results[0].replace_all_uses_with(load.results[0])
            op.erase()
    return len(candidates)


def _nbytes(t: ir.RankedTensorType) -> int:
    if not t.has_static_shape:
        return 0
    bits = t.element_type.width if hasattr(t.element_type, "width") else 32
    return int(np.prod(t.shape, dtype=np.int64)) * max(bits, 8) // 8


def export_parameters(module: ir.Operation, *, scope: str, min_bytes: int) -> dict[str, bytes]:
    """Run IREE's `iree-io-export-parameters` pass in process and return {key: raw bytes}.

    The pass rewrites every util.global initial value of at least `min_bytes` into
    `#flow.parameter.named<scope::name>` and writes the values to an .irpa archive, which we read
    back through the runtime's parameter index (it understands every attribute encoding,
    including dense resources) and then delete.
    """
    import iree.runtime as rt

    with tempfile.TemporaryDirectory(prefix="plex-export-") as tmp:
        archive = Path(tmp) / "exported.irpa"
        pipeline = (
            "builtin.module(iree-io-export-parameters"
            f"{{path={scope}={archive} minimum-size={min_bytes}}})"
        )
        with module.context:
            try:
                PassManager.parse(pipeline).run(module)
            except Exception as e:  # MLIRError carries the diagnostics
                raise CompileError(f"exporting weights to parameters failed: {e}") from e
        if not archive.exists():
            return {}
        index = rt.ParameterIndex()
        index.load(str(archive))
        values = {}
        for key, entry in index.items():
            if entry.is_splat:
                raise CompileError(f"parameter {key!r} was exported as a splat; not supported")
            values[key] = bytes(entry.file_view)
        del index  # unmap before the archive is deleted
        return values
