"""Small reads of the MLIR Python API the kernel passes share: the API hands back an op or its
`OpView` depending on how the op was reached, and these always give the `ir.Operation`."""

from __future__ import annotations

from iree.compiler import ir


def owner_op(value: ir.Value) -> ir.Operation | None:
    """The op that made `value` (None for a block argument)."""
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    return owner if isinstance(owner, ir.Operation) else None


def sole_user(value: ir.Value) -> ir.Operation | None:
    """The op that is `value`'s one use, or None when it has none or several."""
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner
    return getattr(user, "operation", user)
