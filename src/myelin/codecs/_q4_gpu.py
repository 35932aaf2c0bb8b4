"""q4 matmuls of decode steps on Hopper: a second form of the encoded contraction that the kernel
library (myelin.kernels._q4) turns into its skinny-M q4 kernel.

One encoded graph serves every variant, and only the kernels step of a CUDA device with
`kernels = "triton"` (or "triton-attention") can put a Triton kernel in it. So the encode step
gives every q4 matmul the kernel covers (M <= 16 rows, static sizes, a K-major g32 weight:
`kernel_covers`, the contract myelin.kernels._q4 implements) two forms joined by an
`arith.select` on a constant marked with KERNEL_FORM_ATTRIBUTE:

- the kernel form: one `linalg.generic` over (rows, outputs, group, element) that reads the
  stored parts and the activation directly and decodes in its body (a correct, if slow,
  contraction on any target), marked with Q4_MATMUL_ATTRIBUTE; the kernels step replaces it by
  the kernel's external dispatch;
- the fused form the codec emits everywhere else (myelin.codecs._rewrite, _matvec).

The kernels step keeps the kernel form (`choose_kernel_forms(module, True)`); every compile
keeps the fused one otherwise (the constant `false` folds to it even if nothing chose).
"""

from __future__ import annotations

import math

from iree.compiler import ir

from myelin.codecs._contract import Layout
from myelin.codecs._emit import parse_template, remap, template_body
from myelin.codecs._forms import choose_marked_forms, join_forms
from myelin.codecs._uses import indexing_maps, map_dims, reduction_loops
from myelin.compiler.placement import find_ops

# On the arith.select joining the forms, and on the kernel form's contraction: "scope::key".
KERNEL_FORM_ATTRIBUTE = "plex.q4_kernel_form"
Q4_MATMUL_ATTRIBUTE = "plex.q4_matmul"
_CONSUMERS = ("linalg.matmul", "linalg.batch_matmul")

# The q4 kernel contract: the matmuls a kernel form is made for, which the kernel library
# (myelin.kernels._q4) must then run. It lives here, on the codec's side, so that the encode
# step never waits on the kernel library and the library imports the codec, never the reverse.
KERNEL_GROUP = 32  # the kernel's q4 group size (the codec's default)
KERNEL_MAX_M = 16  # rows per program: decode steps (one token per sequence, at most 16)
KERNELKERNEL_ACTIVATIONS = ("f16", "bf16")


def kernel_covers(dtype: str, m: int | None, n: int, k: int, group: int) -> str | None:
    """Why the q4 kernel does not cover this matmul, or None when it does."""
    if dtype not in KERNELKERNEL_ACTIVATIONS:
        return f"activation {dtype}: the q4 kernel takes f16 or bf16"
    if m is None or m > KERNEL_MAX_M:
        return f"M = {m}: the q4 kernel takes a static M of at most {KERNEL_MAX_M} (decode steps)"
    if group != KERNEL_GROUP:
        return f"group {group}: the q4 kernel takes q4:g{KERNEL_GROUP}"
    if n % 64:
        return f"N = {n}: the q4 kernel needs N % 64 == 0"
    if k % (KERNEL_GROUP * 4):
        return f"K = {k}: the q4 kernel needs K % {KERNEL_GROUP * 4} == 0"
    return None


def _static(value: ir.Value) -> list[int] | None:
    t = ir.RankedTensorType(value.type)
    return [t.get_dim_size(d) for d in range(t.rank)] if t.has_static_shape else None


def kernel_shape(chain, layout: Layout) -> tuple[int, int, int] | None:
    """(M, N, K) of a q4 contraction the kernel form applies to: a matmul or batch matmul
    reading the weight as its second operand with [K, N] dims (broadcast batch dims allowed),
    an activation [rows..., K] of f16/bf16 and a result [rows..., N] of f32, every size static,
    the weight stored K-major; None for anything else."""
    consumer = chain.consumer
    if consumer.name not in _CONSUMERS or chain.operand != 1 or layout.split is None:
        return None
    axis, group = layout.split
    if (layout.order or (0, 1))[0] != axis or len(consumer.results) != 1:
        return None
    maps = indexing_maps(consumer)
    reductions = reduction_loops(consumer)
    if maps is None or reductions is None or len(reductions) != 1:
        return None
    a_dims, w_dims, o_dims = (map_dims(m) for m in maps)
    if a_dims is None or w_dims is None or o_dims is None:
        return None
    (k,) = reductions
    if w_dims[chain.src[axis]] != k:
        return None
    n = w_dims[chain.src[1 - axis]]
    rows = a_dims[:-1]
    if a_dims[-1] != k or o_dims != [*rows, n]:
        return None
    a_shape, o_shape = _static(consumer.operands[0]), _static(consumer.operands[2])
    if a_shape is None or o_shape is None:
        return None
    a_el = str(ir.RankedTensorType(consumer.operands[0].type).element_type)
    o_el = str(ir.RankedTensorType(consumer.operands[2].type).element_type)
    if o_el != "f32":
        return None
    m, n_size, k_size = math.prod(a_shape[:-1]), o_shape[-1], a_shape[-1]
    if kernel_covers(a_el, m, n_size, k_size, group) is not None:
        return None
    return m, n_size, k_size


def _loops_of(index: tuple[str, ...], axis: int, group: int) -> str:
    """A part's index over the kernel form's loops (rows d0, outputs d1, group d2, element in
    group d3): the codec's expressions with the contracted axis as (d2, d3) and the outputs as
    d1 (a blocked part reads `d1 floordiv B`, `d1 mod B`)."""
    out = 1 - axis
    text = ", ".join(index)
    text = text.replace(f"d{axis} floordiv {group}", "G").replace(f"d{axis} mod {group}", "E")
    return text.replace(f"d{out}", "d1").replace("G", "d2").replace("E", "d3")


def emit_kernel_form(
    chain, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> bool:
    """Place the kernel form of this use before its consumer, joined to the consumer's result
    by the marked select (the fused form is built afterwards from the same chain). False
    (nothing changed) when the kernel does not cover the contraction."""
    shape = kernel_shape(chain, layout)
    if shape is None:
        return False
    m, n, k = shape
    axis, group = layout.split  # type: ignore[misc]
    groups = k // group
    consumer = chain.consumer
    x, init = consumer.operands[0], consumer.operands[2]
    x_t, init_t = ir.RankedTensorType(x.type), ir.RankedTensorType(init.type)
    el = str(x_t.element_type)
    x2_t, xe_t = f"tensor<{m}x{k}x{el}>", f"tensor<{m}x{groups}x{group}x{el}>"
    r_t = f"tensor<{m}x{n}xf32>"

    def flat(name: str, value_t: ir.RankedTensorType, to: str, out: str) -> str:
        if value_t.rank == 2:
            return f"  %{out} = tensor.cast %{name} : {value_t} to {to}\n"
        rows = list(range(value_t.rank - 1))
        return (
            f"  %{out} = tensor.collapse_shape %{name} [{rows}, [{value_t.rank - 1}]]"
            f" : {value_t} into {to}\n"
        )

    if init_t.rank == 2:
        back = f"  %q4out = tensor.cast %q4r : {r_t} to {init_t}\n"
    else:
        dims = [init_t.get_dim_size(d) for d in range(init_t.rank)]
        rows = list(range(init_t.rank - 1))
        back = (
            f"  %q4out = tensor.expand_shape %q4r [{rows}, [{init_t.rank - 1}]]"
            f" output_shape {dims} : {r_t} into {init_t}\n"
        )
    loops = "(d0, d1, d2, d3)"  # rows, outputs, group, element in group
    maps = [
        f"affine_map<{loops} -> (d0, d2, d3)>",
        *(f"affine_map<{loops} -> ({_loops_of(p.index, axis, group)})>" for p in layout.parts),
        f"affine_map<{loops} -> (d0, d1)>",
    ]
    part_types = [str(v.type) for v in parts]
    block = ", ".join(f"%p{i}: {p.element}" for i, p in enumerate(layout.parts))
    body = "\n".join(f"      {line}" for line in layout.decode)
    text = f"""
func.func private @q4(%x: {x_t}, {", ".join(f"%a{i}: {t}" for i, t in enumerate(part_types))},
                      %init: {init_t}) -> {init_t} {{
{flat("x", x_t, x2_t, "x2")}  %xe = tensor.expand_shape %x2 [[0], [1, 2]]
      output_shape [{m}, {groups}, {group}] : {x2_t} into {xe_t}
{flat("init", init_t, r_t, "i2")}  %q4r = linalg.generic {{indexing_maps = [{", ".join(maps)}],
      iterator_types = ["parallel", "parallel", "reduction", "reduction"]}}
      ins(%xe, {", ".join(f"%a{i}" for i in range(len(parts)))} : {xe_t}, {", ".join(part_types)})
      outs(%i2 : {r_t}) {{
    ^bb0(%xin: {el}, {block}, %acc: f32):
{body}
      %xf = arith.extf %xin : {el} to f32
      %prod = arith.mulf %xf, %r : f32
      %sum = arith.addf %acc, %prod : f32
      linalg.yield %sum : f32
  }} -> {r_t}
{back}  return %q4out : {init_t}
}}"""
    template = parse_template(context, text)
    block_, ops = template_body(template)
    placed = ops[:-1]
    for op in placed:
        op.move_before(consumer)
    remap(placed, [*zip(block_.arguments, [x, *parts, init], strict=True)])
    contraction = next(op for op in placed if op.name == "linalg.generic")
    contraction.attributes[Q4_MATMUL_ATTRIBUTE] = ir.StringAttr.get(what, context)
    join_forms(consumer, placed[-1].results[0], KERNEL_FORM_ATTRIBUTE, what, context)
    return True


def kernel_forms(module: ir.Operation) -> list[ir.Operation]:
    """The kernel forms' contractions (Q4_MATMUL_ATTRIBUTE), in IR order."""
    return find_ops(
        module, lambda op: op.name == "linalg.generic" and Q4_MATMUL_ATTRIBUTE in op.attributes
    )


def choose_kernel_forms(module: ir.Operation, kernel: bool) -> list[str]:
    """Keep one form of every q4 contraction that has two: the kernel form if `kernel` (the
    kernels step, which then puts the kernel in its place), else the fused one; erase the
    other. Returns "scope::key" of each kept kernel form, in IR order."""
    return choose_marked_forms(module, KERNEL_FORM_ATTRIBUTE, kernel)
