"""Use analysis: where each use of a parameter's value ends up. A use is followed through
pure layout ops (linalg.transpose, linalg.broadcast, copy-only linalg.generic, each with one use)
to the op that really consumes the weight, and classified: a contraction (with the logical axes
it contracts and the order its operand reads them), a gather (`tensor.extract` of elements) or
anything else. The codec's layout choice (`reduce_axes_of`, `storage_order_of`) and every
emitter read these answers; nothing here changes the IR."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from iree.compiler import ir
from iree.compiler.dialects import linalg

# A loop dim in an affine expression: d0, d1, ...
DIM = re.compile(r"d([0-9]+)")


@dataclass
class Use:
    """Where one use of a parameter's value ends up after its layout ops."""

    kind: str  # "contraction" | "gather" | "other"
    consumer: str  # op name, for reports
    reduce_axes: tuple[int, ...] | None  # logical axes the consumer contracts (None: unknown)
    order: tuple[int, ...] = ()  # logical axes in the order the consumer's operand has them


@dataclass
class UseReport:
    """What the rewrite did with one parameter, for the build record."""

    uses: list[str] = field(default_factory=list)  # one entry per use: "contraction linalg.matmul"


def module_globals(module: ir.Operation) -> dict[str, ir.Operation]:
    found = {}
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "util.global":
            found[ir.StringAttr(op.operation.attributes["sym_name"]).value] = op.operation
    return found


def symbol_users(module: ir.Operation) -> dict[str, list[ir.Operation]]:
    """global name -> ops that name it in a `global` attribute (loads, stores, addresses)."""
    users: dict[str, list[ir.Operation]] = {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name != "util.global" and "global" in op.attributes:
            attr = op.attributes["global"]
            if isinstance(attr, ir.FlatSymbolRefAttr):
                users.setdefault(attr.value, []).append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return users


def _dense_i64(attr: ir.Attribute) -> list[int]:
    return [int(v) for v in ir.DenseI64ArrayAttr(attr)]


def map_dims(m: ir.AffineMap) -> list[int] | None:
    """The loop dim of each result, if every result is a plain dim."""
    dims = []
    for e in m.results:
        match = DIM.fullmatch(str(e))
        if match is None:
            return None
        dims.append(int(match.group(1)))
    return dims


def _segments(op: ir.Operation) -> tuple[int, int]:
    sizes = [int(v) for v in ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])]
    return sizes[0], sizes[1]


def _is_copy_generic(op: ir.Operation) -> bool:
    if op.name != "linalg.generic" or _segments(op) != (1, 1):
        return False
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in it for it in iterators):
        return False
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 1 or body[0].operation.name != "linalg.yield":
        return False
    if body[0].operation.operands[0] != block.arguments[0]:
        return False
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    out = map_dims(maps[1])
    return out == list(range(maps[1].n_dims)) and map_dims(maps[0]) is not None


def _layout_step(op: ir.Operation, operand: int, src: list[int]) -> list[int] | None:
    """`src` (logical dim -> dim of the op's input) carried to the op's result, if `op` only
    moves data (a transpose, a broadcast, a copy); None otherwise."""
    if operand != 0 or len(op.results) != 1:
        return None
    if op.name == "linalg.transpose":
        perm = _dense_i64(op.attributes["permutation"])
        inverse = [0] * len(perm)
        for i, p in enumerate(perm):
            inverse[p] = i
        return [inverse[s] for s in src]
    if op.name == "linalg.broadcast":
        added = set(_dense_i64(op.attributes["dimensions"]))
        rank = ir.RankedTensorType(op.results[0].type).rank
        kept = [d for d in range(rank) if d not in added]
        return [kept[s] for s in src]
    if _is_copy_generic(op):
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        loops = map_dims(maps[0])
        assert loops is not None
        return [loops[s] for s in src]
    return None


@dataclass
class Chain:
    value: ir.Value  # what the consumer reads
    consumer: ir.Operation
    operand: int  # which operand of the consumer
    src: list[int]  # logical dim l is dim src[l] of `value`
    ops: list[ir.Operation]  # layout ops between the load and the consumer, in order


def _only_use(value: ir.Value) -> tuple[ir.Operation, int] | None:
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    return uses[0].owner, uses[0].operand_number


def follow(value: ir.Value, owner: ir.Operation, operand: int, rank: int) -> Chain:
    src = list(range(rank))
    ops: list[ir.Operation] = []
    while True:
        step = _layout_step(owner, operand, src)
        if step is None:
            break
        nxt = _only_use(owner.results[0])
        if nxt is None:
            break
        ops.append(owner)
        value, src = owner.results[0], step
        owner, operand = nxt
    return Chain(value, owner, operand, src, ops)


def opview(op: ir.Operation):
    return op.opview


def reduction_loops(op: ir.Operation) -> set[int] | None:
    """Reduction loop dims of a linalg op, or None if it is not a contraction-like op."""
    if op.name == "linalg.generic":
        iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        loops = {i for i, it in enumerate(iterators) if "reduction" in it}
        return loops or None
    if not op.name.startswith("linalg."):
        return None
    try:
        view = opview(op)
        if linalg.isa_contraction_op(view):
            dims = linalg.infer_contraction_dimensions(view)
            return set(dims.k) or None
        if linalg.isa_convolution_op(view):
            dims = linalg.infer_convolution_dimensions(view)
            return set(dims.filter_loop) | set(dims.input_channel) or None
    except (TypeError, ValueError, RuntimeError):
        return None
    return None


def dps_inputs(op: ir.Operation) -> int:
    if "operandSegmentSizes" in op.attributes:
        return _segments(op)[0]
    return len(op.operands) - len(op.results)


def classify(chain: Chain) -> Use:
    consumer = chain.consumer
    name = consumer.name
    if name == "tensor.extract" and chain.operand == 0:
        rank = len(chain.src)
        return Use("gather", name, (rank - 1,) if rank else ())
    loops = reduction_loops(consumer) if name.startswith("linalg.") else None
    if loops is not None and chain.operand < dps_inputs(consumer):
        try:
            maps = linalg.get_indexing_maps(opview(consumer))
        except (TypeError, ValueError, RuntimeError):
            maps = None
        if maps is not None:
            dims = map_dims(ir.AffineMapAttr(maps[chain.operand]).value)
            axes = None
            if dims is not None:
                axes = tuple(d for d, s in enumerate(chain.src) if dims[s] in loops)
            order = tuple(sorted(range(len(chain.src)), key=lambda d: chain.src[d]))
            return Use("contraction", name, axes, order)
    return Use("other", name, None)


def analyze(module: ir.Operation, names: list[str]) -> dict[str, list[Use] | str]:
    """Per global: how each use of it is consumed, or why it cannot be encoded."""
    users = symbol_users(module)
    globals_ = module_globals(module)
    result: dict[str, list[Use] | str] = {}
    for name in names:
        rank = ir.RankedTensorType(ir.TypeAttr(globals_[name].attributes["type"]).value).rank
        ops = users.get(name, [])
        other = sorted({op.name for op in ops if op.name != "util.global.load"})
        if other:
            result[name] = f"the graph uses it through {', '.join(other)}, not only loads"
            continue
        uses: list[Use] = []
        for load in ops:
            for use in list(load.results[0].uses):
                uses.append(classify(follow(load.results[0], use.owner, use.operand_number, rank)))
        result[name] = uses
    return result


def storage_order_of(uses: list[Use], rank: int) -> tuple[int, ...]:
    """The axis order to store a parameter's data in: the one its (first) contraction reads,
    so its decode streams the bytes in order; the logical order for a table that is gathered
    (rows stay contiguous) or a parameter no contraction reads."""
    if any(u.kind == "gather" for u in uses):
        return tuple(range(rank))
    for u in uses:
        if u.kind == "contraction" and u.order:
            return u.order
    return tuple(range(rank))


def reduce_axes_of(uses: list[Use], rank: int) -> tuple[int, ...]:
    """The axes a codec should share scales along: those the consumers contract (the first
    contraction's if they differ), else the last axis (rows stay addressable)."""
    for u in uses:
        if u.kind == "contraction" and u.reduce_axes:
            return u.reduce_axes
    return (rank - 1,) if rank else ()


def indexing_maps(op: ir.Operation) -> list[ir.AffineMap] | None:
    """`op`'s indexing maps (a linalg structured op), or None for an op without them."""
    try:
        return [ir.AffineMapAttr(m).value for m in linalg.get_indexing_maps(op.opview)]
    except (TypeError, ValueError, RuntimeError):
        return None
