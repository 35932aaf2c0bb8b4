"""Storage twins: for each public function `f` whose results are all tensors, a public
`f$into(args..., %out0: !hal.buffer_view {myelin.result = 0 : index}, ...,
%transients: !hal.buffer {myelin.transients})` that calls `f`.

Why: IREE 3.13's CUDA allocator exports (DLPack) only memory it imported, never memory it
allocated itself, and IREE writes a result into caller memory only where the program ties it to
that storage (`hal.tensor.alias`). Models do not declare such storage, so the build adds the
twin at the input phase: the runtime passes memory it allocated and imported, the result
aliases it, and the result exports. The twin's call of `f` is inlined like any call, so the
result is written into the storage by the graph's own last dispatch (no copy).

The twin also takes the call's transient memory (the intermediates IREE would otherwise take
with `hal.device.queue.alloca` and give back with a `queue.dealloca` that waits on the host):
each result passes through `hal.tensor.transients` from that buffer, IREE's own form for
caller-provided transients (its torch input conversion emits the same with
`--iree-torch-externalize-transients`). IREE then compiles `f$into_transients_size`, named in
the twin's `iree.abi.transients.size` reflection (and `...size.constant` when it does not
depend on the inputs), which the runtime calls to size the buffer it keeps per entrypoint.
With both, a call allocates nothing on the device queue. The alias comes before the
transients op: the other order (what IREE's ABI pass does with `iree.abi.output`) makes IREE
allocate the result and copy it into the storage. Everything here is public IREE input
(`util.func`, `util.call`, `hal.tensor.alias`, `hal.tensor.transients`); no IREE pass is changed.

A function that writes module state (`util.global.store`, e.g. a causal LM's KV cache) gets no
twin: IREE 3.13's `iree-stream-emplace-transients` fails on such a twin for CUDA ("
'stream.resource.subview' op using value defined outside the region": the state's update is
placed in the transients buffer, which the twin imports only after the call's work). Its calls
allocate their transients on the device queue as any call without a twin does.
"""

from __future__ import annotations

from iree.compiler import ir

from myelin.signature import STORAGE_TWIN_SUFFIX, TWIN_RESULT_ATTRIBUTE, TWIN_TRANSIENTS_ATTRIBUTE

_OUTPUT_ATTRIBUTE = "iree.abi.output"
# Function attributes the twin does not copy from `f`: its own name, type and argument and
# result attributes (rebuilt below), and its visibility (always public).
_OWN_ATTRIBUTES = frozenset(
    {"sym_name", "function_type", "arg_attrs", "res_attrs", "sym_visibility", "tied_operands"}
)


def add_storage_twins(module: ir.Operation) -> tuple[str, ...]:
    """Add `f$into` for every public function of `module` that can have one; returns the
    names of the functions that got a twin. Call inside the module's context, after the
    placement attributes are set (the twin copies `f`'s affinities)."""
    block = module.regions[0].blocks[0]
    names = {_name(op) for op in _functions(module)}
    twinned = []
    for op in list(_functions(module)):
        name = _name(op)
        if not _wants_twin(op, name, names):
            continue
        _append_twin(op, name, block)
        twinned.append(name)
    return tuple(twinned)


def _functions(module: ir.Operation):
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name in ("util.func", "func.func"):
            yield op.operation


def _name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _is_public(op: ir.Operation) -> bool:
    attrs = op.attributes
    return "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value == "public"


def _wants_twin(op: ir.Operation, name: str, names: set[str]) -> bool:
    """Public functions with a body whose results are all ranked tensors (at least one), that
    take no result storage already and have no twin yet."""
    if not _is_public(op) or len(op.regions[0].blocks) == 0:
        return False
    if name.endswith(STORAGE_TWIN_SUFFIX) or name + STORAGE_TWIN_SUFFIX in names:
        return False
    ftype = _function_type(op)
    if not ftype.results or not all(isinstance(t, ir.RankedTensorType) for t in ftype.results):
        return False
    if any(_OUTPUT_ATTRIBUTE in d for d in _dicts(op, "arg_attrs", len(ftype.inputs))):
        return False
    return not _returns_an_argument(op) and not _writes_state(op, _by_name(op))


_STORE = "util.global.store"
_CALLS = ("util.call", "func.call")


def _by_name(op: ir.Operation) -> dict[str, ir.Operation]:
    """The functions of the module that holds `op`, by name."""
    module = op.parent
    while module is not None and module.name != "builtin.module":
        module = module.parent
    return {_name(f): f for f in _functions(module)} if module is not None else {}


def _writes_state(op: ir.Operation, functions: dict[str, ir.Operation]) -> bool:
    """Whether `op`, or a function it calls in the module, stores a global."""
    seen: set[str] = set()
    pending = [op]
    while pending:
        for inner in _nested(pending.pop()):
            if inner.name == _STORE:
                return True
            if inner.name in _CALLS:
                callee = ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
                if callee not in seen and callee in functions:
                    seen.add(callee)
                    pending.append(functions[callee])
    return False


def _nested(op: ir.Operation):
    """Every operation inside `op`'s regions, at any depth."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _nested(inner.operation)


def _returns_an_argument(op: ir.Operation) -> bool:
    """Whether `op` returns one of its arguments as it is. Such a result aliases the caller's
    (imported) tensor and exports already; with storage, IREE would copy it in."""
    for block in op.regions[0].blocks:
        terminator = list(block.operations)[-1].operation
        if terminator.name not in ("util.return", "func.return"):
            continue
        if any(isinstance(v, ir.BlockArgument) for v in terminator.operands):
            return True
    return False


def _function_type(op: ir.Operation) -> ir.FunctionType:
    return ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)


def _dicts(op: ir.Operation, key: str, count: int) -> list[dict[str, ir.Attribute]]:
    """The argument (or result) attribute dictionaries of `op`, one per position."""
    old = list(ir.ArrayAttr(op.attributes[key])) if key in op.attributes else []
    out = []
    for i in range(count):
        d = ir.DictAttr(old[i]) if i < len(old) else None
        out.append({d[j].name: d[j].attr for j in range(len(d))} if d is not None else {})
    return out


def _render(attrs: dict[str, ir.Attribute]) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}"


def _append_twin(op: ir.Operation, name: str, block: ir.Block) -> None:
    """Append the twin to `block`: parsed as text next to a private declaration of `f` (so
    the call verifies), then moved out of that scratch module."""
    ftype = _function_type(op)
    inputs, results = list(ftype.inputs), list(ftype.results)
    arg_attrs = _dicts(op, "arg_attrs", len(inputs))
    res_attrs = _dicts(op, "res_attrs", len(results))
    index = ir.IndexType.get()
    params = [
        f"%a{i}: {t} {_render(a)}" for i, (t, a) in enumerate(zip(inputs, arg_attrs, strict=True))
    ]
    for n in range(len(results)):
        marker = {TWIN_RESULT_ATTRIBUTE: ir.IntegerAttr.get(index, n)}
        params.append(f"%out{n}: !hal.buffer_view {_render(marker)}")
    params.append(f"%transients: !hal.buffer {{{TWIN_TRANSIENTS_ATTRIBUTE}}}")
    arg_types = ", ".join(str(t) for t in inputs)
    res_types = ", ".join(str(t) for t in results)
    res_list = ", ".join(f"{t} {_render(a)}" for t, a in zip(results, res_attrs, strict=True))
    extra = {k: op.attributes[k] for k in op.attributes if k not in _OWN_ATTRIBUTES}
    attributes = f" attributes {_render(extra)}" if extra else ""
    operands = ", ".join(f"%a{i}" for i in range(len(inputs)))
    body = [
        f"  %r:{len(results)} = util.call @{_quote(name)}({operands}) : "
        f"({arg_types}) -> ({res_types})"
    ]
    for n, (t, a) in enumerate(zip(results, res_attrs, strict=True)):
        body += _tie_result(n, ir.RankedTensorType(t), a.get("iree.abi.affinity"))
    values = ", ".join(f"%t{n}" for n in range(len(results)))
    twin = name + STORAGE_TWIN_SUFFIX
    text = (
        f"util.func private @{_quote(name)}({arg_types}) -> ({res_types})\n"
        f"util.func public @{_quote(twin)}({', '.join(params)}) -> ({res_list}){attributes} {{\n"
        + "\n".join(body)
        + f"\n  util.return {values} : {res_types}\n"
        "}\n"
    )
    scratch = ir.Module.parse(text)
    block.append(list(scratch.body.operations)[1].operation)


def _tie_result(n: int, t: ir.RankedTensorType, affinity: ir.Attribute | None) -> list[str]:
    """The lines that write result `n` (`%r#n`) into `%out{n}` and take its transients from
    `%transients`, ending in `%t{n}`."""
    lines, dims = [], []
    for axis in range(t.rank):
        if t.is_dynamic_dim(axis):
            lines.append(f"  %c{n}_{axis} = arith.constant {axis} : index")
            lines.append(f"  %d{n}_{axis} = tensor.dim %r#{n}, %c{n}_{axis} : {t}")
            dims.append(f"%d{n}_{axis}")
    shaped = f"{t}{{{', '.join(dims)}}}" if dims else str(t)
    on = f"on({affinity}) " if affinity is not None else ""
    lines.append(f"  %s{n} = hal.tensor.alias {on}%r#{n} : {shaped} to %out{n} : !hal.buffer_view")
    lines.append(f"  %t{n} = hal.tensor.transients %s{n} : {shaped} from %transients : !hal.buffer")
    return lines


def _quote(symbol: str) -> str:
    """A symbol as MLIR spells it: bare when it is a plain identifier, else quoted."""
    plain = symbol.replace("_", "a").replace("$", "a").replace(".", "a")
    if plain.isalnum() and not symbol[0].isdigit():
        return symbol
    return '"' + symbol.replace("\\", "\\\\").replace('"', '\\"') + '"'
