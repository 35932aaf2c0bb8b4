"""Weight layout as a tuning knob: store a 2-D parameter N x K or K x N, whichever its
contraction reads faster, without touching the model source.

`K` is the axis the consumer contracts, `N` the other one. "nk" stores K contiguous (torch's
Linear weight, `[out, in]`), "kn" stores N contiguous. On the H200 the same 1x8192 by
28672x8192 GEMV ran 8.8x faster stored N x K than K x N; on a CPU the preferred order depends on
the tiles.

The rewrite works on IR at IREE's `input` phase, through the compiler's Python bindings (the
codec rewrite's route): the parameter's `util.global` takes the stored shape, and every
consumer reads the stored tensor directly with the permutation folded into its indexing map
(the `linalg.transpose`/copy ops between the load and the consumer, if any, are removed). No
transposed copy of the weight exists at run time, so numerics are identical: every product and
every sum is the same, in the same order per output. A parameter is left as it is, with the
reason, when a use is not a contraction whose maps can be rewritten (`linalg.matmul`,
`linalg.batch_matmul`, `linalg.generic`), or when its uses contract different axes.

The build transposes the data at encode time (`plex.builder.steps.run_encode`), and the `.mln`
records the stored order (`parameters[].order`, `storage`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from myelin.errors import CompileError

# the stored layouts of a 2-D weight, named by the consumer's view: N (kept) x K (contracted)
LAYOUTS = ("nk", "kn")
# consumers whose indexing maps accept a permuted operand (named ops take `indexing_maps`)
_REWRITABLE = ("linalg.matmul", "linalg.batch_matmul", "linalg.generic")
_SESSION_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)


def check_layout(text: str) -> str:
    """`text` if it names a layout, else ValueError naming the accepted ones (manifest checks)."""
    if text not in LAYOUTS:
        raise ValueError(
            f"unknown weight layout {text!r}; accepted: 'nk' (the contracted axis contiguous, "
            "torch's [out, in]) or 'kn' (the kept axis contiguous)"
        )
    return text


@dataclass(frozen=True)
class LayoutRequest:
    """One parameter to store in `layout`: its IR global and logical shape."""

    global_name: str
    scope: str
    key: str
    shape: tuple[int, ...]
    layout: str


@dataclass
class LayoutResult:
    """What the rewrite did with one request: the stored axis order (`order[i]` is the logical
    axis stored as axis i; () when left as it is), and why."""

    scope: str
    key: str
    layout: str
    order: tuple[int, ...] = ()
    reason: str = ""
    uses: list[str] = field(default_factory=list)

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[a] for a in self.order) if self.order else tuple(shape)

    def to_json(self) -> dict:
        return {
            "scope": self.scope,
            "key": self.key,
            "layout": self.layout,
            "order": list(self.order),
            "reason": self.reason,
            "uses": list(self.uses),
        }


def apply_layouts(
    module_bytecode: bytes, requests: list[LayoutRequest], *, what: str = "graph"
) -> tuple[bytes, list[LayoutResult]]:
    """Rewrite the graph so each requested parameter is read in its stored layout. Returns the
    new IR and one result per request (a result with `order == ()` changed nothing)."""
    from myelin.compiler.session import CompilerSession

    results = []
    with CompilerSession(_SESSION_FLAGS) as session:
        module = session.parse(module_bytecode, what=what)
        with session.context:
            for request in requests:
                results.append(_apply_one(module, request, session.context))
            if not module.verify():
                raise CompileError(f"{what}: the re-laid-out graph does not verify (internal)")
            buffer = io.BytesIO()
            module.write_bytecode(buffer)
    return buffer.getvalue(), results


def _apply_one(module, request: LayoutRequest, context) -> LayoutResult:
    from iree.compiler import ir

    from myelin.codecs import classify_use, follow_use, module_globals, symbol_users

    result = LayoutResult(request.scope, request.key, request.layout)
    if len(request.shape) != 2:
        result.reason = f"rank {len(request.shape)}; only 2-D weights have an N x K layout"
        return result
    old = module_globals(module).get(request.global_name)
    users = symbol_users(module).get(request.global_name, [])
    if old is None or not users:
        result.reason = "the graph does not read it"
        return result
    if any(op.name != "util.global.load" for op in users):
        result.reason = "the graph uses it through more than loads"
        return result
    chains = []
    for load in users:
        for use in list(load.results[0].uses):
            chain = follow_use(load.results[0], use.owner, use.operand_number, 2)
            found = classify_use(chain)
            result.uses.append(f"{found.kind} {found.consumer}")
            if found.kind != "contraction" or chain.consumer.name not in _REWRITABLE:
                result.reason = f"a use is {found.kind} {found.consumer}, not a contraction"
                return result
            if ir.RankedTensorType(chain.value.type).rank != 2:
                result.reason = f"{found.consumer} reads it broadcast to another rank"
                return result
            if found.reduce_axes is None or len(found.reduce_axes) != 1:
                result.reason = f"{found.consumer} contracts no single axis of it"
                return result
            chains.append((load, chain, found.reduce_axes[0]))
    axes = {k for _, _, k in chains}
    if len(axes) != 1:
        result.reason = "its uses contract different axes"
        return result
    [k] = axes
    n = 1 - k
    order = (n, k) if request.layout == "nk" else (k, n)
    if order == (0, 1):
        result.reason = f"already stored {request.layout}"
        return result
    stored = tuple(request.shape[a] for a in order)
    old_type = ir.RankedTensorType(ir.TypeAttr(old.attributes["type"]).value)
    stored_type = ir.RankedTensorType.get(
        list(stored), old_type.element_type, loc=ir.Location.unknown(context)
    )
    old.attributes["type"] = ir.TypeAttr.get(stored_type)
    old.attributes["initial_value"] = ir.Attribute.parse(
        f'#flow.parameter.named<"{request.scope}"::"{request.key}"> : {stored_type}', context
    )
    for load, chain, _ in chains:
        _rewrite_consumer(chain, order, stored_type, load)
    for load in users:
        if not list(load.results[0].uses):
            load.erase()
    result.order = order
    result.reason = f"stored {request.layout} (axes in order {list(order)})"
    return result


def _rewrite_consumer(chain, order: tuple[int, ...], stored_type, load) -> None:
    """The consumer reads a fresh load of the stored tensor, its operand map permuted: stored
    axis i is logical axis order[i], which the consumer's operand had at dim src[order[i]]."""
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    consumer = chain.consumer
    maps = [ir.AffineMapAttr(m).value for m in linalg.get_indexing_maps(consumer.opview)]
    operand_map = maps[chain.operand]
    results = [operand_map.results[chain.src[order[i]]] for i in range(len(order))]
    maps[chain.operand] = ir.AffineMap.get(operand_map.n_dims, operand_map.n_symbols, results)
    with ir.InsertionPoint(consumer), consumer.location:
        fresh = ir.Operation.create(
            "util.global.load",
            results=[stored_type],
            attributes={
                "global": load.attributes["global"],
                "is_immutable": ir.UnitAttr.get(),
            },
        )
    consumer.operands[chain.operand] = fresh.results[0]
    consumer.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
    for op in reversed(chain.ops):
        op.erase()
