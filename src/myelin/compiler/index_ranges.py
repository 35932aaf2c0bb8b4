"""Valid ranges of integer inputs that index a table: found at build time on the imported IR.

IREE does not bounds-check a `tensor.extract` (the form every embedding lookup and gather takes
by the `input` phase, from torch, ONNX, JAX/StableHLO and MLIR alike, and the form the codecs'
quantized gather keeps): an out-of-range id reads whatever memory lies there, or faults. The
build knows each table's size, so this module finds, per public function and integer argument,
the set of argument values for which every index it feeds stays inside its dimension, and the
runtime refuses other values before the call (myelin.runtime.tensors.check_index_ranges).

The analysis follows an index operand back from `tensor.extract` through what frontends put
between an argument and a lookup: casts (`index_cast`, `extsi`, `extui`), additions of
constants, negative-index normalization (`select(x < 0, x + n, x)`), clamps (`minsi`/`maxsi`,
`select` on comparisons), elementwise `linalg.generic`s (identical indexing maps, so one element
lines up with one element of the argument) and reshapes. It computes the exact preimage of
[0, size) as a set of intervals over the argument's element type. An index the analysis cannot
follow to exactly one argument (computed from weights or activations, from two arguments, from a
slice, narrowed by a truncation, into a dynamic dimension) is reported as unchecked, with where
it is, and the runtime checks nothing for it.

The same walk bounds dynamic dimensions. An index that is an iteration index (an iota, arange)
plus a constant, over a loop whose extent is a dynamic dim of an argument, reads the table at
positions up to that size: GPT-2's position embedding `wpe[arange(seq)]` is valid only for
`seq <= 128`. IREE reads past the table silently (torch raises IndexError), so such a bound is
recorded per (argument, axis) and the runtime refuses larger sizes. Where the position is
clamped, computed from values, or the loop's extent is not an argument's dim, no bound is known.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from iree.compiler import ir

# An interval set: sorted, disjoint, non-adjacent closed intervals [lo, hi] of integers.
Intervals = tuple[tuple[int, int], ...]

_RESHAPES = frozenset(
    {"tensor.expand_shape", "tensor.collapse_shape", "tensor.reshape", "tensor.cast",
     "flow.tensor.reshape"}
)  # fmt: skip
_CASTS = frozenset({"arith.index_cast", "arith.extsi"})  # sign-preserving: the value is kept
_UNSIGNED_CASTS = frozenset({"arith.index_castui", "arith.extui"})
# arith.cmpi predicates, by their integer attribute value
_PREDICATES = ("eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge")
_SWAPPED = {"eq": "eq", "ne": "ne", "slt": "sgt", "sle": "sge", "sgt": "slt", "sge": "sle",
            "ult": "ugt", "ule": "uge", "ugt": "ult", "uge": "ule"}  # fmt: skip


@dataclass
class FunctionIndexRanges:
    """Per argument position, the values every index it feeds accepts (an interval set over the
    argument's signed element type; absent: it feeds no index); and each index that cannot be
    checked at the boundary, as a sentence naming where it is."""

    valid: dict[int, Intervals] = field(default_factory=dict)
    widths: dict[int, int] = field(default_factory=dict)  # element bits of each argument
    unchecked: list[str] = field(default_factory=list)
    # (argument position, axis) -> (largest size the graph supports, why): a dynamic dim whose
    # positions index a fixed-size table.
    dim_bounds: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)


# --- interval sets -------------------------------------------------------------------------------


def _norm(pieces: list[tuple[int, int]]) -> Intervals:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(p for p in pieces if p[0] <= p[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _intersect(a: Intervals, b: Intervals) -> Intervals:
    return _norm([(max(x, u), min(y, v)) for x, y in a for u, v in b])


def _union(a: Intervals, b: Intervals) -> Intervals:
    return _norm([*a, *b])


def _complement(a: Intervals, domain: Intervals) -> Intervals:
    (lo, hi), gaps, position = domain[0], [], domain[0][0]
    for x, y in a:
        gaps.append((position, x - 1))
        position = y + 1
    gaps.append((position, hi))
    return _intersect(_norm(gaps), ((lo, hi),))


def _shift(a: Intervals, by: int) -> Intervals:
    return tuple((x + by, y + by) for x, y in a)


def _from_unsigned(a: Intervals, bits: int) -> Intervals:
    """Unsigned values of `bits`-bit words as the signed values of the same bits."""
    half = 1 << (bits - 1)
    return _union(
        _intersect(a, ((0, half - 1),)), _shift(_intersect(a, ((half, 2 * half - 1),)), -2 * half)
    )


def _signed(bits: int) -> Intervals:
    return ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1),)


# --- expressions ---------------------------------------------------------------------------------


class _Opaque(Exception):
    """The value is not a function of one argument element the analysis can follow."""


@dataclass(frozen=True)
class _Expr:
    """A scalar integer expression of one argument element: `op` is "arg", "const", "iter" (an
    iteration index), "add", "zext", "select", "cmp", "min", "max", "and", "or" or "xor"."""

    op: str
    args: tuple = ()
    value: int = 0  # const value, or the cmp predicate index
    bits: int = 64  # width of the result
    # for "arg": (argument position, alignment token); for "iter": (argument position, axis)
    # whose size is the loop's extent, or None when that is not an argument's dim
    source: tuple | None = None

    def leaves(self) -> Iterator[_Expr]:
        if self.op in ("arg", "iter", "const"):
            yield self
        for a in self.args:
            yield from a.leaves()


def _int_bits(t: ir.Type) -> int:
    text = str(t)
    if text == "index":
        return 64
    if text.startswith("i") and text[1:].isdigit():
        return int(text[1:])
    raise _Opaque(f"a value of type {text}")


def _block_argument(value: ir.Value) -> ir.BlockArgument | None:
    value = value.maybe_downcast()
    return value if isinstance(value, ir.BlockArgument) else None


def _name(op: ir.Operation) -> str:
    return op.name


class _Walker:
    def __init__(self, function: ir.Operation) -> None:
        self.block = function.regions[0].blocks[0]
        self.args = list(self.block.arguments)

    def scalar(self, value: ir.Value) -> _Expr:
        """The scalar `value` as an expression of one element of a function argument."""
        arg = _block_argument(value)
        if arg is not None:
            owner = arg.owner.owner  # block -> the op whose region holds it
            if owner is not None and _name(owner) == "linalg.generic":
                inputs = _generic_inputs(owner)
                if arg.arg_number < len(inputs):
                    return self.element(inputs[arg.arg_number], owner, arg.arg_number)
            raise _Opaque("a value computed in the graph (a loop or output operand)")
        op = value.owner
        name = _name(op)
        bits = _int_bits(value.type) if name != "arith.cmpi" else 1
        operands = list(op.operands)
        if name == "arith.constant":
            attr = op.attributes["value"]
            try:
                return _Expr("const", value=ir.IntegerAttr(attr).value, bits=bits)
            except ValueError:
                raise _Opaque("a non-integer constant") from None
        if name == "linalg.index":
            dim = ir.IntegerAttr(op.attributes["dim"]).value
            return _Expr("iter", bits=bits, source=_loop_extent(op.parent, dim))
        if name in _CASTS:
            return self.scalar(operands[0])
        if name in _UNSIGNED_CASTS:
            inner = self.scalar(operands[0])
            return inner if inner.bits >= bits else _Expr("zext", (inner,), bits=bits)
        if name in ("arith.addi", "arith.subi"):
            a, b = self.scalar(operands[0]), self.scalar(operands[1])
            if name == "arith.subi":
                if b.op != "const":
                    raise _Opaque("a difference of computed values")
                b = _Expr("const", value=-b.value, bits=b.bits)
            return _Expr("add", (a, b), bits=bits)
        if name in ("arith.minsi", "arith.maxsi"):
            return _Expr(name[6:9], (self.scalar(operands[0]), self.scalar(operands[1])), bits=bits)
        if name == "arith.select":
            return _Expr("select", tuple(self.scalar(v) for v in operands), bits=bits)
        if name == "arith.cmpi":
            predicate = ir.IntegerAttr(op.attributes["predicate"]).value
            return _Expr(
                "cmp", (self.scalar(operands[0]), self.scalar(operands[1])), predicate, bits=1
            )
        if name in ("arith.andi", "arith.ori", "arith.xori") and bits == 1:
            return _Expr(name[6:-1], (self.scalar(operands[0]), self.scalar(operands[1])), bits=1)
        if name == "tensor.extract":
            source = operands[0]
            shape = ir.RankedTensorType(source.type).shape
            if all(d >= 0 for d in shape) and _product(shape) == 1:
                return self.element(source, None, None)
            raise _Opaque("a value read from a tensor at a computed position")
        if name == "arith.trunci":
            raise _Opaque("a value narrowed by arith.trunci (it may wrap)")
        raise _Opaque(f"a value computed by {name}")

    def element(self, tensor: ir.Value, user: ir.Operation | None, position: int | None) -> _Expr:
        """One element of `tensor` (an input of `user`), as an expression of the argument element
        at the same place."""
        token: tuple = ()
        value = tensor
        while True:
            arg = _block_argument(value)
            if arg is not None:
                if arg.owner == self.block:
                    bits = _int_bits(ir.RankedTensorType(value.type).element_type)
                    return _Expr("arg", bits=bits, source=(arg.arg_number, token))
                raise _Opaque("a tensor from a loop or region argument")
            op = value.owner
            name = _name(op)
            if name in _RESHAPES:
                token = (*token, id(op))  # reshapes keep the order of elements, not the shape
                value = op.operands[0]
                continue
            if name == "linalg.generic" and _elementwise(op):
                index = list(op.results).index(value)
                body = op.regions[0].blocks[0]
                yielded = list(body.operations)[-1].operands[index]
                inner = self.scalar(yielded)
                return _with_token(inner, token)
            if name == "arith.constant" or name == "util.global.load":
                raise _Opaque("a tensor of constants or weights")
            raise _Opaque(f"a tensor computed by {name}")


def _with_token(expr: _Expr, token: tuple) -> _Expr:
    if not token:
        return expr
    if expr.op == "arg":
        assert expr.source is not None
        return _Expr("arg", bits=expr.bits, source=(expr.source[0], (*token, *expr.source[1])))
    args = tuple(_with_token(a, token) for a in expr.args)
    return _Expr(expr.op, args, expr.value, expr.bits, expr.source)


def _product(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _generic_inputs(op: ir.Operation) -> list[ir.Value]:
    sizes = op.attributes["operandSegmentSizes"]
    count = ir.DenseI32ArrayAttr(sizes)[0]
    return list(op.operands)[:count]


def _elementwise(op: ir.Operation) -> bool:
    """All iterators parallel and every operand read with one and the same identity map: element
    i of every input is element i of every output."""
    maps = ir.ArrayAttr(op.attributes["indexing_maps"])
    iterators = ir.ArrayAttr(op.attributes["iterator_types"])
    if any("parallel" not in str(it) for it in iterators):
        return False
    first = ir.AffineMapAttr(maps[0]).value
    return (
        first.is_permutation
        and all(str(ir.AffineMapAttr(m).value) == str(first) for m in maps)
        and str(first) == str(ir.AffineMap.get_identity(first.n_dims))
    )


def _loop_extent(generic: ir.Operation | None, dim: int) -> tuple[int, int] | None:
    """(argument position, axis) whose size is loop `dim` of `generic`, or None."""
    if generic is None or _name(generic) != "linalg.generic":
        return None
    maps = ir.ArrayAttr(generic.attributes["indexing_maps"])
    for operand, attr in zip(generic.operands, maps, strict=False):
        for axis, expr in enumerate(ir.AffineMapAttr(attr).value.results):
            expr = expr.maybe_downcast()
            if isinstance(expr, ir.AffineDimExpr) and expr.position == dim:
                shape = ir.RankedTensorType(operand.type).shape
                if shape[axis] >= 0:
                    return None  # a static extent: any table bound is checked at build time
                return _size_source(operand, axis)
    return None


def _size_source(tensor: ir.Value, axis: int) -> tuple[int, int] | None:
    """(argument position, axis) whose size is dim `axis` of `tensor`: a function argument
    itself, or a `tensor.empty` / generic result sized by `tensor.dim` of one."""
    for _ in range(16):
        arg = _block_argument(tensor)
        if arg is not None:
            owner = arg.owner.owner
            return (arg.arg_number, axis) if owner is None or _is_function(owner) else None
        op = tensor.owner
        if _name(op) == "tensor.empty":
            shape = ir.RankedTensorType(tensor.type).shape
            dynamic_before = sum(1 for d in shape[:axis] if d < 0)
            return _scalar_size_source(list(op.operands)[dynamic_before])
        if _name(op) == "linalg.generic":
            outputs = list(op.operands)[len(_generic_inputs(op)) :]
            tensor = outputs[list(op.results).index(tensor)]
            continue
        return None
    return None


def _scalar_size_source(value: ir.Value) -> tuple[int, int] | None:
    for _ in range(16):
        if _block_argument(value) is not None:
            return None
        op = value.owner
        if _name(op) in ("arith.index_cast", "arith.index_castui"):
            value = op.operands[0]
            continue
        if _name(op) == "tensor.dim":
            index = op.operands[1].owner
            if _name(index) != "arith.constant":
                return None
            return _size_source(op.operands[0], ir.IntegerAttr(index.attributes["value"]).value)
        return None
    return None


def _is_function(op: ir.Operation) -> bool:
    return _name(op) in ("func.func", "util.func")


def _table_name(table: ir.Value) -> str:
    """A table's weight name (`transformer.wpe.weight`), else its type."""
    if _block_argument(table) is None and _name(table.owner) == "util.global.load":
        name = ir.FlatSymbolRefAttr(table.owner.attributes["global"]).value
        return name.removeprefix("__auto.")
    return str(table.type)


def _dim_bound(expr: _Expr) -> tuple[tuple[int, int], int] | None:
    """((argument, axis), offset) for an index `iteration + offset` whose loop runs over an
    argument's dim: positions 0..size-1 read the table at offset..offset+size-1."""
    offset = 0
    if expr.op == "add":
        a, b = expr.args
        if a.op == "const":
            a, b = b, a
        if b.op != "const":
            return None
        expr, offset = a, b.value
    if expr.op != "iter" or expr.source is None or offset < 0:
        return None
    return expr.source, offset


# --- preimages -----------------------------------------------------------------------------------


def _preimage(e: _Expr, wanted: Intervals, domain: Intervals) -> Intervals:
    """The argument values x (in `domain`) for which e(x) lies in `wanted`."""
    wanted = _intersect(wanted, _signed(e.bits))
    if e.op == "arg":
        return _intersect(wanted, domain)
    if e.op == "const":
        return domain if _intersect(wanted, ((e.value, e.value),)) else ()
    if e.op == "add":
        a, b = e.args
        if b.op != "const":
            a, b = b, a
        if b.op != "const":
            raise _Opaque("a sum of computed values")
        # wrapping addition: a + c lands in `wanted` iff a lies in wanted - c (mod 2^bits)
        span = 1 << e.bits
        shifted = _shift(wanted, -b.value)
        return _preimage(
            a, _union(_union(shifted, _shift(shifted, span)), _shift(shifted, -span)), domain
        )
    if e.op == "zext":
        (a,) = e.args
        span = 1 << a.bits
        low = _intersect(wanted, ((0, span // 2 - 1),))
        high = _shift(_intersect(wanted, ((span // 2, span - 1),)), -span)
        return _preimage(a, _union(low, high), domain)
    if e.op == "select":
        cond, a, b = e.args
        true = _truth(cond, domain)
        return _union(
            _intersect(true, _preimage(a, wanted, domain)),
            _intersect(_complement(true, domain), _preimage(b, wanted, domain)),
        )
    if e.op in ("min", "max"):
        a, b = e.args
        if b.op != "const":
            a, b = b, a
        if b.op != "const":
            raise _Opaque(f"the {e.op} of computed values")
        c = b.value
        low, high = _signed(e.bits)[0]
        keep = ((low, c),) if e.op == "min" else ((c, high),)  # where a itself is the result
        rest = ((c + 1, high),) if e.op == "min" else ((low, c - 1),)
        out = _preimage(a, _intersect(wanted, keep), domain)
        if _intersect(wanted, ((c, c),)):
            out = _union(out, _preimage(a, rest, domain))
        return out
    raise _Opaque(f"an index of the form {e.op}")


def _truth(e: _Expr, domain: Intervals) -> Intervals:
    """The argument values for which the i1 expression `e` is true."""
    if e.op == "const":
        return domain if e.value & 1 else ()
    if e.op in ("and", "or", "xor"):
        a, b = (_truth(x, domain) for x in e.args)
        if e.op == "and":
            return _intersect(a, b)
        if e.op == "or":
            return _union(a, b)
        return _union(_intersect(a, _complement(b, domain)), _intersect(b, _complement(a, domain)))
    if e.op == "cmp":
        predicate = _PREDICATES[e.value]
        a, b = e.args
        if a.op == "const" and b.op != "const":
            a, b, predicate = b, a, _SWAPPED[predicate]
        if b.op != "const":
            raise _Opaque("a comparison of two computed values")
        low, high = _signed(a.bits)[0]
        c = b.value
        if predicate.startswith("u"):
            span = 1 << a.bits
            u = c if c >= 0 else c + span  # the constant as the unsigned value of its bits
            unsigned = {
                "ult": ((0, u - 1),),
                "ule": ((0, u),),
                "ugt": ((u + 1, span - 1),),
                "uge": ((u, span - 1),),
            }[predicate]
            target = _from_unsigned(_norm(list(unsigned)), a.bits)
        else:
            target = {
                "eq": ((c, c),),
                "ne": _norm([(low, c - 1), (c + 1, high)]),
                "slt": ((low, c - 1),),
                "sle": ((low, c),),
                "sgt": ((c + 1, high),),
                "sge": ((c, high),),
            }[predicate]
        return _preimage(a, _norm(list(target)), domain)
    raise _Opaque(f"a condition of the form {e.op}")


# --- the analysis --------------------------------------------------------------------------------


def _operations(block: ir.Block) -> Iterator[ir.Operation]:
    for op in block.operations:
        operation = op.operation
        yield operation
        for region in operation.regions:
            for inner in region.blocks:
                yield from _operations(inner)


def _location(op: ir.Operation) -> str:
    text = str(op.location)
    return text if len(text) <= 120 else text[:117] + "..."


def _lookup_indices(op: ir.Operation) -> list[tuple[ir.Value, int | None]]:
    """(index operand, size of the dimension it indexes, None when dynamic) of a lookup."""
    if op.name != "tensor.extract":
        return []
    source, *indices = list(op.operands)
    shape = ir.RankedTensorType(source.type).shape
    return [(v, d if d >= 0 else None) for v, d in zip(indices, shape, strict=True)]


def analyze_function(function: ir.Operation) -> FunctionIndexRanges:
    walker = _Walker(function)
    result = FunctionIndexRanges()
    for op in _operations(walker.block):
        for position, (index, size) in enumerate(_lookup_indices(op)):
            where = f"{op.name} index {position} at {_location(op)}"
            try:
                expr = walker.scalar(index)
                leaves = list(expr.leaves())
                sources = {leaf.source for leaf in leaves if leaf.op == "arg"}
                if not sources:
                    # an iteration index or a constant: in range by construction, unless the
                    # loop runs over a dynamic dim and reads a fixed table at its positions
                    bound = _dim_bound(expr) if size is not None else None
                    if bound is not None:
                        dim, offset = bound
                        limit = size - offset
                        why = (
                            f"positions along it index dimension {position} of "
                            f"{_table_name(op.operands[0])}, which has {size} entries"
                        )
                        if dim not in result.dim_bounds or limit < result.dim_bounds[dim][0]:
                            result.dim_bounds[dim] = (limit, why)
                    continue
                if len(sources) > 1:
                    raise _Opaque("a value combining several inputs (or misaligned elements)")
                if any(leaf.op == "iter" for leaf in leaves):
                    raise _Opaque("an input combined with an iteration index")
                ((argument, _),) = sources
                if size is None:
                    raise _Opaque(f"an input, into a dynamic dimension of {op.operands[0].type}")
                bits = next(leaf.bits for leaf in leaves if leaf.op == "arg")
                domain = _signed(bits)
                valid = _preimage(expr, ((0, size - 1),), domain)
            except _Opaque as why:
                result.unchecked.append(f"{where}: the index is {why}")
                continue
            previous = result.valid.get(argument, domain)
            result.valid[argument] = _intersect(previous, valid)
            result.widths[argument] = bits
    return result


def analyze_module(
    module: ir.Operation, functions: Sequence[str]
) -> dict[str, FunctionIndexRanges]:
    """Index ranges of each named function of an input-phase module (inside its context)."""
    wanted = set(functions)
    found = {}
    for op in module.regions[0].blocks[0].operations:
        operation = op.operation
        if operation.name not in ("util.func", "func.func") or not operation.regions[0].blocks:
            continue
        name = ir.StringAttr(operation.attributes["sym_name"]).value
        if name in wanted:
            found[name] = analyze_function(operation)
    return found


def input_range(valid: Intervals, bits: int, dtype: str) -> tuple[int, int] | None:
    """One [lo, hi) range of `dtype` values that is exactly the valid set, None when every value
    is valid (the graph clamps or guards) or when the set is not one interval (then it cannot be
    one min/max check: the input is reported unchecked). The analysis works on signless bits;
    an unsigned dtype reads the same bits as values 2^bits higher."""
    if dtype.startswith("uint"):
        span = 1 << bits
        valid = _union(
            _intersect(valid, ((0, span // 2 - 1),)),
            _shift(_intersect(valid, ((-(span // 2), -1),)), span),
        )
        domain: Intervals = ((0, span - 1),)
    else:
        domain = _signed(bits)
    if valid == domain:
        return None
    if len(valid) != 1:
        raise ValueError(f"the valid values form {len(valid)} separate intervals")
    lo, hi = valid[0]
    return lo, hi + 1


def index_ranges(
    module_bytecode: bytes, functions: Sequence[str], *, what: str = "module"
) -> dict[str, FunctionIndexRanges]:
    """Parse imported IR (at the `input` phase) and analyse the named functions."""
    from myelin.compiler.pipeline import _IMPORT_FLAGS
    from myelin.compiler.session import CompilerSession

    with CompilerSession(list(_IMPORT_FLAGS)) as session:
        module = session.parse(module_bytecode, what=what)
        with session.context:
            return analyze_module(module, functions)
