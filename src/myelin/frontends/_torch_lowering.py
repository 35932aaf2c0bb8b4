"""torch dialect -> linalg on builtin tensors, in process, with IREE's own passes.

IREE's `--iree-input-type=torch` pipeline (`torch-to-iree`) ends with torch-iree-func-conversion,
which wraps every function in an async ABI *without* the `iree.abi.declaration` reflection that
PLeX reads signatures from (a compiled torch graph would show no entrypoints). So we run the same
pipeline minus that step, ending with torch-mlir's plain backend type conversion instead; the
result is linalg on builtin tensors (input type "none"), and IREE's ABI phase later gives it the
standard reflection. The pipeline is derived from IREE's printed `torch-to-iree`, so it follows
the pinned IREE rather than a copy of its pass list.
"""

from __future__ import annotations

import re
from functools import cache

from iree.compiler import ir
from iree.compiler.passmanager import PassManager

from myelin.errors import CompileError

# What the lowered module needs from IREE's input pipeline: nothing but the standard one.
LOWERED_INPUT_TYPE = "none"


@cache
def torch_to_linalg_pipeline() -> str:
    """IREE's `torch-to-iree`, with its ABI func conversion swapped for the plain one."""
    with ir.Context():
        text = str(PassManager.parse("builtin.module(torch-to-iree)"))
    text, swapped = re.subn(
        r"torch-iree-func-conversion(\{[^{}]*\})?", "torch-func-backend-type-conversion", text
    )
    if swapped != 1:
        raise CompileError(f"unexpected torch-to-iree pipeline in this IREE: {text}")
    # After the swap the functions stay func.func (IREE's conversion makes them util.func).
    return text.replace("util.func(", "func.func(")


def lower_torch(module: ir.Operation) -> None:
    """Lower a torch-dialect module in place; raises CompileError carrying the diagnostics."""
    with module.context:
        pm = PassManager.parse(torch_to_linalg_pipeline())
        try:
            pm.run(module)
        except ir.MLIRError as e:
            raise CompileError(_render(e)) from None


def _render(e: ir.MLIRError) -> str:
    """One `error: <message> @ <location>` line per diagnostic (notes follow as `note:`)."""
    lines = []
    for d in e.error_diagnostics:
        lines.append(f"error: {_first_line(d.message)} @ {d.location}")
        lines.extend(f"note: {_first_line(n.message)} @ {n.location}" for n in d.notes)
    return "\n".join(lines) or str(e)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
