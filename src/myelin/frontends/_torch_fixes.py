"""Workarounds for known defects between torch 2.13, iree-turbine 3.9 and IREE 3.13's torch
input, applied to every exported program (each one measured on those versions; see
docs/frontends.md).

1. Undecomposed CompositeImplicitAutograd ops. Since torch 2.6, `run_decompositions(table)` only
   decomposes the CIA ops that are in `table`; turbine's table lacks `aten.__and__.Tensor`,
   `aten.__or__.Tensor` and `aten.diff`, which Hugging Face masking code uses and torch-mlir
   cannot lower. We copy their entries from torch's default table.
2. A silent miscompile: IREE folds "float constant compared with an *integer* Python scalar"
   (`t > 1`) to the wrong boolean. Comparing with the same value as a float scalar is exact and
   folds correctly, so every such comparison is rewritten to a float scalar.
3. Advanced indexing with several index tensors (`x[arange(b), argmax]`, CLIP's pooling): torch-
   mlir 3.13 has no lowering for `aten.index.Tensor` with more than one index tensor. Leading
   index tensors become one flat row index into `x` reshaped to rows, read by `index_select`.
4. Linears over more than two dims. torch-mlir lowers `aten.linear` of a `[batch, seq, k]`
   activation to a weight broadcast along the batch and a `linalg.batch_matmul`: no 2-D matmul
   for the kernel library (or IREE's matmul paths) to see. Such linears are rewritten as the
   product `torch.matmul` itself computes for them: the leading dims folded into rows, one
   `[rows, k] x [k, n]` matmul, the bias added, the dims unfolded (the same sums in the same
   order, so bit-identical on the CPU).
5. Ops IREE cannot lower: the compiler's diagnostic names an MLIR op; we map it back to the FX
   node and the user's source line, and say so in one line.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import torch
from iree.turbine.aot.decompositions import current_aot_decompositions

aten = torch.ops.aten

# CIA ops that turbine leaves in the graph and IREE 3.13 cannot lower.
EXTRA_DECOMPOSITIONS = (
    aten.__and__.Tensor,
    aten.__or__.Tensor,
    aten.__xor__.Tensor,
    aten.diff.default,
)

# Tensor-vs-Python-scalar comparisons that the miscompile (2.) affects.
_SCALAR_COMPARISONS = {
    aten.gt.Scalar,
    aten.ge.Scalar,
    aten.lt.Scalar,
    aten.le.Scalar,
    aten.eq.Scalar,
    aten.ne.Scalar,
}


def decomposition_table() -> dict:
    """Turbine's AOT table plus the CIA decompositions it lacks, and fixes 3 and 4."""
    table = dict(current_aot_decompositions())
    defaults = torch.export.default_decompositions()
    for op in EXTRA_DECOMPOSITIONS:
        if op in defaults:
            table[op] = defaults[op]
    table[aten.index.Tensor] = _leading_index
    table[aten.linear.default] = linear_as_matmul
    return table


def _leading_index(x: torch.Tensor, indices: list[torch.Tensor | None]) -> object:
    """`x[i0, i1, ...]` with index tensors for the first k >= 2 dims as one `index_select` of
    the flattened leading dims (negative indices wrap as in torch); NotImplemented otherwise,
    which keeps the op for torch-mlir's own lowering."""
    k = len(indices)
    if k < 2 or k > x.dim() or any(i is None or i.dtype == torch.bool for i in indices):
        return NotImplemented
    shape = torch.broadcast_shapes(*(i.shape for i in indices))
    flat = None
    for axis, index in enumerate(indices):
        size = x.shape[axis]
        index = torch.where(index < 0, index + size, index).expand(shape)
        flat = index if flat is None else flat * size + index
    rows = x.reshape(-1, *x.shape[k:])
    return rows.index_select(0, flat.reshape(-1)).reshape(*shape, *x.shape[k:])


def linear_as_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """`F.linear` over more than two dims as one 2-D matmul between reshapes (4.); other
    linears are left as they are (`NotImplemented` keeps the op)."""
    if x.dim() <= 2 or weight.dim() != 2:
        return NotImplemented
    rows = aten.view.default(x, [-1, x.shape[-1]])
    out = aten.mm.default(rows, aten.t.default(weight))
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    return aten.view.default(out, [*x.shape[:-1], weight.shape[0]])


def float_scalar_comparisons(program: torch.export.ExportedProgram) -> int:
    """Rewrite `float_tensor <cmp> int_scalar` to compare with a float scalar, in place.

    Exact: torch compares a float tensor with an int scalar in the tensor's float type anyway.
    Returns the number of nodes rewritten.
    """
    count = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in _SCALAR_COMPARISONS:
            continue
        tensor, scalar = node.args[0], node.args[1]
        value = getattr(tensor, "meta", {}).get("val")
        if (
            isinstance(scalar, int)
            and not isinstance(scalar, bool)
            and isinstance(value, torch.Tensor)
            and value.dtype.is_floating_point
        ):
            node.args = (tensor, float(scalar), *node.args[2:])
            count += 1
    if count:
        program.graph_module.recompile()
    return count


# What the torch lowering says when it cannot lower an op (see _torch_lowering._render).
_UNREGISTERED_OP = re.compile(r'torch\.operator"?\(.*?name = "torch\.(?P<op>[\w.]+)"')
_ILLEGAL_OP = re.compile(r"failed to legalize operation '(?:torch\.)?(?P<op>[\w.]+)'")
_ERROR = re.compile(r"error: (?P<msg>.*?) @ (?P<loc>.*)")
_FILE_LOC = re.compile(r'"(?P<file>[^"]+)":(?P<line>\d+):\d+')


def lowering_failure(
    diagnostics: str, programs: list[torch.export.ExportedProgram], folder: Path
) -> str:
    """One line naming the op IREE could not lower and the user's source line that made it."""
    m = _UNREGISTERED_OP.search(diagnostics) or _ILLEGAL_OP.search(diagnostics)
    if m is not None:
        op = m["op"]
        return (
            f"op {op} ({_source_line(op, programs, folder)}) has no lowering in IREE's torch "
            "input; compute it outside the graph or rewrite it with supported ops"
        )
    err = _ERROR.search(diagnostics)
    if err is None:
        first = next((x for x in diagnostics.splitlines() if x.strip()), "unknown error")
        return f"IREE cannot lower the exported graph: {first.strip()}"
    locs = [(f["file"], f["line"]) for f in _FILE_LOC.finditer(err["loc"])]
    inside = [loc for loc in locs if _inside(loc[0], folder)]
    loc = (inside or locs or [None])[0]
    at = f" ({Path(loc[0]).name}:{loc[1]})" if loc else ""
    return f"IREE cannot lower the exported graph{at}: {err['msg'].strip()}"


def _source_line(op: str, programs: list[torch.export.ExportedProgram], folder: Path) -> str:
    """`file.py:LINE` of the first FX node calling `op`, preferring frames inside `folder`."""
    for program in programs:
        for node in program.graph.nodes:
            if node.op != "call_function":
                continue
            target = str(node.target)
            if target != op and target.rsplit(".", 1)[0] != op:
                continue
            frames = _frames(node.meta.get("stack_trace") or "")
            if not frames:
                continue
            inside = [f for f in frames if _inside(f.filename, folder)]
            frame = (inside or frames)[-1]
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return "source line unknown"


def _frames(stack_trace: str) -> list[traceback.FrameSummary]:
    frames = []
    for m in re.finditer(
        r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)', stack_trace
    ):
        frames.append(traceback.FrameSummary(m["file"], int(m["line"]), m["fn"]))
    return frames


def _inside(filename: str, folder: Path) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(folder.resolve())
    except OSError:
        return False
