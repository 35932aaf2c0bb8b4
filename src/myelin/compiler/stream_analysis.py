"""What a compiled function will allocate and how Stream scheduled it, read from its Stream IR.

At the `stream` phase every allocation a call makes is an explicit `stream.resource.alloca`
(queue-ordered: the allocations IREE's allocator statistics do not count) whose size is plain
index arithmetic on the arguments' dims. Walking that arithmetic back to `hal.buffer_view.dim`
gives each function's transient and result bytes as a formula of its input shapes, which the
build records in the .mln and the runtime evaluates before a call (admission control). The same
walk counts `stream.cmd.concurrent` regions, which is how `scheduling.favor` shows in the IR.

Size formulas use the JSON form of `myelin.size_formulas` (which the runtime's admission
evaluates): an integer, `["dim", i, a]` (axis a of input i) or `[op, x, y]` with op in
`SIZE_OPS`. Anything else (a size read from device data, an allocation in a loop) makes the
formula unknown, with the reason, never a guess.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from iree.compiler import ir

from myelin.compiler.scheduling import DEFAULT_FAVOR, favor_attributes
from myelin.compiler.session import CompilerSession
from myelin.size_formulas import SIZE_OPS, SizeExpr, add_sizes, evaluate_size

STREAM_PHASE = "stream"

# arith/util ops -> formula op; casts pass their operand through.
_BINARY = {
    "arith.addi": "add",
    "arith.subi": "sub",
    "arith.muli": "mul",
    "arith.divui": "div",
    "arith.divsi": "div",
    "arith.floordivsi": "div",
    "arith.ceildivui": "ceildiv",
    "arith.ceildivsi": "ceildiv",
    "arith.remui": "rem",
    "arith.remsi": "rem",
    "arith.maxui": "max",
    "arith.maxsi": "max",
    "arith.minui": "min",
    "arith.minsi": "min",
    "util.align": "align",
}
_PASS_THROUGH = {
    "arith.index_cast",
    "arith.index_castui",
    "arith.extui",
    "arith.extsi",
    "arith.trunci",
    "util.assume.int",
}
_LOOPS = {"scf.for", "scf.while", "scf.forall"}
assert set(_BINARY.values()) <= set(SIZE_OPS)


class UnknownSize(Exception):
    """A size the formula language cannot express; the message says why."""


@dataclass(frozen=True)
class CallFootprint:
    """What one call of a public function allocates and how Stream scheduled it."""

    name: str
    transient: SizeExpr | None  # bytes of transient allocations; None: unknown (see `unknown`)
    results: SizeExpr | None  # bytes of result allocations
    parameters: tuple[tuple[str, str], ...]  # (scope, key) of every parameter it reads
    executes: int  # stream.cmd.execute regions (queue submissions)
    dispatches: int
    concurrent: tuple[int, ...]  # width (dispatch count) of each stream.cmd.concurrent region
    unknown: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "transient": self.transient,
            "results": self.results,
            "parameters": [list(p) for p in self.parameters],
            "schedule": {
                "executes": self.executes,
                "dispatches": self.dispatches,
                "concurrent": list(self.concurrent),
            },
            **({"unknown": self.unknown} if self.unknown else {}),
        }


@dataclass
class _Walk:
    transient: list[SizeExpr] = field(default_factory=list)
    results: list[SizeExpr] = field(default_factory=list)
    globals_read: set[str] = field(default_factory=set)
    executes: int = 0
    dispatches: int = 0
    concurrent: list[int] = field(default_factory=list)
    unknown: str | None = None


def stream_footprints(
    module_bytecode: bytes,
    *,
    phase: str,
    flags: Sequence[str],
    favor: str = DEFAULT_FAVOR,
    functions: Sequence[str] | None = None,
    what: str = "module",
) -> tuple[dict[str, CallFootprint], str]:
    """Compile imported IR from `phase` through the Stream phase and read its functions'
    footprints, for tests and tools; a build reads them on the way of its one compile
    (`myelin.compiler.pipeline.compile_module`). Returns them and the Stream IR as text.
    """
    with CompilerSession(flags) as session:
        module = session.parse(module_bytecode, what=what)
        with session.context:
            for name, text in favor_attributes(favor).items():
                module.attributes[name] = ir.Attribute.parse(text)
        # The module stays in memory: IREE 3.13 cannot parse back the `stream.partitioning`
        # attribute it prints, so a bytecode or text round trip of such a module fails.
        stream = session.advance(module, compile_from=phase, compile_to=STREAM_PHASE, what=what)
        with session.context:
            return call_footprints(stream, functions), str(stream)


def call_footprints(
    module: Any, functions: Sequence[str] | None = None
) -> dict[str, CallFootprint]:
    """Footprints of the public functions (or just `functions`) of a Stream-phase module op."""
    top = list(module.regions[0].blocks[0].operations)
    parameters = _parameter_globals(top)
    funcs = {_sym(op): op for op in top if op.operation.name == "util.func"}
    plans = {}
    for name, op in funcs.items():
        if functions is not None and name not in functions:
            continue
        if not _is_public(op) or name.startswith("__"):
            continue
        plans[name] = _footprint(name, op, funcs, parameters)
    return plans


def _footprint(
    name: str, func: Any, funcs: dict[str, Any], parameters: dict[str, tuple[str, str]]
) -> CallFootprint:
    walk = _Walk()
    args = list(func.regions[0].blocks[0].arguments)
    _walk_function(func, walk, args, funcs, set())
    reads = sorted({parameters[g] for g in walk.globals_read if g in parameters})
    known = walk.unknown is None
    return CallFootprint(
        name=name,
        transient=add_sizes(walk.transient) if known else None,
        results=add_sizes(walk.results) if known else None,
        parameters=tuple(reads),
        executes=walk.executes,
        dispatches=walk.dispatches,
        concurrent=tuple(walk.concurrent),
        unknown=walk.unknown,
    )


def _walk_function(
    func: Any, walk: _Walk, args: list, funcs: dict[str, Any], visiting: set[str]
) -> None:
    blocks = list(func.regions[0].blocks)
    if len(blocks) > 1 and walk.unknown is None:
        walk.unknown = f"@{_sym(func)} has control flow across blocks"
    for op in _ops(func.operation):
        name = op.operation.name
        if name in _LOOPS and walk.unknown is None:
            walk.unknown = f"@{_sym(func)} allocates inside a loop ({name})"
        elif name in ("stream.resource.alloca", "stream.resource.alloc"):
            _record_alloc(op, walk, args)
        elif name == "util.global.load":
            walk.globals_read.add(_symbol_ref(op.operation.attributes["global"]))
        elif name == "stream.cmd.execute":
            walk.executes += 1
        elif name == "stream.cmd.dispatch":
            walk.dispatches += 1
        elif name == "stream.cmd.concurrent":
            width = sum(1 for o in _ops(op.operation) if o.operation.name == "stream.cmd.dispatch")
            walk.concurrent.append(width)
        elif name == "util.call":
            callee = _symbol_ref(op.operation.attributes["callee"])
            target = funcs.get(callee)
            if target is None or callee in visiting:
                if walk.unknown is None:
                    walk.unknown = f"calls @{callee}, which cannot be analyzed"
                continue
            # A callee's sizes refer to its own arguments: only static ones carry over.
            inner = _Walk()
            _walk_function(target, inner, [], funcs, visiting | {callee})
            walk.transient += inner.transient
            walk.results += inner.results
            walk.globals_read |= inner.globals_read
            walk.executes += inner.executes
            walk.dispatches += inner.dispatches
            walk.concurrent += inner.concurrent
            if inner.unknown and walk.unknown is None:
                walk.unknown = inner.unknown


def _record_alloc(op: Any, walk: _Walk, args: list) -> None:
    result_type = str(op.operation.results[0].type)
    # The size is the one `index` operand; under the async-external execution model (fences)
    # the allocation also awaits a timepoint.
    sizes = [v for v in op.operation.operands if str(v.type) == "index"]
    if len(sizes) != 1:
        if walk.unknown is None:
            walk.unknown = f"{op.operation.name} with {len(sizes)} size operands"
        return
    try:
        size = _size_of(sizes[0], args)
    except UnknownSize as e:
        if walk.unknown is None:
            walk.unknown = str(e)
        return
    (walk.results if "<external>" in result_type else walk.transient).append(size)


def _size_of(value: Any, args: list, depth: int = 0) -> SizeExpr:
    if depth > 64:
        raise UnknownSize("a size formula is too deep")
    op = _defining_op(value)
    if op is None:
        raise UnknownSize("a size comes from a function argument that is not a tensor dim")
    name = op.name
    if name == "arith.constant":
        return int(ir.IntegerAttr(op.attributes["value"]).value)
    if name == "hal.buffer_view.dim":
        view = op.operands[0]
        for i, arg in enumerate(args):
            if view == arg:
                return ["dim", i, int(ir.IntegerAttr(op.attributes["index"]).value)]
        raise UnknownSize("a size depends on a buffer that is not an input")
    if name in _PASS_THROUGH:
        return _size_of(op.operands[0], args, depth + 1)
    if name == "arith.select":  # either branch may run: take the larger
        a = _size_of(op.operands[1], args, depth + 1)
        b = _size_of(op.operands[2], args, depth + 1)
        return _fold("max", a, b)
    if name in _BINARY:
        a = _size_of(op.operands[0], args, depth + 1)
        b = _size_of(op.operands[1], args, depth + 1)
        return _fold(_BINARY[name], a, b)
    raise UnknownSize(f"a size is computed by {name}, which the formula language lacks")


def _fold(op: str, a: SizeExpr, b: SizeExpr) -> SizeExpr:
    if isinstance(a, int) and isinstance(b, int):
        return evaluate_size([op, a, b], ())
    if op == "mul" and (a == 1 or b == 1):
        return b if a == 1 else a
    if op == "add" and (a == 0 or b == 0):
        return b if a == 0 else a
    return [op, a, b]


def _parameter_globals(top: list) -> dict[str, tuple[str, str]]:
    """Global name -> (scope, key) for parameters that initializers load into globals."""
    found: dict[str, tuple[str, str]] = {}
    for init in top:
        if init.operation.name != "util.initializer":
            continue
        loaded: dict[Any, tuple[str, str]] = {}  # SSA value -> (scope, key)
        for op in _ops(init.operation):
            name = op.operation.name
            if name == "stream.cmd.parameter.load":
                _parameter_load(op.operation, loaded)
            elif name == "stream.timepoint.await":
                operands = list(op.operation.operands)
                for i, result in enumerate(op.operation.results):
                    if i < len(operands) and operands[i] in loaded:
                        loaded[result] = loaded[operands[i]]
            elif name == "util.global.store":
                value = op.operation.operands[0]
                if value in loaded:
                    found[_symbol_ref(op.operation.attributes["global"])] = loaded[value]
    return found


def _parameter_load(op: Any, loaded: dict[Any, tuple[str, str]]) -> None:
    segments = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    operands = list(op.operands)
    n_scope, n_keys = segments[0], segments[1]
    scope = _buffer_constant(operands[0]) if n_scope else ""
    keys = [_buffer_constant(v) for v in operands[n_scope : n_scope + n_keys]]
    for result, key in zip(list(op.results)[: len(keys)], keys, strict=True):
        if scope is not None and key is not None:
            loaded[result] = (scope, key)


def _buffer_constant(value: Any) -> str | None:
    op = _defining_op(value)
    if op is None or op.name != "util.buffer.constant":
        return None
    return ir.StringAttr(op.attributes["value"]).value


def _defining_op(value: Any) -> Any:
    """The operation that defines `value`, or None for a block argument."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _ops(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _ops(inner.operation)


def _sym(op: Any) -> str:
    return ir.StringAttr(op.operation.attributes["sym_name"]).value


def _is_public(op: Any) -> bool:
    attrs = op.operation.attributes
    return "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"


def _symbol_ref(attr: Any) -> str:
    return ir.FlatSymbolRefAttr(attr).value
