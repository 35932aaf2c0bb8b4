"""Dispatch regions: a decode and its contraction wrapped in one `flow.dispatch.region` with
its own workgroup count, so IREE's dispatch formation keeps them in one dispatch on every target
(IREE 3.13 blocks matmul-producer fusion on CPU and would otherwise hoist small decodes)."""

from __future__ import annotations

from iree.compiler import ir

from myelin.codecs._emit import remap
from myelin.codecs._uses import dps_inputs


def _init_chain(init: ir.Value) -> tuple[list[ir.Operation], list[ir.Value]] | None:
    """The ops that build a consumer's init (`tensor.empty`, then ops such as `linalg.fill`
    or a bias broadcast writing into it) and the empty's dynamic sizes; None if the init is
    built otherwise (then its sizes cannot be tied to the dispatch's workload)."""
    chain: list[ir.Operation] = []
    value = init
    while True:
        owner = value.owner
        if isinstance(owner, ir.Block):
            return None
        op = owner.operation if hasattr(owner, "operation") else owner
        chain.append(op)
        if op.name == "tensor.empty":
            return list(reversed(chain)), list(op.operands)
        if not op.name.startswith("linalg.") or len(op.results) != 1:
            return None
        n_inputs = dps_inputs(op)
        outs = list(op.operands)[n_inputs:]
        if len(outs) != 1:
            return None
        value = outs[0]


def wrap_in_dispatch_region(ops: list[ir.Operation], context: ir.Context) -> None:
    """Put `ops` (the decode, then its consumer) into one flow.dispatch.region, so IREE's
    dispatch formation keeps them in one dispatch on every target.

    The region gets its own workgroup count (IREE's default: from the slice of its workload,
    the consumer's dynamic sizes) and its init is rebuilt inside from those sizes. A region
    with a workgroup count is one IREE's data tiling leaves alone: without it, data tiling
    (`--iree-global-opt-data-tiling`) packs the decoded weight inside this dispatch and the
    CPU backend refuses the result ("operations with large vector sizes"). A data-tiled
    variant keeps a matmul's load-time form instead (myelin.codecs._loadtime); what keeps this
    form there (a matvec, a conv) runs as fused decode + contraction, not data-tiled."""
    consumer = ops[-1]
    parent = consumer.parent
    if parent is not None and parent.operation.name == "flow.dispatch.region":
        return
    results = list(consumer.results)
    inits = list(consumer.operands)[len(consumer.operands) - len(results) :]
    chain = _init_chain(inits[0]) if len(inits) == 1 else None
    index = ir.IndexType.get(context)
    with ir.InsertionPoint(consumer), ir.Location.unknown(context):
        dims: list[ir.Value] = []
        if chain is not None:
            dims = chain[1]  # the init's dynamic sizes, in order: the result's dynamic dims
        else:
            for result, init in zip(results, inits, strict=True):
                t = ir.RankedTensorType(result.type)
                for d in range(t.rank):
                    if t.is_dynamic_dim(d):
                        c = ir.Operation.create(
                            "arith.constant",
                            results=[index],
                            attributes={"value": ir.IntegerAttr.get(index, d)},
                        )
                        dim = ir.Operation.create(
                            "tensor.dim", results=[index], operands=[init, c.results[0]]
                        )
                        dims.append(dim.results[0])
        workload = dims if chain is not None else []
        region = ir.Operation.create(
            "flow.dispatch.region",
            results=[r.type for r in results],
            operands=[*dims, *workload],
            attributes={
                "operandSegmentSizes": ir.DenseI32ArrayAttr.get([len(dims), len(workload)])
            },
            regions=2,  # the body, and the workgroup count
        )
    for old, new in zip(results, region.results, strict=True):
        old.replace_all_uses_with(new)
    block = region.regions[0].blocks.append()
    with ir.InsertionPoint(block), ir.Location.unknown(context):
        ret = ir.Operation.create("flow.return", operands=results)
    if chain is not None:
        _count_from_workload(region, block, ret, chain[0], workload, consumer, context)
    for op in ops:
        op.move_before(ret)


def _count_from_workload(
    region: ir.Operation,
    block: ir.Block,
    ret: ir.Operation,
    init_ops: list[ir.Operation],
    workload: list[ir.Value],
    consumer: ir.Operation,
    context: ir.Context,
) -> None:
    """IREE's default workgroup count, spelled out: the count region computes it from the
    workload, and inside the body each workload value is read through its ordinal (codegen
    ties the tile loops back to the workload that way); the init is rebuilt inside from them."""
    index = ir.IndexType.get(context)
    with ir.InsertionPoint(ret), ir.Location.unknown(context):
        ordinals = [
            ir.Operation.create(
                "iree_tensor_ext.dispatch.workload.ordinal",
                results=[index],
                operands=[w],
                attributes={"ordinal": ir.IntegerAttr.get(index, i)},
            ).results[0]
            for i, w in enumerate(workload)
        ]
    mapping = list(zip(workload, ordinals, strict=True))
    value = None
    for op in init_ops:
        clone = op.clone(ip=ir.InsertionPoint(ret))
        remap([clone], mapping)
        if value is not None:  # the previous op's result is this one's init
            clone.operands[len(clone.operands) - 1] = value
        value = clone.results[0]
    consumer.operands[len(consumer.operands) - 1] = value
    with ir.Location.unknown(context):
        count = region.regions[1].blocks.append(*([index] * len(workload)))
    with ir.InsertionPoint(count), ir.Location.unknown(context):
        x, y, z = ir.Operation.create(
            "iree_tensor_ext.dispatch.workgroup_count_from_slice",
            results=[index, index, index],
            operands=list(count.arguments),
        ).results
        ir.Operation.create("flow.return", operands=[x, y, z])
