"""Two forms of one contraction, carried in the encoded graph until a later step chooses.

One encoded graph serves every variant, so where the best decode depends on the variant (the
load-time form of data-tiled CPU variants, `_loadtime`; the q4 kernel form of Hopper kernel
builds, `_q4_gpu`) the encode step emits both, joined by an `arith.select` on a constant `false`
marked with the form's attribute (`join_forms`); the compile or kernels step keeps one
(`choose_marked_forms`). A compile that skipped the choice folds the constant to the fused
form."""

from __future__ import annotations

from iree.compiler import ir

from myelin.compiler.placement import find_ops

# Ops the cleanup after a choice may erase when nothing reads their results.
_PURE_PREFIXES = ("linalg.", "tensor.", "arith.", "flow.dispatch.region", "util.global.load")


def join_forms(
    consumer: ir.Operation, marked: ir.Value, attribute: str, what: str, context: ir.Context
) -> None:
    """Carry two forms of `consumer`'s result until a later step chooses
    (`choose_marked_forms`): every use of the fused result now reads an `arith.select` of a
    false flag between `marked` (the other form's result) and the fused one, marked with
    `attribute` = `what`."""
    fused = consumer.results[0]
    i1 = ir.IntegerType.get_signless(1, context)
    with ir.InsertionPoint(consumer), ir.Location.unknown(context):
        flag = ir.Operation.create(
            "arith.constant", results=[i1], attributes={"value": ir.IntegerAttr.get(i1, 0)}
        )
        select = ir.Operation.create(
            "arith.select",
            results=[fused.type],
            operands=[flag.results[0], marked, fused],
            attributes={attribute: ir.StringAttr.get(what, context)},
        )
    select.move_after(consumer)
    fused.replace_all_uses_with(select.results[0])
    select.operands[2] = fused


def choose_marked_forms(module: ir.Operation, attribute: str, keep_marked: bool) -> list[str]:
    """Resolve every `arith.select` marked with `attribute` (the codec's way of carrying two
    forms of one contraction until a later step chooses): keep its first operand (the marked
    form) if `keep_marked`, else its second (the fused decode), and erase the select, its
    flag and whatever only the other form used. Returns the marks' values ("scope::key") of
    the kept marked forms, in IR order (none when `keep_marked` is false)."""
    selects = find_ops(module, lambda op: op.name == "arith.select" and attribute in op.attributes)
    kept_marked = []
    blocks = []
    for select in selects:
        if keep_marked:
            kept_marked.append(ir.StringAttr(select.attributes[attribute]).value)
        kept = select.operands[1] if keep_marked else select.operands[2]
        flag = select.operands[0].owner
        select.results[0].replace_all_uses_with(kept)
        block = select.parent.regions[0].blocks[0] if select.parent is not None else None
        if block is not None and all(b != block for b in blocks):
            blocks.append(block)
        select.erase()
        flag_op = flag.operation if hasattr(flag, "operation") else flag
        if not list(flag_op.results[0].uses):
            flag_op.erase()
    for block in blocks:
        _erase_unused(block)
    return kept_marked


def _erase_unused(block: ir.Block) -> None:
    """Erase the pure ops of `block` whose results nothing reads (the form not kept), last
    first, until none is left."""
    while True:
        dead = [
            op
            for op in block.operations
            if len(op.results) > 0
            and op.name.startswith(_PURE_PREFIXES)
            and not any(list(r.uses) for r in op.results)
        ]
        if not dead:
            return
        for op in reversed(dead):
            op.erase()
