"""Ops placed on an external backend become dispatches that call it (at the `input` phase).

Each covered op (today `matmul`: f32 `linalg.matmul` and `linalg.batch_matmul` whose output
starts as zeros) is replaced by a `flow.dispatch` of one `stream.executable` per backend device,
whose workgroups each call the import `plex_<backend>_matmul` on their slice of the op (whole
batches, else blocks of rows) with the bindings' base pointers, offsets and sizes (IREE's
executable-plugin calling convention, `llvm.bareptr`). Attention is decomposed first into two
batch matmuls and a codegen softmax (myelin.compiler.backend_attention). The dispatch
carries the backend device's `stream.affinity`, which IREE honours on `flow.dispatch` ops; the
plugin resolves the import when the device loads the executable (myelin.runtime.backends).

What the rewrite looks through, so the vendor call sees the model's own weights: a
`linalg.transpose` of a 2-D B (the call transposes instead: no transposed copy of the weight),
and a batch_matmul whose B is a 2-D matrix broadcast over the batch (one [batch*M, K] x [K, N]
call instead of `batch` calls). An op that does not fit (another dtype, an accumulating output,
fewer multiply-adds than the backend's `min_flops`) stays with IREE's code generation, and the
report says why.

Every device of the variant is host memory (a backend device is a local-task device), so the
module gets a `stream.topology` with unified-memory links between them: Stream then passes the
same buffers across devices instead of copying them (measured: without it, every call copied
its inputs and weights).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from iree.compiler import ir

from myelin.backends import import_symbol
from myelin.compiler import backend_attention, backend_gelu
from myelin.compiler.backend_attention import ATTENTION, decompose_attention
from myelin.compiler.backend_attention import why_not as attention_why_not
from myelin.compiler.placement import walk_region
from myelin.compiler.workgroup_split import workgroup_share
from myelin.errors import CompileError

TRANSPOSE_B = 1  # PLEX_MATMUL_TRANSPOSE_B
SHARED_B = 2  # PLEX_MATMUL_SHARED_B
# A call is split into workgroups that the device's worker pool runs in parallel, each calling
# the backend on its slice: whole batches; else, where op(B) has more columns than A has rows
# (MiniLM at batch 1: 128 rows, 384 or 1536 columns), blocks of columns, so each call packs
# only its own part of the weight; else blocks of rows (each call packs all of B again). At
# most MAX_WORKGROUPS, row blocks of at least MIN_MATMUL_ROWS_PER_WORKGROUP rows and column
# blocks of at least MIN_COLUMNS_PER_WORKGROUP columns (two blocks for a 384-wide weight: one
# per worker of a 2-core pool; fewer, larger calls pack less). The row minimum is large because
# every row block packs all of B again: MiniLM at batch 32 (4096 rows) in 8 blocks instead of 16
# ran 6% faster on two cores with MKL (docs/benchmarks.md, "MiniLM on the MKL backend"), and 8
# blocks still feed 8 workers. An elementwise op (the GELU) packs nothing: its rows split finer.
MAX_WORKGROUPS = 16
MIN_MATMUL_ROWS_PER_WORKGROUP = 512
MIN_COLUMNS_PER_WORKGROUP = 192
MIN_ROWS_PER_WORKGROUP = 64

# (device, backend, op, min_flops), in [placement] order
BackendOpRule = tuple[str, str, str, int]

_MATMULS = ("linalg.matmul", "linalg.batch_matmul")


@dataclass(frozen=True)
class BackendCall:
    """One op the rewrite looked at: where it went, or why it stayed with codegen."""

    function: str
    op: str
    device: str | None  # None: kept by IREE's code generation
    shape: str  # "batch x m x n x k", with ? for dynamic sizes
    note: str  # how it was called (flags) or why it was kept

    def to_json(self) -> dict:
        return {
            "function": self.function,
            "op": self.op,
            "device": self.device,
            "shape": self.shape,
            "note": self.note,
        }


def _executable_text(name: str, backend: str) -> str:
    symbol = import_symbol(backend, "matmul")
    # The subspans' memrefs have a dynamic offset: Stream packs several tensors into one
    # buffer and passes each one's offset to the dispatch; with an identity layout the offset
    # folds to 0 and every call would see the buffer's start (measured: wrong results).
    # Workgroup w of W takes its share of the call's units (the batch when batch > 1, else the
    # columns of op(B) and C where n > m, else the rows of A and C) and calls the backend on
    # that slice: the local-task pool spreads the workgroups over its workers, so the vendor
    # library runs single-threaded on each. `ld` (the op's whole n) stays the row stride.
    return f"""
#dyn = strided<[1], offset: ?>
stream.executable private @{name} {{
  stream.executable.export public @matmul workgroups(%w: index) -> (index, index, index) {{
    %c1 = arith.constant 1 : index
    stream.return %w, %c1, %c1 : index, index, index
  }}
  builtin.module {{
    func.func private @{symbol}(memref<f32>, index, memref<f32>, index, memref<f32>, index,
        index, index, index, index, index, index) attributes {{llvm.bareptr = true}}
    func.func @matmul(%ba: !stream.binding, %bb: !stream.binding, %bc: !stream.binding,
        %batch: index, %m: index, %n: index, %k: index, %flags: index, %lb: index) {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %bm = arith.muli %batch, %m : index
      %la = arith.muli %bm, %k : index
      %lc = arith.muli %bm, %n : index
      %a = stream.binding.subspan %ba[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%la}}
      %b = stream.binding.subspan %bb[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lb}}
      %c = stream.binding.subspan %bc[%c0] : !stream.binding -> memref<?xf32, #dyn>{{%lc}}
      %a0, %ao, %as, %ast = memref.extract_strided_metadata %a
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %b0, %bo, %bs, %bst = memref.extract_strided_metadata %b
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %c0p, %co, %cs, %cst = memref.extract_strided_metadata %c
          : memref<?xf32, #dyn> -> memref<f32>, index, index, index
      %by_batch = arith.cmpi ugt, %batch, %c1 : index
      %wide = arith.cmpi ugt, %n, %m : index
      %one = arith.cmpi eq, %batch, %c1 : index
      %by_cols = arith.andi %one, %wide : i1
      %rows_or_cols = arith.select %by_cols, %n, %m : index
      %units = arith.select %by_batch, %batch, %rows_or_cols : index
      {workgroup_share("%units")}
      %mk = arith.muli %m, %k : index
      %mn = arith.muli %m, %n : index
      %kn = arith.muli %k, %n : index
      %tflag = arith.andi %flags, %c1 : index
      %transposed = arith.cmpi ne, %tflag, %c0 : index
      %b_col = arith.select %transposed, %k, %c1 : index
      %a_row = arith.select %by_cols, %c0, %k : index
      %b_row = arith.select %by_cols, %b_col, %c0 : index
      %c_row = arith.select %by_cols, %c1, %n : index
      %a_unit = arith.select %by_batch, %mk, %a_row : index
      %b_unit = arith.select %by_batch, %kn, %b_row : index
      %c_unit = arith.select %by_batch, %mn, %c_row : index
      %a_skip = arith.muli %first, %a_unit : index
      %b_skip = arith.muli %first, %b_unit : index
      %c_skip = arith.muli %first, %c_unit : index
      %ao2 = arith.addi %ao, %a_skip : index
      %bo2 = arith.addi %bo, %b_skip : index
      %co2 = arith.addi %co, %c_skip : index
      %batch2 = arith.select %by_batch, %count, %batch : index
      %row_count = arith.select %by_cols, %m, %count : index
      %m2 = arith.select %by_batch, %m, %row_count : index
      %n2 = arith.select %by_cols, %count, %n : index
      func.call @{symbol}(%a0, %ao2, %b0, %bo2, %c0p, %co2, %batch2, %m2, %n2, %k, %flags, %n)
          : (memref<f32>, index, memref<f32>, index, memref<f32>, index, index, index, index,
             index, index, index) -> ()
      return
    }}
  }}
}}
"""


def _functions(module: ir.Operation) -> Iterator[ir.Operation]:
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name in ("util.func", "func.func") and op.regions and op.regions[0].blocks:
            yield op


def _producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _is_zero_fill(value: ir.Value) -> bool:
    fill = _producer(value)
    if fill is None or fill.name != "linalg.fill":
        return False
    scalar = _producer(fill.operands[0])
    if scalar is None or scalar.name != "arith.constant":
        return False
    attr = scalar.attributes["value"]
    return isinstance(attr, ir.FloatAttr) and ir.FloatAttr(attr).value == 0.0


def _transposed_2d(value: ir.Value) -> ir.Value | None:
    """The source of a `linalg.transpose` with permutation [1, 0], else None."""
    op = _producer(value)
    if op is None or op.name != "linalg.transpose":
        return None
    if list(ir.DenseI64ArrayAttr(op.attributes["permutation"])) != [1, 0]:
        return None
    return op.operands[0]


def _transposed_batch(value: ir.Value) -> ir.Value | None:
    """The source of a `linalg.transpose` of a 3-D tensor with permutation [0, 2, 1], else None."""
    op = _producer(value)
    if op is None or op.name != "linalg.transpose":
        return None
    if list(ir.DenseI64ArrayAttr(op.attributes["permutation"])) != [0, 2, 1]:
        return None
    return op.operands[0]


def _broadcast_2d(value: ir.Value) -> ir.Value | None:
    """The 2-D source of a linalg.generic that copies it along a new leading dim, else None."""
    op = _producer(value)
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    maps = [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if maps != [
        "affine_map<(d0, d1, d2) -> (d1, d2)>",
        "affine_map<(d0, d1, d2) -> (d0, d1, d2)>",
    ]:
        return None
    body = list(op.regions[0].blocks[0].operations)
    block = op.regions[0].blocks[0]
    if len(body) != 1 or body[0].operation.name != "linalg.yield":
        return None
    if body[0].operation.operands[0] != block.arguments[0]:
        return None
    return op.operands[0]


def _f32_tensor(value: ir.Value) -> ir.RankedTensorType | None:
    t = value.type
    if not isinstance(t, ir.RankedTensorType):
        return None
    t = ir.RankedTensorType(t)
    return t if isinstance(t.element_type, ir.F32Type) else None


class _Builder:
    """Index values and ops inserted before one op."""

    def __init__(self, before: ir.Operation) -> None:
        self.point = ir.InsertionPoint(before)
        self.location = before.location
        self.index = ir.IndexType.get()

    def _create(self, name: str, operands: list, results: list, attributes: dict) -> ir.Operation:
        op = ir.Operation.create(
            name, results=results, operands=operands, attributes=attributes, loc=self.location
        )
        self.point.insert(op)
        return op

    def constant(self, value: int) -> ir.Value:
        attr = ir.IntegerAttr.get(self.index, value)
        return self._create("arith.constant", [], [self.index], {"value": attr}).result

    def dim(self, tensor: ir.Value, axis: int) -> ir.Value:
        size = ir.RankedTensorType(tensor.type).shape[axis]
        if size != ir.ShapedType.get_dynamic_size():
            return self.constant(size)
        return self._create("tensor.dim", [tensor, self.constant(axis)], [self.index], {}).result

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self._create("arith.muli", [a, b], [self.index], {}).result

    def binary(self, name: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return self._create(name, [a, b], [self.index], {}).result

    def _ugt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        pred = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 8)  # ugt
        i1 = ir.IntegerType.get_signless(1)
        return self._create("arith.cmpi", [a, b], [i1], {"predicate": pred}).result

    def _select(self, condition: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self._create("arith.select", [condition, a, b], [self.index], {}).result

    def workgroups(self, batch: ir.Value, m: ir.Value, n: ir.Value) -> ir.Value:
        """How many workgroups a matmul call is split into (the executable's slicing, see
        above: batches, else column blocks where n > m, else row blocks)."""
        rows = self.binary("arith.ceildivui", m, self.constant(MIN_MATMUL_ROWS_PER_WORKGROUP))
        cols = self.binary("arith.ceildivui", n, self.constant(MIN_COLUMNS_PER_WORKGROUP))
        blocks = self._select(self._ugt(n, m), cols, rows)
        units = self._select(self._ugt(batch, self.constant(1)), batch, blocks)
        return self.binary("arith.minui", units, self.constant(MAX_WORKGROUPS))

    def dynamic_dims(self, tensor: ir.Value) -> list[ir.Value]:
        t = ir.RankedTensorType(tensor.type)
        return [self.dim(tensor, i) for i in range(t.rank) if t.is_dynamic_dim(i)]

    def dispatch(
        self,
        executable: str,
        operands: list[ir.Value],
        init: ir.Value,
        device: str,
        *,
        tensors: int = 2,
        entry: str = "matmul",
        workgroups: ir.Value | None = None,
    ) -> ir.Value:
        """The call; its result has the type and dims of `init` (the op's zero output). The
        first `tensors` operands are tensors, the rest index scalars; by default the call is
        split as a matmul's (batch, m, n)."""
        scalars = operands[tensors:]
        tensor_operands = operands[:tensors]
        argument_dims = [d for t in tensor_operands for d in self.dynamic_dims(t)]
        result_dims = self.dynamic_dims(init)
        workload = [workgroups or self.workgroups(scalars[0], scalars[1], scalars[2])]
        attributes = {
            "entry_points": ir.ArrayAttr.get([ir.SymbolRefAttr.get([executable, entry])]),
            "operandSegmentSizes": ir.DenseI32ArrayAttr.get(
                [len(workload), len(operands), len(argument_dims), len(result_dims)]
            ),
            "tied_operands": ir.ArrayAttr.get([ir.IntegerAttr.get(self.index, -1)]),
            "stream.affinity": ir.Attribute.parse(f"#hal.device.affinity<@{device}>"),
        }
        op = self._create(
            "flow.dispatch",
            [*workload, *operands, *argument_dims, *result_dims],
            [init.type],
            attributes,
        )
        return op.result


def _static(t: ir.RankedTensorType, axis: int) -> int | None:
    return None if t.is_dynamic_dim(axis) else t.shape[axis]


def _shape_text(*sizes: int | None) -> str:
    return " x ".join("?" if s is None else str(s) for s in sizes)


def place_backend_ops(
    module: ir.Operation,
    rules: Sequence[BackendOpRule],
    devices: Sequence[str],
    *,
    what: str = "module",
) -> list[BackendCall]:
    """Rewrite the ops `rules` place on backend devices into calls of their backends.

    Call inside the module's context, on IR at the `input` phase. Returns one record per op of
    a placed kind, placed or kept (the build reports them).
    """
    matmul_rule = next((r for r in rules if r[2] == "matmul"), None)
    attention_rule = next((r for r in rules if r[2] == "attention"), None)
    gelu_rule = next((r for r in rules if r[2] == "gelu"), None)
    if matmul_rule is None and attention_rule is None and gelu_rule is None:
        return []
    # Ops are created by name: their dialects must be loaded, or they are built unregistered
    # (and come back from bytecode as other ops).
    for dialect in ("arith", "tensor", "flow", "stream", "hal"):
        ir.Context.current.dialects[dialect]
    for rule in (matmul_rule, attention_rule, gelu_rule):
        if rule is not None and rule[0] not in devices:
            raise CompileError(
                f"{what}: backend device '{rule[0]}' is not a device of this variant"
            )
    calls: list[BackendCall] = []
    executables: dict[str, str] = {}  # symbol -> text, inserted once at the end
    for fn in list(_functions(module)):
        fn_name = ir.StringAttr(fn.attributes["sym_name"]).value
        for op in [o for o in walk_region(fn.regions[0]) if o.name == ATTENTION]:
            name = f"plex_attention_{len(calls)}"
            placed = _place_attention(
                module, op, fn_name, name, (matmul_rule, attention_rule), executables
            )
            calls.append(placed)
    if gelu_rule is not None:
        for fn in list(_functions(module)):
            fn_name = ir.StringAttr(fn.attributes["sym_name"]).value
            for op in [o for o in walk_region(fn.regions[0]) if o.name == "linalg.generic"]:
                if backend_gelu.is_gelu(op):
                    calls.append(_call_gelu(op, fn_name, gelu_rule, executables))
    if matmul_rule is not None:
        calls += _place_matmuls(module, matmul_rule, executables)
    if executables:
        block = module.regions[0].blocks[0]
        for text in executables.values():
            parsed = ir.Module.parse(text)
            for op in list(parsed.body.operations):
                op.operation.detach_from_parent()
                ir.InsertionPoint.at_block_begin(block).insert(op)
        _unified_memory(module, devices)
    return calls


def _place_matmuls(
    module: ir.Operation, rule: BackendOpRule, executables: dict[str, str]
) -> list[BackendCall]:
    device, backend, _, min_flops = rule
    executable = f"plex_backend_{device}"
    calls: list[BackendCall] = []
    rewritten = 0
    for fn in list(_functions(module)):
        fn_name = ir.StringAttr(fn.attributes["sym_name"]).value
        for op in [o for o in walk_region(fn.regions[0]) if o.name in _MATMULS]:
            call = _rewrite_matmul(op, fn_name, executable, device, min_flops)
            calls.append(call)
            rewritten += call.device is not None
    if rewritten:
        executables[executable] = _executable_text(executable, backend)
    return calls


def _place_attention(
    module: ir.Operation,
    op: ir.Operation,
    fn_name: str,
    name: str,
    rules: tuple[BackendOpRule | None, BackendOpRule | None],
    executables: dict[str, str],
) -> BackendCall:
    """An attention: one fused call where its backend implements `attention` and the op fits,
    else decomposed around two backend matmuls where matmuls are placed, else kept."""
    matmul_rule, attention_rule = rules
    why = attention_why_not(op)
    if why is None and attention_rule is not None:
        bits = backend_attention.scale_bits(op)
        if bits is not None:
            return _call_attention(op, fn_name, attention_rule, bits, executables)
        if matmul_rule is None:
            why = "a scale that is not a constant"
    if why is not None or matmul_rule is None:
        return BackendCall(fn_name, ATTENTION, None, "", why or "its matmuls are not placed")
    decompose_attention(module, op, name)
    note = "decomposed: Q @ K^T and P @ V on the backend, softmax codegen"
    return BackendCall(fn_name, ATTENTION, matmul_rule[0], "", note)


def _call_attention(
    op: ir.Operation,
    fn_name: str,
    rule: BackendOpRule,
    bits: int,
    executables: dict[str, str],
) -> BackendCall:
    """One dispatch calling the backend's `attention` on the op's operands, split over heads."""
    device, backend, _, _ = rule
    flags = backend_attention.mask_flags(op)
    ins = list(op.operands)[:-1]
    q, k, v = ins[:3]
    init = op.operands[-1]
    build = _Builder(op)
    # Q, K, V as the projections wrote them ([batch, len, heads, e]: no head transposes), and a
    # mask broadcast over the heads as its source, where the IR shows them so
    split = [backend_attention.heads_source(x) for x in (q, k, v)]
    heads = 1
    if all(split) and len({h for _, h in split}) == 1:  # type: ignore[misc]
        (q, heads), (k, _), (v, _) = split  # type: ignore[misc]
        flags |= backend_attention.HEADS_INTERLEAVED
        units = build.mul(build.dim(q, 0), build.constant(heads))
        l_, e, s, ev = build.dim(q, 1), build.dim(q, 3), build.dim(k, 1), build.dim(v, 3)
    else:
        units, l_, e = (build.dim(q, axis) for axis in range(3))
        s, ev = build.dim(k, 1), build.dim(v, 2)
    mask = ins[4] if flags & (backend_attention.MASK_BOOL | backend_attention.MASK_ADD) else None
    shared = backend_attention.mask_source(mask) if mask is not None else None
    if shared is not None and (heads == 1 or shared[1] == heads):
        mask, heads = shared
        flags |= backend_attention.MASK_PER_BATCH
    mask_length = build.constant(1)
    for axis in range(ir.RankedTensorType(mask.type).rank if mask is not None else 0):
        mask_length = build.mul(mask_length, build.dim(mask, axis))
    tensors = [q, k, v, *([mask] if mask is not None else [])]
    scalars = [units, build.constant(heads), l_, s, e, ev, mask_length]
    scalars += [build.constant(bits), build.constant(flags)]
    workgroups = build.binary("arith.minui", units, build.constant(MAX_WORKGROUPS))
    executable = f"plex_backend_{device}_attention_{flags}"
    executables[executable] = backend_attention.executable_text(
        executable, import_symbol(backend, "attention"), flags
    )
    called = build.dispatch(
        executable,
        [*tensors, *scalars],
        init,
        device,
        tensors=len(tensors),
        entry=executable,
        workgroups=workgroups,
    )
    op.results[0].replace_all_uses_with(called)
    op.erase()
    kinds = {backend_attention.MASK_BOOL: "i1 mask", backend_attention.MASK_ADD: "f32 mask"}
    notes = [kinds.get(flags & 3, "no mask")]
    if flags & backend_attention.HEADS_INTERLEAVED:
        notes.append("Q, K, V read as projected (no head transposes)")
    if flags & backend_attention.MASK_PER_BATCH:
        notes.append("one mask per batch")
    note = f"fused call: {', '.join(notes)}, split over the heads"
    return BackendCall(fn_name, ATTENTION, device, "", note)


def _call_gelu(
    op: ir.Operation, fn_name: str, rule: BackendOpRule, executables: dict[str, str]
) -> BackendCall:
    """One dispatch calling the backend's `gelu` on the op's input (and the bias add feeding
    it, taken along), split over the rows."""
    device, backend, _, _ = rule
    x, init = op.operands[0], op.operands[1]
    source = backend_gelu.bias_source(x)
    flags = 0
    tensors = [x]
    if source is not None:
        tensors, flags = list(source), backend_gelu.BIAS
    build = _Builder(op)
    t = ir.RankedTensorType(tensors[0].type)
    rows = build.constant(1)
    for axis in range(t.rank - 1):
        rows = build.mul(rows, build.dim(tensors[0], axis))
    n = build.dim(tensors[0], t.rank - 1)
    blocks = build.binary("arith.ceildivui", rows, build.constant(MIN_ROWS_PER_WORKGROUP))
    workgroups = build.binary("arith.minui", blocks, build.constant(MAX_WORKGROUPS))
    executable = f"plex_backend_{device}_gelu_{flags}"
    executables[executable] = backend_gelu.executable_text(
        executable, import_symbol(backend, "gelu"), bool(flags)
    )
    called = build.dispatch(
        executable,
        [*tensors, rows, n, build.constant(flags)],
        init,
        device,
        tensors=len(tensors),
        entry=executable,
        workgroups=workgroups,
    )
    op.results[0].replace_all_uses_with(called)
    op.erase()
    shape = _shape_text(*(None if t.is_dynamic_dim(i) else t.shape[i] for i in range(t.rank)))
    note = "with the bias add before it" if flags else "plain"
    return BackendCall(fn_name, "gelu", device, shape, note)


def _rewrite_matmul(
    op: ir.Operation, fn_name: str, executable: str, device: str, min_flops: int
) -> BackendCall:
    a, b, out = op.operands[0], op.operands[1], op.operands[2]
    result = op.results[0]
    types = [_f32_tensor(v) for v in (a, b, out)]
    batched = op.name == "linalg.batch_matmul"

    def kept(why: str, shape: str = "") -> BackendCall:
        return BackendCall(fn_name, op.name, None, shape, why)

    if any(t is None for t in types):
        return kept("not f32")
    ta = types[0]
    assert ta is not None
    if not _is_zero_fill(out):
        return kept("its output accumulates into a value that is not zeros")
    flags = 0
    shared = None
    if batched:
        shared = _broadcast_2d(b)
        if shared is not None:
            b, flags = shared, SHARED_B
    # a 2-D B (or one shared by the batch) transposed, or each batch's B transposed
    source = _transposed_2d(b) if not batched or shared is not None else _transposed_batch(b)
    if source is not None and _f32_tensor(source) is not None:
        b, flags = source, flags | TRANSPOSE_B
    tb = ir.RankedTensorType(b.type)
    m_axis = 1 if batched else 0
    sizes = {
        "batch": _static(ta, 0) if batched else 1,
        "m": _static(ta, m_axis),
        "k": _static(ta, m_axis + 1),
        "n": _static(tb, tb.rank - 2 if flags & TRANSPOSE_B else tb.rank - 1),
    }
    shape = _shape_text(sizes["batch"], sizes["m"], sizes["n"], sizes["k"])
    if all(v is not None for v in sizes.values()):
        flops = sizes["batch"] * sizes["m"] * sizes["n"] * sizes["k"]  # type: ignore[operator]
        if flops < min_flops:
            return kept(f"{flops} multiply-adds, below the backend's min_flops", shape)

    build = _Builder(op)
    batch = build.dim(a, 0) if batched else build.constant(1)
    m = build.dim(a, m_axis)
    k = build.dim(a, m_axis + 1)
    n = build.dim(b, tb.rank - 2 if flags & TRANSPOSE_B else tb.rank - 1)
    if flags & SHARED_B:  # one [batch*m, k] x [k, n] call: A and C are contiguous row-major
        m, batch = build.mul(batch, m), build.constant(1)
    b_length = build.constant(1)
    for axis in range(tb.rank):
        b_length = build.mul(b_length, build.dim(b, axis))
    called = build.dispatch(
        executable, [a, b, batch, m, n, k, build.constant(flags), b_length], out, device
    )
    result.replace_all_uses_with(called)
    op.erase()
    notes = [n for bit, n in ((TRANSPOSE_B, "transposed B"), (SHARED_B, "shared B")) if flags & bit]
    return BackendCall(fn_name, op_name_of(batched), device, shape, ", ".join(notes) or "plain")


def op_name_of(batched: bool) -> str:
    return "linalg.batch_matmul" if batched else "linalg.matmul"


def _unified_memory(module: ir.Operation, devices: Sequence[str]) -> None:
    """Every device of a variant with a backend is host memory: tell Stream so (no copies), and
    keep code nobody placed on the variant's first device (IREE would pick one itself)."""
    links = ", ".join(
        f"(@{a} -> @{b} = {{unified_memory = true, transparent_access = true}})"
        for a in devices
        for b in devices
        if a != b
    )
    module.attributes["stream.topology"] = ir.Attribute.parse(
        f"#hal.device.topology<links = [{links}]>"
    )
    if "stream.affinity" not in module.attributes:
        module.attributes["stream.affinity"] = ir.Attribute.parse(
            f"#hal.device.promise<@{devices[0]}>"
        )
