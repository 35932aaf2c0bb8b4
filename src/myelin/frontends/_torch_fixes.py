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
5. `addmm` in f16/bf16 (GPT-2's Conv1D: `addmm(bias, x, w)` with `w` stored [k, n]). torch's
   decomposition computes it in f32 (operands converted), so the graph holds an f32 matmul that
   no f16 kernel takes. It is exported as what it means: one matmul in the operands' dtype (f32
   accumulation inside, as torch's own kernels do), then the bias added.
6. Attention masks that do not depend on any input. Hugging Face's masking utilities materialize
   the mask under torch.export (a boolean `[b, 1, q, k]` from index comparisons) where eager mode
   would pass none: an all-true mask (BERT, ViT without a padding mask) or torch's causal mask
   (decoders without a padding mask). Such a mask is evaluated at export, and
   `scaled_dot_product_attention` gets no mask, or `is_causal=True`, instead: the same function,
   in the form the attention kernels (and IREE's own attention) know.
7. Attention written by hand (GPT-2's and BERT's "eager" attention, Llama's with `repeat_kv`):
   `softmax(q @ k^T * scale + mask) @ v` through `matmul`, a scalar `mul`/`div`, an additive
   `add` and `softmax` (upcast to f32 and back, or not). torch-mlir lowers it to two batched
   matmuls around a decomposed softmax, which no attention kernel (and no IREE attention
   codegen) sees. It is exported as `scaled_dot_product_attention(q, k, v, mask, scale=scale)`:
   the same function, so 6. then drops or makes causal a mask no input reaches, and the
   attention kernels take it.
8. Ops IREE cannot lower: the compiler's diagnostic names an MLIR op; we map it back to the FX
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
    table[aten.addmm.default] = addmm_as_matmul
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
    # reshape, not view: a transposed activation (Segformer's) has no view as rows; torch.matmul
    # copies it then too
    rows = x.reshape(-1, x.shape[-1])
    out = aten.mm.default(rows, aten.t.default(weight))
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    return aten.view.default(out, [*x.shape[:-1], weight.shape[0]])


def addmm_as_matmul(
    bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1, alpha: float = 1
):
    """`beta * bias + alpha * (mat1 @ mat2)` with the product in the operands' dtype (5.);
    integer and mixed-dtype addmms keep torch's own decomposition."""
    if not mat1.dtype.is_floating_point or mat1.dtype != mat2.dtype:
        return NotImplemented
    out = aten.mm.default(mat1, mat2)
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return out
    return aten.add.Tensor(out, bias if beta == 1 else aten.mul.Tensor(bias, beta))


_SDPA = aten.scaled_dot_product_attention.default
# Ops between the attention's parts that change nothing it computes (eval-mode dropout is gone
# from the exported graph; a copy or an alias remains).
_PASS_THROUGH = (aten.clone.default, aten.alias.default, aten.detach.default)
_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_ASSERT = aten._assert_tensor_metadata.default
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one real user of `node` (metadata asserts aside), or None."""
    users = [u for u in node.users if u.target is not _ASSERT]
    return users[0] if len(users) == 1 else None


def _through(node: object, targets: tuple) -> object:
    """`node`'s input as long as it is a one-user call of one of `targets`."""
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target in targets
        and _only_user(node) is not None
    ):
        node = node.args[0]
    return node


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _hand_written_attention(pv: torch.fx.Node) -> tuple | None:
    """(q, k, v, mask, scale) when `pv` is `softmax(q @ k^T * scale + mask) @ v` (7.), else
    None. Every op between the two matmuls must have no other user: the scores and the
    probabilities are never seen elsewhere."""
    p, v = pv.args[0], pv.args[1]
    p = _through(p, _PASS_THROUGH + _CASTS)
    if not (isinstance(p, torch.fx.Node) and p.target in _SOFTMAX and _only_user(p)):
        return None
    rank = _val(p).dim() if _val(p) is not None else 0
    if p.args[1] not in (-1, rank - 1) or (p.target is aten._softmax.default and p.args[2]):
        return None
    s = _through(p.args[0], _CASTS)
    mask = None
    if isinstance(s, torch.fx.Node) and s.target is aten.add.Tensor and _only_user(s):
        scores, mask = s.args
        if not isinstance(mask, torch.fx.Node):
            return None
        s = scores
    scale = 1.0
    if (
        isinstance(s, torch.fx.Node)
        and s.target in (aten.mul.Tensor, aten.div.Tensor)
        and isinstance(s.args[1], float | int)
        and not isinstance(s.args[1], bool)
        and _only_user(s)
    ):
        scale = float(s.args[1]) if s.target is aten.mul.Tensor else 1.0 / float(s.args[1])
        s = s.args[0]
    if not (isinstance(s, torch.fx.Node) and s.target is aten.matmul.default and _only_user(s)):
        return None
    q, kt = s.args
    if not (isinstance(kt, torch.fx.Node) and kt.target is aten.transpose.int):
        return None
    k = kt.args[0]
    values = [_val(x) for x in (q, k, v)]
    if any(x is None for x in values) or len({x.dim() for x in values}) != 1:
        return None
    dims = {d % values[1].dim() for d in kt.args[1:]}
    if values[0].dim() < 3 or dims != {values[1].dim() - 1, values[1].dim() - 2}:
        return None
    dtypes = {x.dtype for x in values}
    if len(dtypes) != 1 or not values[0].dtype.is_floating_point:
        return None
    # by name: a dynamic dim is a SymInt, which neither hashes nor compares without a guard
    if len({tuple(str(d) for d in x.shape[:-2]) for x in values}) != 1:
        return None  # K, V broadcast over Q's heads: SDPA wants them expanded
    if mask is not None and (_val(mask) is None or _val(mask).dtype != values[0].dtype):
        return None  # SDPA takes a float mask only in the query's dtype
    if mask is not None and _val(mask).dim() != values[0].dim():
        # a mask of fewer dims (a decode step's [max_len] over its cache slots): IREE's torch
        # input crashes (SIGSEGV) on SDPA with it; Hugging Face's masks have the scores' rank
        return None
    return q, k, v, mask, scale


def _dead_inputs(node: torch.fx.Node) -> set[torch.fx.Node]:
    """`node` and what only it (or metadata asserts) uses, transitively: a replaced chain."""
    dead: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in dead or n.op != "call_function":
            continue
        if any(u not in dead and u.target is not _ASSERT for u in n.users):
            continue
        dead.add(n)
        stack.extend(n.all_input_nodes)
    return dead


def eager_attention_as_sdpa(program: torch.export.ExportedProgram) -> int:
    """Rewrite hand-written attention to `scaled_dot_product_attention` (7.), in place;
    returns the number rewritten. Run before `constant_attention_masks`."""
    graph = program.graph
    count = 0
    dead: set[torch.fx.Node] = set()
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.matmul.default:
            continue
        found = _hand_written_attention(node)
        if found is None:
            continue
        q, k, v, mask, scale = found
        with graph.inserting_before(node):
            sdpa = graph.call_function(_SDPA, (q, k, v, mask, 0.0, False), {"scale": scale})
        sdpa.meta = dict(node.meta)
        node.replace_all_uses_with(sdpa)
        # a program output is named in the signature too: it must name the new node
        for spec in program.graph_signature.output_specs:
            if getattr(spec.arg, "name", None) == node.name:
                spec.arg.name = sdpa.name
        dead |= _dead_inputs(node)
        count += 1
    if count:
        # the scores' metadata asserts would keep the replaced softmax alive
        for node in list(graph.nodes):
            if node.target is _ASSERT and all(a in dead for a in node.all_input_nodes):
                graph.erase_node(node)
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return count


def constant_attention_masks(program: torch.export.ExportedProgram) -> int:
    """Drop the masks of `scaled_dot_product_attention` calls that no input reaches (6.): an
    all-keep mask goes, torch's causal mask becomes `is_causal=True`; any other stays. Returns
    the number of calls rewritten."""
    graph = program.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        if not isinstance(mask, torch.fx.Node) or (args[5] if len(args) > 5 else False):
            continue
        if kwargs.get("is_causal", False):
            continue
        value = _evaluate(mask)
        if value is None:
            continue
        query, key = node.args[0].meta["val"], node.args[1].meta["val"]
        keep = value if value.dtype == torch.bool else value == 0
        if value.dtype != torch.bool and not bool(((value == 0) | _hides(value)).all()):
            continue  # an additive mask with other values changes the scores
        q_len, k_len = query.shape[-2], key.shape[-2]
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril()
        if bool(keep.all()):
            is_causal = False
        elif q_len == k_len and bool((keep == causal).all()):
            is_causal = True
        else:
            continue
        if len(args) > 3:
            args[3] = None
        kwargs.pop("attn_mask", None)
        if is_causal and len(args) > 5:
            args[5] = True
        elif is_causal:
            kwargs["is_causal"] = True
        node.args, node.kwargs = tuple(args), kwargs
        count += 1
    if count:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return count


def _hides(mask: torch.Tensor) -> torch.Tensor:
    """Where an additive mask hides a key: -inf, or the dtype's lowest finite value, which
    Hugging Face's eager masks use; either gives the key a zero weight after the softmax in a
    row that keeps any key (the only rows a causal or all-keep mask has)."""
    return mask <= torch.finfo(mask.dtype).min


# Evaluating a mask: its producers must be calls only (no placeholder: neither an input nor a
# weight), and small (HF's masks are [b, 1, q, k] booleans).
_MAX_MASK_NODES = 400
_MAX_MASK_ELEMENTS = 1 << 26


def _evaluate(node: torch.fx.Node) -> torch.Tensor | None:
    """The concrete value of `node` when it depends on no placeholder, else None."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op != "call_function" or len(seen) > _MAX_MASK_NODES:
            return None
        seen.add(n)
        stack.extend(n.all_input_nodes)
    order = [n for n in node.graph.nodes if n in seen]
    values: dict[torch.fx.Node, object] = {}
    try:
        for n in order:
            args = torch.fx.node.map_arg(n.args, values.__getitem__)
            kwargs = torch.fx.node.map_arg(n.kwargs, values.__getitem__)
            values[n] = n.target(*args, **kwargs)
    except Exception:  # an op that needs more than its arguments: keep the mask
        return None
    value = values[node]
    if not isinstance(value, torch.Tensor) or value.numel() > _MAX_MASK_ELEMENTS:
        return None
    return value


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
