"""GELU on a backend: the exact (erf) GELU, with the bias add before it, as one backend call.

PyTorch's `nn.GELU()` imports as a linalg.generic computing `x * 0.5 * (1 + erf(x / sqrt(2)))`,
usually right after a projection's bias add. Where a graph's `gelu` ops are placed on a backend
that implements the op, that generic (and the bias add feeding it, when nothing else reads the
sum) becomes one dispatch whose workgroups call `plex_<backend>_gelu` on their rows
(myelin.compiler.backend_ops builds it from `executable_text`). Measured on MiniLM at batch 32
(`plex profile`, 2 threads, matmuls and attentions already on the backend): IREE's code for the
bias add and GELU was ~5% of a call.
"""

from __future__ import annotations

import math

from iree.compiler import ir

from myelin.compiler.workgroup_split import workgroup_share

BIAS = 1  # PLEX_GELU_BIAS
_BODY = ("arith.divf", "math.erf", "arith.addf", "arith.mulf", "arith.mulf", "linalg.yield")


def _producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _constant(value: ir.Value) -> float | None:
    op = _producer(value)
    if op is None or op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    return ir.FloatAttr(attr).value if isinstance(attr, ir.FloatAttr) else None


def _f32(value: ir.Value) -> bool:
    t = value.type
    return isinstance(t, ir.RankedTensorType) and isinstance(
        ir.RankedTensorType(t).element_type, ir.F32Type
    )


def _elementwise_maps(op: ir.Operation, count: int) -> list[str] | None:
    if op.name != "linalg.generic" or len(op.operands) != count:
        return None
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in i for i in iterators):
        return None
    return [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def is_gelu(op: ir.Operation) -> bool:
    """`op` is an f32 generic computing x * 0.5 * (1 + erf(x / sqrt(2))) of its one input."""
    maps = _elementwise_maps(op, 2)
    if maps is None or len(set(maps)) != 1 or not _f32(op.operands[0]):
        return False
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if tuple(o.name for o in body) != _BODY:
        return False
    x = block.arguments[0]
    div, erf, add, mul, out, _ = body
    if div.operands[0] != x or erf.operands[0] != div.results[0]:
        return False
    if not math.isclose(_constant(div.operands[1]) or 0.0, math.sqrt(2.0), rel_tol=1e-6):
        return False
    other = [v for v in add.operands if v != erf.results[0]]
    if len(other) != 1 or _constant(other[0]) != 1.0:
        return False
    half = [v for v in mul.operands if v != add.results[0]]
    if len(half) != 1 or _constant(half[0]) != 0.5:
        return False
    return set(out.operands) == {x, mul.results[0]}


def bias_source(value: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """(x, bias) where `value` is x + bias broadcast over the rows (bias [n], x [..., n]) and
    nothing else reads the sum, else None."""
    op = _producer(value)
    if op is None or len(list(op.results[0].uses)) != 1:
        return None
    maps = _elementwise_maps(op, 3)
    if maps is None or maps[0] != maps[2] or not all(_f32(v) for v in op.operands[:2]):
        return None
    rank = ir.RankedTensorType(op.operands[0].type).rank
    dims = ", ".join(f"d{i}" for i in range(rank))
    if maps[1] != f"affine_map<({dims}) -> (d{rank - 1})>":
        return None
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if [o.name for o in body] != ["arith.addf", "linalg.yield"]:
        return None
    if set(body[0].operands) != {block.arguments[0], block.arguments[1]}:
        return None
    return op.operands[0], op.operands[1]


def executable_text(name: str, symbol: str, bias: bool) -> str:
    """A stream.executable whose workgroup w of W calls `symbol` on its share of the rows;
    without a bias, x's pointer stands in for it (the flags say it is not read). The entry is
    named after the executable: IREE links a device's executables into one module, where two
    entries of one name clash."""
    bias_arg = ", %bb: !stream.binding" if bias else ""
    bias_view = ""
    bias_ptr, bias_off = "%x0", "%c0"
    if bias:
        bias_view = """
      %b = stream.binding.subspan %bb[%c0] : !stream.binding -> memref<?xf32, #dyn>{%n}
      %b0, %bo, %bs, %bst = memref.extract_strided_metadata %b
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index"""
        bias_ptr, bias_off = "%b0", "%bo"
    return f"""
#dyn = strided<[1], offset: ?>
stream.executable private @{name} {{
  stream.executable.export public @{name} workgroups(%w: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    stream.return %w, %c1, %c1 : index, index, index
  }}
  builtin.module {{
    func.func private @{symbol}(memref<f32>, index, memref<f32>, index, memref<f32>, index,
        index, index, index) attributes {{llvm.bareptr = true}}
    func.func @{name}(%bx: !stream.binding{bias_arg}, %by: !stream.binding, %rows: index,
        %n: index, %flags: index) {{
      %c0 = arith.constant 0 : index
      %len = arith.muli %rows, %n : index
      %x = stream.binding.subspan %bx[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%len}}
      %y = stream.binding.subspan %by[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%len}}
      %x0, %xo, %xs, %xst = memref.extract_strided_metadata %x
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %y0, %yo, %ys, %yst = memref.extract_strided_metadata %y
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index{bias_view}
      {workgroup_share("%rows")}
      %skip = arith.muli %first, %n : index
      %xo2 = arith.addi %xo, %skip : index
      %yo2 = arith.addi %yo, %skip : index
      func.call @{symbol}(%x0, %xo2, {bias_ptr}, {bias_off}, %y0, %yo2, %count, %n, %flags)
          : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index, index)
          -> ()
      return
    }}
  }}
}}
"""
