"""The no-materialization check: after IREE's dispatch-creation phase, no dispatch may compute a
decoded weight on its own.

A dispatch that reads a parameter's stored parts and no activation (only parameters and
constants) can only be producing a weight-derived tensor; when it writes a floating-point tensor
at least as large as the parameter, that is the decoded weight materialized in memory (per call,
or once in an initializer if IREE hoisted it). A decode fused into its consumer's dispatch reads
the consumer's activation too, so it never matches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAMED = re.compile(
    r'#(?:flow|stream)\.parameter\.named<(?:"(?P<scope>[^"]*)"::)?"(?P<key>[^"]*)">'
)
_PASS_THROUGH = ("flow.tensor.reshape", "flow.tensor.bitcast", "tensor.cast")


@dataclass(frozen=True)
class Materialization:
    """A dispatch that decodes parameters without their consumer."""

    parameters: tuple[str, ...]  # "scope::key" of the logical parameters it decodes
    function: str  # the function or initializer holding the dispatch
    writes: str  # the tensor type it writes
    # chosen, not a failure: a data-tiled variant decodes these at load into the packed layout
    # (myelin.codecs._loadtime), in an initializer
    at_load: bool = False

    def message(self) -> str:
        names = ", ".join(self.parameters)
        if self.at_load:
            return (
                f"parameter {names}: decoded once at load into data tiling's packed layout "
                f"(writes {self.writes} in {self.function})"
            )
        return (
            f"parameter {names}: its decode is not fused into the consumer; a dispatch in "
            f"{self.function} writes the decoded {self.writes} (the full-precision weight "
            "exists in memory)"
        )


def _root(value):  # -> (kind, detail)
    from iree.compiler import ir

    while True:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return "activation", None
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name in _PASS_THROUGH:
            value = op.operands[0]
            continue
        if op.name == "flow.tensor.constant":
            m = _NAMED.search(str(op.attributes["value"]))
            if m:
                return "parameter", (m.group("scope") or "", m.group("key"))
            return "constant", None
        if op.name in ("arith.constant", "util.global.load"):
            return "constant", None
        return "activation", None


def _static_count(t) -> int:
    n = 1
    for d in range(t.rank):
        if not t.is_dynamic_dim(d):
            n *= t.get_dim_size(d)
    return n


def find_materializations(
    module,
    parts: Mapping[tuple[str, str], str],
    sizes: Mapping[str, int],
    at_load: frozenset[str] = frozenset(),
) -> list[Materialization]:
    """Dispatches of `module` (dispatch-creation IR) that decode on their own.

    `parts` maps each stored part (scope, key) to its logical parameter ("scope::key");
    `sizes` maps a logical parameter to its element count; `at_load` names the parameters
    meant to decode at load (their dispatches in initializers are marked `at_load`).
    """
    from iree.compiler import ir

    found: list[Materialization] = []
    dispatches: list = []

    def visit(op):
        if op.name == "flow.dispatch.workgroups":
            dispatches.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for op in dispatches:
        decoded: set[str] = set()
        reads_activation = False
        for v in op.operands:
            if not isinstance(v.type, ir.RankedTensorType):
                continue
            kind, detail = _root(v)
            if kind == "activation":
                reads_activation = True
            elif kind == "parameter" and detail in parts:
                decoded.add(parts[detail])
        if not decoded or reads_activation:
            continue
        smallest = min(sizes[p] for p in decoded)
        for result in op.results:
            t = ir.RankedTensorType(result.type)
            if isinstance(t.element_type, ir.FloatType) and _static_count(t) >= smallest:
                where = _function_of(op)
                expected = where == _INITIALIZER and decoded <= at_load
                found.append(Materialization(tuple(sorted(decoded)), where, str(t), expected))
                break
    return found


_INITIALIZER = "an initializer (IREE hoisted it to load time)"


def _function_of(op) -> str:
    parent = op.parent
    while parent is not None:
        name = parent.operation.name
        if name in ("util.func", "func.func"):
            return "@" + str(parent.operation.attributes["sym_name"]).strip('"')
        if name == "util.initializer":
            return _INITIALIZER
        parent = parent.operation.parent
    return "the module"


def check_encoded_module(
    module_bytecode: bytes,
    flags: Sequence[str],
    parts: Mapping[tuple[str, str], str],
    sizes: Mapping[str, int],
    *,
    devices: Sequence[Any] = (),
    what: str = "graph",
    text: list[str] | None = None,
) -> list[Materialization]:
    """Compile an encoded input-phase module to dispatch-creation with a variant's flags and
    return the dispatches that materialize a decoded weight. The codec's choices are made for
    the variant's `devices` as the compile step makes them (`myelin.codecs.finalize`): on a
    data-tiled variant the load-time forms stay, and their decodes in initializers come back
    marked `at_load`; where the AVX2 kernel applies it takes the q4 matvecs. With `text`, the
    dispatch-creation IR is appended to it as text (tests and debugging read it)."""
    from myelin.codecs._finalize import finalize
    from myelin.compiler.session import CompilerSession

    with CompilerSession(flags) as session:
        module = session.parse(module_bytecode, what=what)
        with session.context:
            at_load = frozenset(finalize(module, devices).decoded_at_load)
        ir_bytes, _ = session.compile(
            module, compile_from="input", compile_to="dispatch-creation", what=what
        )
        dispatched = session.parse(ir_bytes, what=f"{what} at dispatch-creation")
        with session.context:
            if text is not None:
                text.append(str(dispatched))
            return find_materializations(dispatched, parts, sizes, at_load)
