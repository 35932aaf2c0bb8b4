"""Activations a matmul kernel applies before it writes C, found in the graph by what they compute.

A transformer's feed-forward runs `act(x @ W1^T + b1)`: without the activation in the kernel, C
is written, read again by an elementwise dispatch and written once more. On Whisper-base's
encoder at batch 8 (H100, f16) that GELU dispatch took 78 us per layer, 15% of the forward.

Frontends write the same activation differently (torch-mlir's GELU is `x * (erf(x / sqrt(2)) +
1) * 0.5` with `sqrt(2)` computed in the body, ONNX's and JAX's differ again, in f16 or through
f32), so an activation is recognised by evaluating its elementwise body as a function of one
scalar at sample points, not by the ops it is written with. The kernel computes the activation
in f32 on the accumulator and rounds once, where the graph rounded C first: the same function,
more accurate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from iree.compiler import ir

from myelin.kernels._ir import owner_op, sole_user
from myelin.kernels._triton import ACTIVATION_CODES

# What each activation the kernels apply (myelin.kernels._triton.ACTIVATION_CODES) computes.
ACTIVATIONS: dict[str, Callable[[float], float]] = {
    "gelu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: (
        0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "silu": lambda x: x / (1.0 + math.exp(-x)),
    "relu": lambda x: max(x, 0.0),
}
assert set(ACTIVATIONS) == set(ACTIVATION_CODES) - {""}
_SAMPLES = (-4.0, -2.5, -1.0, -0.5, -0.1, 0.0, 0.2, 0.7, 1.5, 3.0)
# The body is evaluated in f64 with its constants as stored (an f16 `0.7071` for 1 / sqrt(2) is
# 1e-4 off): a match within 5e-5 x (1 + |x|); gelu and gelu_tanh differ by 2e-4 at 1.5 and 4.6e-4
# at -2.5, well outside that.
_TOLERANCE = 5e-5

_BINARY: dict[str, Callable[[float, float], float]] = {
    "arith.addf": lambda a, b: a + b,
    "arith.subf": lambda a, b: a - b,
    "arith.mulf": lambda a, b: a * b,
    "arith.divf": lambda a, b: a / b if b else math.copysign(math.inf, a) * math.copysign(1, b),
    "arith.maximumf": max,
    "arith.maxnumf": max,
    "arith.minimumf": min,
    "arith.minnumf": min,
    "math.powf": lambda a, b: a**b,
}
_UNARY: dict[str, Callable[[float], float]] = {
    "arith.negf": lambda a: -a,
    "arith.extf": lambda a: a,
    "arith.truncf": lambda a: a,
    "math.erf": math.erf,
    "math.tanh": math.tanh,
    "math.sqrt": math.sqrt,
    "math.rsqrt": lambda a: 1.0 / math.sqrt(a),
    "math.exp": lambda a: math.exp(min(a, 700.0)),
    "math.absf": abs,
}


def _constant(value: ir.Value) -> float | None:
    """The number an `arith.constant` scalar holds (float or integer), or None."""
    owner = owner_op(value)
    if owner is None or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    for kind in (ir.FloatAttr, ir.IntegerAttr):
        try:
            return float(kind(attr).value)
        except (ValueError, TypeError):
            continue
    return None


def _body_function(op: ir.Operation) -> Callable[[list[float]], float] | None:
    """An elementwise generic's body as a Python function of its inputs' scalars, or None when
    it reads its output or uses an op this does not know."""
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if not body or body[-1].name != "linalg.yield" or len(body[-1].operands) != 1:
        return None
    inputs = list(block.arguments)[: len(op.operands) - 1]
    steps = body[:-1]
    for step in steps:
        known = step.name in _BINARY or step.name in _UNARY or step.name == "arith.constant"
        if not (known or step.name == "math.fpowi") or len(step.results) != 1:
            return None

    def run(xs: list[float]) -> float:
        values: dict[ir.Value, float] = dict(zip(inputs, xs, strict=True))

        def read(v: ir.Value) -> float:
            if v in values:
                return values[v]
            c = _constant(v)
            if c is None:
                raise KeyError(v)
            return c

        for step in steps:
            args = [read(v) for v in step.operands] if step.name != "arith.constant" else []
            if step.name == "arith.constant":
                value = _constant(step.results[0])
                if value is None:
                    raise KeyError(step)
            elif step.name == "math.fpowi":
                value = args[0] ** int(args[1])
            elif step.name in _UNARY:
                value = _UNARY[step.name](args[0])
            else:
                value = _BINARY[step.name](*args)
            values[step.results[0]] = value
        return read(body[-1].operands[0])

    return run


def _is_elementwise(op: ir.Operation, t: ir.Type) -> bool:
    """A `linalg.generic` of identity maps whose one result and every input are of type `t`."""
    if op.name != "linalg.generic" or len(op.results) != 1 or op.results[0].type != t:
        return False
    if any(v.type != t for v in op.operands):
        return False
    rank = ir.RankedTensorType(t).rank
    identity = str(ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank)))
    return all(str(m) == identity for m in ir.ArrayAttr(op.attributes["indexing_maps"]))


def _elementwise_region(x: ir.Value) -> list[ir.Operation] | None:
    """The elementwise generics computed from `x` alone, in order (each reads only `x` and the
    ones before it), when every use of `x` and of each but the last is among them: one
    function of `x`, however many ops a frontend split it into (GPT-2's tanh GELU is eight)."""
    region: list[ir.Operation] = []
    known = {x}
    grown = True
    while grown:
        grown = False
        for value in list(known):
            for use in value.uses:
                user = getattr(use.owner, "operation", use.owner)
                if user in region or not _is_elementwise(user, x.type):
                    continue
                if all(v in known for v in list(user.operands)[:-1]):
                    region.append(user)
                    known.add(user.results[0])
                    grown = True
    if not region:
        return None
    inside = set(region)
    for value in [x, *(op.results[0] for op in region[:-1])]:
        for use in value.uses:
            if getattr(use.owner, "operation", use.owner) not in inside:
                return None
    return region


def _region_function(x: ir.Value, region: list[ir.Operation]) -> Callable[[float], float] | None:
    bodies = [_body_function(op) for op in region]
    if any(b is None for b in bodies):
        return None

    def run(value: float) -> float:
        values: dict[ir.Value, float] = {x: value}
        for op, body in zip(region, bodies, strict=True):
            values[op.results[0]] = body([values[v] for v in list(op.operands)[:-1]])
        return values[region[-1].results[0]]

    return run


def classify(fn: Callable[[float], float]) -> str | None:
    """Which of `ACTIVATIONS` the function is, by its values at the sample points."""
    try:
        got = [fn(x) for x in _SAMPLES]
    except (KeyError, ValueError, OverflowError, ZeroDivisionError, TypeError):
        return None
    for name, want in ACTIVATIONS.items():
        pairs = zip(got, _SAMPLES, strict=True)
        if all(abs(g - want(x)) <= _TOLERANCE * (1 + abs(x)) for g, x in pairs):
            return name
    return None


@dataclass
class Epilogue:
    """What a kernel applies to its f32 sums after the bias, found after its result: the ops
    that then go, and what the kernel needs to do their work."""

    # the `tensor.expand_shape` that gives a linear's rows back their [batch, tokens] (kept:
    # the kernel's result goes through it), if any
    expand: ir.Operation | None = None
    activation: str = ""  # a name of `ACTIVATIONS`
    activation_ops: list[ir.Operation] = field(default_factory=list)  # in order
    merge: str = ""  # "add" | "mul" (myelin.kernels._triton.MERGE_CODES)
    merge_op: ir.Operation | None = None
    # which of the merge's inputs is the other tensor: read when the kernel is called, since
    # another kernel's rewrite may have replaced the value that made it (a residual stream)
    merge_index: int = 0

    @property
    def merge_operand(self) -> ir.Value:
        assert self.merge_op is not None
        return self.merge_op.operands[self.merge_index]

    @property
    def ops(self) -> list[ir.Operation]:
        """The ops that go once the kernel does their work, consumer first."""
        merged = [self.merge_op] if self.merge_op is not None else []
        return merged + list(reversed(self.activation_ops))

    @property
    def last(self) -> ir.Operation | None:
        return self.ops[0] if self.ops else None


_MERGES = {"arith.addf": "add", "arith.mulf": "mul"}


def _merge_consumer(value: ir.Value) -> tuple[ir.Operation, int, str] | None:
    """The elementwise add or product of `value` with one other tensor of its type that is
    `value`'s one use (a residual connection; Llama's `act(gate) * up`): the op, which of its
    inputs is the other tensor, and "add" or "mul"."""
    user = sole_user(value)
    if user is None or len(user.operands) != 3 or not _is_elementwise(user, value.type):
        return None
    a, b = list(user.operands)[:2]
    if (a == value) == (b == value):
        return None
    block = user.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name not in _MERGES or body[1].operands[0] != body[0].results[0]:
        return None
    if set(body[0].operands) != set(list(block.arguments)[:2]):
        return None
    return user, (1 if a == value else 0), _MERGES[body[0].name]


def find_epilogue(result: ir.Value, merge: bool = True) -> Epilogue:
    """The activation computed from this [M, N] kernel result alone (directly, or through the
    reshape to [batch, tokens, N]), then (with `merge`) the add or product with one other
    tensor that reads it: what the kernel can do before it writes C."""
    found = Epilogue()
    x = result
    user = sole_user(result)
    if user is not None and user.name == "tensor.expand_shape":
        found.expand, x = user, user.results[0]
    region = _elementwise_region(x)
    fn = _region_function(x, region) if region is not None else None
    name = classify(fn) if fn is not None else None
    if region is not None and name is not None:
        found.activation, found.activation_ops = name, region
        x = region[-1].results[0]
    merged = _merge_consumer(x) if merge else None
    if merged is not None:
        found.merge_op, found.merge_index, found.merge = merged
    return found
