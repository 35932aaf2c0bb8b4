"""How a hand-written executable that calls an external C kernel (the backend ops, q4's AVX2
matvec) splits its work over IREE's workgroups: IREE gives each workgroup its id and the count
(the export's `workgroups` region chose it); the workgroup takes a contiguous share of the units
(rows, heads, blocks of outputs) and passes `%first` and `%count` to the kernel. One text for
every such executable, so the split is written (and fixed) once."""

from __future__ import annotations

_LINES = (
    "%wid = stream.dispatch.workgroup.id[0] : index",
    "%wcount = stream.dispatch.workgroup.count[0] : index",
    "%per = arith.ceildivui {units}, %wcount : index",
    "%start = arith.muli %wid, %per : index",
    "%first = arith.minui %start, {units} : index",
    "%left = arith.subi {units}, %first : index",
    "%count = arith.minui %per, %left : index",
)


def workgroup_share(units: str, indent: str = "      ") -> str:
    """The MLIR lines defining `%first` and `%count`, this workgroup's share of the index value
    `units`, for a template that places them at `indent` (the first line takes the template's
    own indentation)."""
    return "\n".join(indent + line.format(units=units) for line in _LINES).lstrip()
