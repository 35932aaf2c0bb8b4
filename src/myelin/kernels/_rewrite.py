"""Matching contractions to library kernels and rewriting them into IREE external dispatches.

Works on IR at IREE's `input` phase, through the MLIR Python API of the compiler in process (the
same route as PLeX's codec and placement passes). A matched `linalg.matmul` (and the `truncf`
that narrows its f32 result, when there is one) becomes a `util.call` of a private `util.func`
holding a `hal.dispatch.extern` whose object is the kernel's cubin, embedded as data. IREE then
treats it like any dispatch: Stream schedules it, allocates its result, records it in the
command buffer. Everything a kernel does not cover stays with IREE's codegen.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from iree.compiler import ir

from myelin.compiler.placement import find_ops
from myelin.kernels._epilogue import Epilogue, find_epilogue
from myelin.kernels._ir import owner_op, sole_user
from myelin.kernels._triton import CompiledKernel, MatmulConfig

# linalg.matmul's maps for A x B (the default) and A x B^T, as IREE 3.13 prints them.
_MAPS_AB = (
    "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]"
)
_MAPS_ABT = (
    "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]"
)
_INPUT_TYPES = ("f16", "bf16")
# On a matmul that computes a convolution (myelin.kernels._conv): JSON of what it was
CONV_MARK = "plex.conv"
# On a convolution's gather (im2col) that the convolution kernel can read in place instead:
# JSON of the geometry the kernel takes (myelin.kernels._triton.CONV_GEOMETRY, lower case)
IM2COL_MARK = "plex.im2col"


@dataclass(frozen=True)
class MatmulSite:
    """One `linalg.matmul` of the graph and what the library does with it."""

    function: str
    location: str
    shape: tuple[int | None, int | None, int | None]  # (M, N, K); M None when dynamic
    dtype: str
    out_dtype: str
    b_transposed: bool
    kernel: str | None  # the kernel it goes to, or None
    reason: str  # why it goes there, or why it stays IREE codegen
    # the convolution this matmul computes (myelin.kernels._conv: op, conv, flops), if any
    conv: dict | None = None

    def to_json(self) -> dict:
        m, n, k = self.shape
        op = "matmul_transpose_b" if self.b_transposed else "matmul"
        site = {
            "function": self.function,
            "location": self.location,
            "op": op,
            "m": m,
            "n": n,
            "k": k,
            "dtype": self.dtype,
            "out_dtype": self.out_dtype,
            "kernel": self.kernel,
            "reason": self.reason,
        }
        if self.conv is not None:  # listed as the convolution, with the matmul it runs as
            site.update(self.conv, **{"as": op})
        return site


@dataclass
class _Match:
    site: MatmulSite
    config: MatmulConfig | None
    matmul: ir.Operation
    root: ir.Operation  # the op whose result the kernel replaces (matmul, or its truncf)
    a_type: ir.Type = field(default=None)  # type: ignore[assignment]
    b_type: ir.Type = field(default=None)  # type: ignore[assignment]
    result_type: ir.Type = field(default=None)  # type: ignore[assignment]
    # B as the kernel reads it: the matmul's B, or the source of the `linalg.transpose` that
    # produced it (then the kernel reads the untransposed weight as A x B^T).
    b_value: ir.Value = field(default=None)  # type: ignore[assignment]
    transpose: ir.Operation | None = None
    # the bias [N] the kernel adds (its add, `root`, then replaced too), if any
    bias: ir.Value | None = None
    before_bias: ir.Operation | None = None  # the op the bias add consumed (matmul or truncf)
    # A as the convolution kernel reads it: the gather's NHWC input and the geometry, if any
    im2col: tuple[ir.Value, dict[str, int]] | None = None
    # what the kernel applies after the bias (an activation, a merge with another tensor:
    # myelin.kernels._epilogue), whose ops go once the call is in place
    epilogue: Epilogue = field(default_factory=Epilogue)


def _element(t: ir.Type) -> str:
    return str(ir.RankedTensorType(t).element_type)


def _dims(t: ir.Type) -> list[int | None]:
    rt = ir.RankedTensorType(t)
    return [None if rt.is_dynamic_dim(i) else rt.get_dim_size(i) for i in range(rt.rank)]


def _is_zero_fill(value: ir.Value) -> bool:
    owner = value.owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    if getattr(owner, "name", None) != "linalg.fill":
        return False
    scalar = owner.operands[0].owner
    scalar = getattr(scalar, "operation", scalar)
    if getattr(scalar, "name", None) != "arith.constant":
        return False
    try:
        return ir.FloatAttr(scalar.attributes["value"]).value == 0.0
    except (ValueError, KeyError):
        return False


def _sole_generic_user(result: ir.Value, operands: int) -> ir.Operation | None:
    """The `linalg.generic` of `operands` operands, the first `result`, and one result, that is
    `result`'s one use (what the kernel can take into itself), or None."""
    user = sole_user(result)
    if user is None or user.name != "linalg.generic":
        return None
    if len(user.operands) != operands or len(user.results) != 1:
        return None
    return user if user.operands[0] == result else None


def _truncf_consumer(result: ir.Value) -> tuple[ir.Operation, str] | None:
    """The elementwise `linalg.generic` that only narrows this f32 result (f16/bf16), when it is
    the result's one use: the kernel then writes the narrow type itself."""
    user = _sole_generic_user(result, 2)
    if user is None:
        return None
    maps = str(user.attributes["indexing_maps"])
    identity = "affine_map<(d0, d1) -> (d0, d1)>"
    if maps != f"[{identity}, {identity}]":
        return None
    ops = list(user.regions[0].blocks[0].operations)
    if [o.name for o in ops] != ["arith.truncf", "linalg.yield"]:
        return None
    block = user.regions[0].blocks[0]
    if ops[0].operands[0] != block.arguments[0] or ops[1].operands[0] != ops[0].results[0]:
        return None
    out = _element(user.results[0].type)
    return (user, out) if out in _INPUT_TYPES else None


def _bias_consumer(result: ir.Value) -> tuple[ir.Operation, ir.Value] | None:
    """The elementwise `linalg.generic` that adds a bias [N] broadcast over the rows to this
    [M, N] result, when it is the result's one use (a torch Linear's bias, `x @ w.t() + b`):
    the kernel then adds it before writing C, and the add needs no dispatch of its own."""
    user = _sole_generic_user(result, 3)
    if user is None or user.results[0].type != result.type:
        return None
    identity, row = "affine_map<(d0, d1) -> (d0, d1)>", "affine_map<(d0, d1) -> (d1)>"
    if str(user.attributes["indexing_maps"]) != f"[{identity}, {row}, {identity}]":
        return None
    block = user.regions[0].blocks[0]
    ops = list(block.operations)
    if [o.name for o in ops] != ["arith.addf", "linalg.yield"]:
        return None
    if set(ops[0].operands) != {block.arguments[0], block.arguments[1]}:
        return None
    if ops[1].operands[0] != ops[0].results[0]:
        return None
    bias = user.operands[1]
    if _element(bias.type) != _element(result.type):
        return None
    return user, bias


def _transposed_source(value: ir.Value) -> tuple[ir.Value, ir.Operation] | None:
    """The input of the 2-D `linalg.transpose` (permutation [1, 0]) that produced `value`: what
    torch's `F.linear(x, w)` lowers to (`w.t()`, then `x @ w.t()`). The kernel reads `w` as
    A x B^T instead, so the transposed copy of the weight is never made."""
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    if getattr(owner, "name", None) != "linalg.transpose":
        return None
    if str(owner.attributes["permutation"]) != "array<i64: 1, 0>":
        return None
    return owner.operands[0], owner


def _im2col_source(a: ir.Value) -> tuple[ir.Value, dict[str, int]] | None:
    """The NHWC input and geometry of the marked gather whose collapse is `a` (the matmul's A),
    when the matmul is its one use: the convolution kernel then reads the input in place."""
    collapse = owner_op(a)
    if len(list(a.uses)) != 1:
        return None
    if collapse is not None and collapse.name == "tensor.pad":  # K padded to the kernels' step
        a = collapse.operands[0]
        collapse = owner_op(a)
        if len(list(a.uses)) != 1:
            return None
    if collapse is None or collapse.name != "tensor.collapse_shape":
        return None
    gather = owner_op(collapse.operands[0])
    if gather is None or gather.name != "linalg.generic" or IM2COL_MARK not in gather.attributes:
        return None
    return gather.operands[0], json.loads(ir.StringAttr(gather.attributes[IM2COL_MARK]).value)


def conv_of(matmul: ir.Operation) -> dict | None:
    """What convolution a matmul computes (`_conv.ConvForm.describe()` and the convolution's
    location), if the im2col rewrite made it."""
    if CONV_MARK not in matmul.attributes:
        return None
    return json.loads(ir.StringAttr(matmul.attributes[CONV_MARK]).value)


def _function_name(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None and parent.name not in ("util.func", "func.func"):
        parent = parent.parent
    if parent is None:
        return "?"
    return ir.StringAttr(parent.attributes["sym_name"]).value


def _in_dispatch_region(op: ir.Operation) -> bool:
    """Whether `op` already sits in a `flow.dispatch.region` (a codec's decode fused with its
    matmul: myelin.codecs._regions): a region becomes one executable, which cannot call
    another, so a kernel call there would not compile."""
    parent = op.parent
    while parent is not None and parent.name not in ("util.func", "func.func"):
        if parent.name == "flow.dispatch.region":
            return True
        parent = parent.parent
    return False


def find_matmuls(
    module: ir.Operation, choose: Callable[[str, str, bool, int | None, int, int], MatmulConfig]
) -> list[_Match]:
    """Every `linalg.matmul`, with the kernel it goes to or why it stays IREE codegen."""
    found = find_ops(module, lambda op: op.name == "linalg.matmul")
    matches = []
    merged: set[ir.Operation] = set()  # merge ops a kernel takes (one kernel each)
    for op in found:
        a, b, init = op.operands[0], op.operands[1], op.operands[2]
        a_t, b_t, c_t = a.type, b.type, op.results[0].type
        dtype, acc = _element(a_t), _element(c_t)
        maps = str(op.attributes["indexing_maps"]) if "indexing_maps" in op.attributes else None
        transposed = maps == _MAPS_ABT
        b_value, transpose = b, None
        source = _transposed_source(b) if maps in (None, _MAPS_AB) else None
        if source is not None:
            b_value, transpose = source
            b_t, transposed = b_value.type, True
        a_dims, b_dims = _dims(a_t), _dims(b_t)
        m, k = a_dims
        n = b_dims[0] if transposed else b_dims[1]
        root, out = op, acc
        narrowed = _truncf_consumer(op.results[0]) if acc == "f32" else None
        if narrowed is not None:
            root, out = narrowed
        reason = ""
        if _in_dispatch_region(op):
            reason = "a codec decodes its weight inside the matmul's dispatch"
        elif maps not in (None, _MAPS_AB, _MAPS_ABT):
            reason = f"layout {maps} is not A x B or A x B^T"
        elif dtype not in _INPUT_TYPES or _element(b_t) != dtype:
            reason = f"inputs {dtype} x {_element(b_t)}: kernels take f16 or bf16 pairs"
        elif acc not in ("f32", dtype):
            reason = f"accumulates in {acc}"
        elif not _is_zero_fill(init):
            reason = "accumulates into an operand that is not a zero fill"
        elif n is None or k is None:
            reason = "N and K must be static"
        elif k % 64 or n % 16:
            reason = f"N = {n}, K = {k}: kernels need K % 64 == 0 and N % 16 == 0"
        config = None if reason else choose(dtype, out, transposed, m, n, k)
        biased = _bias_consumer(root.results[0]) if config is not None else None
        bias = before_bias = None
        if biased is not None and config is not None and config.block_m > 1:
            (root, bias), before_bias = biased, root
            config = dataclasses.replace(config, bias=True)
        im2col = None
        if config is not None and bias is None and config.block_m > 1 and transposed:
            im2col = _im2col_source(a)
        if im2col is not None and config is not None:
            masked = im2col[1]["c"] % config.block_k != 0
            config = dataclasses.replace(
                config, im2col=True, im2col_masked=masked, persistent=False
            )
        epilogue = Epilogue()
        if config is not None and config.block_m > 1 and im2col is None:
            epilogue = find_epilogue(root.results[0])
            if epilogue.merge_op is not None and epilogue.merge_op in merged:
                epilogue = find_epilogue(root.results[0], merge=False)  # another's already
            if epilogue.merge_op is not None:
                merged.add(epilogue.merge_op)
            config = dataclasses.replace(
                config, activation=epilogue.activation, merge=epilogue.merge
            )
        folded = [w for w, there in (("truncf", narrowed), ("bias", bias)) if there]
        folded += [w for w in (epilogue.activation, epilogue.merge) if w]
        narrowing = " and ".join(folded)
        site = MatmulSite(
            function=_function_name(op),
            location=str(op.location),
            shape=(m, n, k),
            dtype=dtype,
            out_dtype=out,
            b_transposed=transposed,
            kernel=config.name if config is not None else None,
            reason=(reason or (f"matched, with its {narrowing}" if narrowing else "matched"))
            + (" (B^T read from the transpose's input)" if transpose is not None else "")
            + (" (im2col read in place: no gather)" if im2col is not None else ""),
            conv=conv_of(op),
        )
        match = _Match(
            site, config, op, root, b_value=b_value, transpose=transpose, bias=bias,
            before_bias=before_bias, im2col=im2col, epilogue=epilogue,
        )  # fmt: skip
        match.a_type, match.b_type, match.result_type = a_t, b_t, root.results[0].type
        matches.append(match)
    return matches


def _hex(data: bytes) -> str:
    return "0x" + data.hex().upper()


def add_functions(body: ir.Block, module_text: str) -> None:
    """Move the functions of a wrapper module (a kernel's executable and the function that
    dispatches it) into the module whose top-level block is `body`."""
    helper = ir.Module.parse(module_text)
    for op in list(helper.body.operations):
        body.append(op.detach_from_parent())


def call_in_place_of(
    op: ir.Operation,
    callee: str,
    operands: list[ir.Value],
    *,
    result_type: ir.Type | None = None,
    location: ir.Location | None = None,
    before: ir.Operation | None = None,
) -> ir.Operation:
    """A `util.call` of `callee`, inserted before `op` (or `before`, a later op its operands
    also dominate), that takes the place of `op`'s result (the caller erases `op` and what only
    it used)."""
    where = before if before is not None else op
    with ir.InsertionPoint(where), location if location is not None else op.location:
        call = ir.Operation.create(
            "util.call",
            results=[result_type or op.results[0].type],
            operands=operands,
            attributes={"callee": ir.FlatSymbolRefAttr.get(callee)},
        )
    op.results[0].replace_all_uses_with(call.results[0])
    return call


def _wrapper_text(name: str, kernel: CompiledKernel, config: MatmulConfig, m: _Match) -> str:
    """The kernel's wrapper: sizes as i32 push constants, workgroups from (M, N).

    The object carries the cubin as `data` and a `path` that is never read (IREE prefers
    `data`): IREE 3.13 prints an object without `path` as `<{, data = ...}>`, which its own
    parser rejects, and IR bytecode stores this attribute as text, so the IR would not load
    back.

    A persistent kernel launches min(SM count, tiles) workgroups, and a kernel with Triton
    global scratch gets it as a second result, `tensor<(programs x scratch + align)xi8>`
    (the kernel aligns its base: myelin.kernels._triton._bind_scratch_param), that nothing
    reads: IREE allocates it with the call's transients (an external dispatch has no other way
    to get device memory, and the kernel's launch takes nothing but bindings and constants)."""
    a_t, b_t, r_t = str(m.a_type), str(m.b_type), str(m.result_type)
    _, n, k = m.site.shape
    dynamic_m = m.site.shape[0] is None
    dims = "{%m}" if dynamic_m else ""
    m_value = (
        f"%m = tensor.dim %a, %c0 : {a_t}"
        if dynamic_m
        else f"%m = arith.constant {m.site.shape[0]} : index"
    )
    data = f'dense<"{_hex(kernel.cubin)}"> : vector<{len(kernel.cubin)}xi8>'
    tiles = f"(s0 ceildiv {config.block_m}) * (s1 ceildiv {config.block_n})"
    programs = kernel.max_programs
    if programs:
        count = f"affine.min affine_map<()[s0, s1] -> ({tiles}, {programs})>"
    else:
        count = f"affine.apply affine_map<()[s0, s1] -> ({tiles})>"
    binding = "#hal.pipeline.binding<storage_buffer"
    inputs = ["%a", "%b"] + (["%bias"] if m.bias is not None else [])
    input_types = [f"{a_t}{dims}", b_t] + ([str(m.bias.type)] if m.bias is not None else [])
    if config.merge:  # the other tensor the result is merged with: [M, N], as C
        inputs.append("%merge")
        input_types.append(f"{r_t}{dims}")
    bindings = [f"{binding}, ReadOnly>"] * len(inputs) + [f"{binding}>"]
    param_types = [t.split("{")[0] for t in input_types]  # no dynamic-size suffix
    params = ", ".join(f"{v}: {t}" for v, t in zip(inputs, param_types, strict=True))
    args = ", ".join(inputs)
    results, types = "%r", f"{r_t}{dims}"
    if kernel.scratch_bytes:
        if not programs:
            raise ValueError(f"{kernel.name}: scratch in a kernel that is not persistent")
        scratch_t = f"tensor<{programs * kernel.scratch_bytes + kernel.scratch_align}xi8>"
        bindings.append(f"{binding}>")
        results, types = "%r, %scratch", f"{types}, {scratch_t}"
    return f"""
util.func private @{name}({params}) -> {r_t} {{
  %c0 = arith.constant 0 : index
  {m_value}
  %n = arith.constant {n} : index
  %m_i32 = arith.index_cast %m : index to i32
  %n_i32 = arith.constant {n} : i32
  %k_i32 = arith.constant {k} : i32
  {results} = hal.dispatch.extern "{kernel.name}"[%m, %n](%m_i32, %n_i32, %k_i32, {args})
      : (i32, i32, i32, {", ".join(input_types)}) -> ({types})
    count(%device: !hal.device, %wm: index, %wn: index) -> (index, index, index) {{
      %x = {count}()[%wm, %wn]
      %one = arith.constant 1 : index
      hal.return %x, %one, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = 3, bindings = [
      {", ".join(bindings)}]>)
    objects({{
      #hal.executable.target<"cuda", "cuda-nvptx-fb"> ordinal(0) = [
        #hal.executable.object<{{path = "{kernel.name}.cubin", data = {data}}}>
      ]
    }})
    <{{workgroup_size = [{kernel.threads} : index, 1 : index, 1 : index],
       workgroup_local_memory = {kernel.shared_bytes} : index}}>
  util.return %r : {r_t}
}}
"""


def _conv_wrapper_text(
    name: str, kernel: CompiledKernel, config: MatmulConfig, m: _Match, x_type: ir.Type
) -> str:
    """The convolution kernel's wrapper: (x, filter [N, K]) -> [M, N], with M, N, K and the
    geometry as i32 push constants (the order of `CONV_GEOMETRY`), workgroups from (M, N)."""
    from myelin.kernels._triton import CONV_GEOMETRY

    assert m.im2col is not None
    geometry = m.im2col[1]
    x_t, b_t, r_t = str(x_type), str(m.b_type), str(m.result_type)
    size, n, k = m.site.shape
    values = {"M": size, "N": n, "K": k} | {g: geometry[g.lower()] for g in CONV_GEOMETRY}
    constants = "\n  ".join(f"%{g}_i32 = arith.constant {v} : i32" for g, v in values.items())
    names = ", ".join(f"%{g}_i32" for g in values)
    data = f'dense<"{_hex(kernel.cubin)}"> : vector<{len(kernel.cubin)}xi8>'
    tiles = f"(s0 ceildiv {config.block_m}) * (s1 ceildiv {config.block_n})"
    binding = "#hal.pipeline.binding<storage_buffer"
    return f"""
util.func private @{name}(%x: {x_t}, %b: {b_t}) -> {r_t} {{
  %m = arith.constant {size} : index
  %n = arith.constant {n} : index
  {constants}
  %r = hal.dispatch.extern "{kernel.name}"[%m, %n]({names}, %x, %b)
      : ({", ".join(["i32"] * len(values))}, {x_t}, {b_t}) -> ({r_t})
    count(%device: !hal.device, %wm: index, %wn: index) -> (index, index, index) {{
      %g = affine.apply affine_map<()[s0, s1] -> ({tiles})>()[%wm, %wn]
      %one = arith.constant 1 : index
      hal.return %g, %one, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = {len(values)}, bindings = [
      {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}>]>)
    objects({{
      #hal.executable.target<"cuda", "cuda-nvptx-fb"> ordinal(0) = [
        #hal.executable.object<{{path = "{kernel.name}.cubin", data = {data}}}>
      ]
    }})
    <{{workgroup_size = [{kernel.threads} : index, 1 : index, 1 : index],
       workgroup_local_memory = {kernel.shared_bytes} : index}}>
  util.return %r : {r_t}
}}
"""


def rewrite(
    module: ir.Operation,
    matches: list[_Match],
    kernels: dict[str, CompiledKernel],
    context: ir.Context,
) -> None:
    """Replace every matched op by a call of its kernel's wrapper (one wrapper per kernel and
    operand types)."""
    body = module.regions[0].blocks[0]
    wrappers: dict[tuple[str, str, str, str], str] = {}
    for m in (x for x in matches if x.config is not None):
        assert m.config is not None
        a_value = m.matmul.operands[0]
        x_value = m.im2col[0] if m.im2col is not None else a_value
        geometry = json.dumps(m.im2col[1], sort_keys=True) if m.im2col is not None else ""
        key = (m.config.name, str(x_value.type), str(m.b_type), str(m.result_type), geometry)
        name = wrappers.get(key)
        if name is None:
            name = wrappers[key] = f"__plex_kernel_{len(wrappers)}_{m.config.name}"
            kernel = kernels[m.config.name]
            text = (
                _conv_wrapper_text(name, kernel, m.config, m, x_value.type)
                if m.im2col is not None
                else _wrapper_text(name, kernel, m.config, m)
            )
            add_functions(body, text)
        operands = [x_value, m.b_value] + ([m.bias] if m.bias is not None else [])
        # a merge's other tensor may be made after the matmul (Llama's up projection, which
        # its gate's kernel multiplies by): the call then goes right before the merge
        merge = m.epilogue.merge_op
        if merge is not None:
            operands.append(_rows_of(m.epilogue, merge))
        call = call_in_place_of(m.root, name, operands, result_type=m.result_type, before=merge)
        if merge is not None and m.epilogue.expand is not None:
            m.epilogue.expand.move_before(merge)  # after the call now, as it reads the call
        fill = m.matmul.operands[2].owner
        m.root.erase()  # then what it consumed, consumer first: the truncf, the matmul
        if m.before_bias is not None and m.before_bias is not m.matmul:
            m.before_bias.erase()
        if m.root is not m.matmul:
            m.matmul.erase()
        fill = getattr(fill, "operation", fill)
        if fill.name == "linalg.fill" and not list(fill.results[0].uses):
            fill.erase()
        if m.transpose is not None and not list(m.transpose.results[0].uses):
            m.transpose.erase()
        if m.im2col is not None:  # the columns nothing reads now: the collapse, the gather
            _erase_unused(a_value)
        _apply_epilogue(m.epilogue, call)


def without_merge(m: _Match, why: str) -> None:
    """The match without its merge, which then stays a dispatch of IREE's (`why` says why)."""
    assert m.config is not None
    merge = m.config.merge
    m.config = dataclasses.replace(m.config, merge="")
    m.epilogue = dataclasses.replace(m.epilogue, merge="", merge_op=None)
    reason = m.site.reason.replace(f" and {merge}", "", 1)
    m.site = dataclasses.replace(m.site, kernel=m.config.name, reason=f"{reason} ({why})")


def _rows_of(epilogue: Epilogue, before: ir.Operation) -> ir.Value:
    """The merge's other tensor as the kernel reads it, [M, N]: through the collapse that
    undoes the result's reshape to [batch, tokens, N], inserted before `before`."""
    other = epilogue.merge_operand
    assert other is not None
    if epilogue.expand is None:
        return other
    expand = epilogue.expand
    with ir.InsertionPoint(before), before.location:
        collapse = ir.Operation.create(
            "tensor.collapse_shape",
            results=[expand.operands[0].type],
            operands=[other],
            attributes={"reassociation": expand.attributes["reassociation"]},
        )
    return collapse.results[0]


def _apply_epilogue(epilogue: Epilogue, call: ir.Operation) -> None:
    """The kernel does the epilogue's work: what read the last of its ops reads the kernel's
    result (through its reshape, if any) instead, and the ops go, consumer first."""
    last = epilogue.last
    if last is None:
        return
    value = epilogue.expand.results[0] if epilogue.expand is not None else call.results[0]
    last.results[0].replace_all_uses_with(value)
    for op in epilogue.ops:
        op.erase()


def _erase_unused(value: ir.Value) -> None:
    """Erase the op that made `value` once nothing uses it, then its producers that way."""
    while not list(value.uses):
        owner = owner_op(value)
        if owner is None or len(owner.results) != 1:
            return
        source = owner.operands[0] if len(owner.operands) else None
        owner.erase()
        if source is None:
            return
        value = source
