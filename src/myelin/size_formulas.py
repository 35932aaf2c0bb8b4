"""Size formulas: the byte counts a call allocates, as expressions of its input dims.

The compiler's Stream analysis writes them (`myelin.compiler.stream_analysis`) and the runtime's
admission evaluates them (`myelin.runtime.admission`); this is the one vocabulary both speak,
in the JSON form the .mln stores. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

# A size formula: bytes as an integer, ["dim", input, axis], or [op, a, b].
SizeExpr = int | list

SIZE_OPS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b if b else 0,
    "ceildiv": lambda a, b: -(-a // b) if b else 0,
    "rem": lambda a, b: a % b if b else 0,
    "max": max,
    "min": min,
    "align": lambda a, b: -(-a // b) * b if b else a,
}


def evaluate_size(expr: SizeExpr, shapes: Sequence[Sequence[int] | None]) -> int:
    """Bytes a formula gives for inputs of these shapes (None for a scalar input)."""
    if isinstance(expr, bool):
        raise ValueError(f"not a size formula: {expr!r}")
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, list) or not expr:
        raise ValueError(f"not a size formula: {expr!r}")
    op = expr[0]
    if op == "dim":
        _, arg, axis = expr
        shape = shapes[arg]
        if shape is None:
            raise ValueError(f"size formula reads a dim of scalar input {arg}")
        return int(shape[axis])
    fn = SIZE_OPS.get(op)
    if fn is None or len(expr) != 3:
        raise ValueError(f"unknown size formula op {op!r}")
    return int(fn(evaluate_size(expr[1], shapes), evaluate_size(expr[2], shapes)))


def add_sizes(terms: Iterable[SizeExpr]) -> SizeExpr:
    """One formula for a sum, with the constant parts folded together."""
    constant = 0
    symbolic: list[SizeExpr] = []
    for t in terms:
        if isinstance(t, int):
            constant += t
        else:
            symbolic.append(t)
    total: SizeExpr = constant
    for t in symbolic:
        total = t if total == 0 else ["add", total, t]
    return total


def compile_size(expr: SizeExpr) -> Callable[[Sequence[Sequence[int] | None]], int]:
    """`expr` as a Python function of the input shapes (evaluated on every budgeted call)."""
    if isinstance(expr, bool):
        raise ValueError(f"not a size formula: {expr!r}")
    if isinstance(expr, int):
        return lambda shapes: expr
    if not isinstance(expr, list) or not expr:
        raise ValueError(f"not a size formula: {expr!r}")
    if expr[0] == "dim":
        _, arg, axis = expr
        return lambda shapes: int(shapes[arg][axis])
    fn = SIZE_OPS.get(expr[0])
    if fn is None or len(expr) != 3:
        raise ValueError(f"unknown size formula op {expr[0]!r}")
    a, b = compile_size(expr[1]), compile_size(expr[2])
    return lambda shapes: int(fn(a(shapes), b(shapes)))
