"""What the kernels step did to every contraction of a graph, and one line that sums it up.

The matmul and attention matchers report the ops they know (`linalg.matmul`,
`iree_linalg_ext.attention`). A graph holds other contractions too (batched matmuls, contractions
written as `linalg.generic`, convolutions): they stay with IREE's codegen, and a user who sees
only the matched ops cannot tell why a build is slow. So after the rewrites every contraction
left in the graph is listed with the reason no kernel took it, and the summary counts matched
ones against all of them, by number and by FLOPs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the summary works on records alone, without the compiler installed
    from iree.compiler import ir

# Named contractions IREE may see that no kernel of the library covers, with the reason given.
_NAMED = {
    "linalg.batch_matmul": "batched matmul: the library's kernels take 2-D matmuls",
    "linalg.batch_matmul_transpose_a": "batched matmul: the library's kernels take 2-D matmuls",
    "linalg.batch_matmul_transpose_b": "batched matmul: the library's kernels take 2-D matmuls",
    "linalg.batch_reduce_matmul": "batch-reduce matmul: no kernel form",
    "linalg.matvec": "matrix-vector product: no kernel form",
    "linalg.vecmat": "vector-matrix product: no kernel form",
    "linalg.dot": "dot product: no kernel form",
}
_ATTENTION = "iree_linalg_ext.attention"
_ATTENTION_REASON = 'attention kernels need kernels = "triton-attention"'
_DIMS = re.compile(r"\(([^()]*)\)\s*->\s*\(([^()]*)\)")


def _loop_sizes(op: ir.Operation) -> list[int | None] | None:
    """The iteration space of a linalg op with explicit indexing maps: each loop's size read
    from an operand dim it indexes directly (None where that dim is dynamic)."""
    from iree.compiler import ir

    from myelin.kernels._rewrite import _dims

    if "indexing_maps" not in op.attributes:
        return None
    maps = ir.ArrayAttr(op.attributes["indexing_maps"])
    sizes: dict[str, int | None] = {}
    loops: list[str] = []
    for operand, attr in zip(op.operands, maps, strict=False):
        found = _DIMS.search(str(attr))
        if found is None or not isinstance(operand.type, ir.RankedTensorType):
            return None
        loops = [d.strip() for d in found.group(1).split(",") if d.strip()]
        results = [r.strip() for r in found.group(2).split(",")]
        for name, size in zip(results, _dims(operand.type), strict=False):
            if name in loops and sizes.get(name) is None:
                sizes[name] = size
    return [sizes.get(name) for name in loops]


def _is_generic_contraction(op: ir.Operation) -> bool:
    """A `linalg.generic` with a reduction loop whose body multiplies and accumulates."""
    if op.name != "linalg.generic":
        return False
    if "reduction" not in str(op.attributes["iterator_types"]):
        return False
    body = [o.name for o in op.regions[0].blocks[0].operations]
    return any(n in ("arith.mulf", "arith.muli") for n in body) and any(
        n in ("arith.addf", "arith.addi") for n in body
    )


def _named_shape(op: ir.Operation) -> tuple[int | None, int | None, int | None, int | None]:
    """(batch, M, N, K) of a named batched or 2-D contraction."""
    from myelin.kernels._rewrite import _dims

    a, b = (_dims(v.type) for v in op.operands[:2])
    out = _dims(op.results[0].type)
    if op.name.startswith("linalg.batch"):
        k = a[1] if op.name.endswith("transpose_a") else a[2]
        return out[0] if len(out) == 3 else a[0], out[-2], out[-1], k
    if op.name == "linalg.matvec":
        return 1, a[0], 1, a[1]
    if op.name == "linalg.vecmat":
        return 1, 1, b[1], a[0]
    return 1, 1, 1, a[0]  # linalg.dot


def unmatched_contractions(module: ir.Operation, library: str) -> list[dict]:
    """Every contraction left with IREE after the kernels step's rewrites that the matchers did
    not already report, as kernel sites (`kernel` None, the reason it stayed)."""
    from iree.compiler import ir

    from myelin.compiler.placement import find_ops
    from myelin.kernels._attention_ir import WHY
    from myelin.kernels._rewrite import _dims, _element, _function_name

    sites = []
    for op in find_ops(
        module,
        lambda o: (
            o.name in _NAMED
            or o.name.startswith("linalg.conv")
            or o.name.startswith("linalg.depthwise_conv")
            or (o.name == _ATTENTION and library != "triton-attention")
            or _is_generic_contraction(o)
        ),
    ):
        dtype = _element(op.operands[0].type)
        out_dtype = _element(op.results[0].type)
        site = {
            "function": _function_name(op),
            "location": str(op.location),
            "op": op.name.removeprefix("linalg.").removeprefix("iree_linalg_ext."),
            "m": None,
            "n": None,
            "k": None,
            "dtype": dtype,
            "out_dtype": out_dtype,
            "kernel": None,
        }
        if op.name in _NAMED:
            batch, m, n, k = _named_shape(op)
            reason = _NAMED[op.name]
            if WHY in op.attributes:  # a product of attention written by hand: why it stays
                reason = ir.StringAttr(op.attributes[WHY]).value
                del op.attributes[WHY]
            site.update(batch=batch, m=m, n=n, k=k, reason=reason)
            site["flops"] = _product(2, batch, m, n, k)
        elif op.name == _ATTENTION:
            q, key = (_dims(v.type) for v in op.operands[:2])
            site.update(m=q[-2], n=q[-1], k=key[-2], reason=_ATTENTION_REASON)
            site["flops"] = _product(4, *q[:-2], q[-2], key[-2], q[-1])
        elif "conv" in op.name:
            site["reason"] = _conv_reason(op)
            site["flops"] = _conv_flops(op)
        else:
            sizes = _loop_sizes(op)
            site["reason"] = "contraction as linalg.generic: no kernel form"
            site["flops"] = _product(2, *sizes) if sizes else None
        sites.append(site)
    return sites


def _conv_reason(op: ir.Operation) -> str:
    """Why a convolution stays IREE's: what the im2col rewrite said (myelin.kernels._conv), or
    the kind of convolution it does not take."""
    from iree.compiler import ir

    from myelin.kernels._conv import CONV_2D, WHY

    if WHY in op.attributes:
        return ir.StringAttr(op.attributes[WHY]).value
    if op.name.startswith("linalg.depthwise"):
        return "depthwise convolution: no kernel form"
    if "_ng" in op.name:
        return "grouped convolution: no kernel form"
    if op.name != CONV_2D:
        return (
            f"convolution: no kernel form (only {CONV_2D.removeprefix('linalg.')} becomes a matmul)"
        )
    return "convolution: no kernel form"


def is_conv(site: dict) -> bool:
    return "conv" in str(site.get("op", ""))


def risky_convolutions(sites: Iterable[dict]) -> list[dict]:
    """The f16 or bf16 convolutions no kernel took: IREE 3.13's own CUDA codegen computes them,
    which gave a wrong answer for ResNet-50 in f16 on an H100 (docs/kernels.md)."""
    return [
        s for s in sites if is_conv(s) and not s.get("kernel") and s.get("dtype") in ("f16", "bf16")
    ]


def _conv_flops(op: ir.Operation) -> int | None:
    """2 x output elements x the products each one sums (the filter's input channels times its
    window), for the named convolutions whose filter layout says where the output channels are
    (`..._fchw`, `..._fcw`: first; `..._hwcf`, `..._wcf`: last); None otherwise or when dynamic."""
    from myelin.kernels._rewrite import _dims

    if len(op.operands) < 2:
        return None
    out, filt = _dims(op.results[0].type), _dims(op.operands[1].type)
    if any(d is None for d in (*out, *filt)):
        return None
    layout = op.name.rsplit("_", 1)[-1]
    if layout.startswith("f") and not op.name.startswith("linalg.depthwise"):
        per_output = math.prod(filt[1:])
    elif layout.endswith("f") and not op.name.startswith("linalg.depthwise"):
        per_output = math.prod(filt[:-1])
    else:
        return None
    return 2 * math.prod(out) * per_output  # type: ignore[arg-type]


def _product(*factors: int | None) -> int | None:
    return None if any(f is None for f in factors) else math.prod(factors)  # type: ignore[arg-type]


def _count(value: object) -> int | None:
    """A size or FLOP count as recorded: a non-negative int, else unknown (None). The records
    come from a file, so anything else (a string, a bool) counts as unknown, never as a size."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def site_flops(site: dict) -> int | None:
    """A site's FLOPs at its static sizes (None where a size is dynamic or unknown)."""
    if "flops" in site:
        return _count(site["flops"])
    op = str(site.get("op", ""))
    if op == "concat":
        return 0
    m, n, k = (_count(site.get(d)) for d in ("m", "n", "k"))
    if op.startswith("attention"):  # QK^T and PV: 2 x 2 x m x n x k per batch-head
        return _product(4, _count(site.get("batch", 1)), m, n, k)
    return _product(2, m, n, k)


def is_contraction(site: dict) -> bool:
    return site.get("op") != "concat"


def coverage_line(sites: Sequence[dict], arch: str) -> str:
    """`kernels: 14 of 16 contractions (97% of FLOPs) on sm_90a kernels`; FLOPs are counted
    over the contractions whose sizes are static, and the line says how many were not."""
    contractions = [s for s in sites if is_contraction(s)]
    matched = [s for s in contractions if s.get("kernel")]
    line = f"kernels: {len(matched)} of {len(contractions)} contractions"
    flops = [(site_flops(s), bool(s.get("kernel"))) for s in contractions]
    known = [(f, hit) for f, hit in flops if f is not None]
    total = sum(f for f, _ in known)
    if total:
        share = 100.0 * sum(f for f, hit in known if hit) / total
        line += f" ({share:.0f}% of FLOPs"
        unknown = len(flops) - len(known)
        line += f"; {unknown} with dynamic sizes not counted)" if unknown else ")"
    return f"{line} on {arch} kernels"


def left_to_codegen(sites: Iterable[dict]) -> list[str]:
    """One phrase per contraction no kernel took: op, shape and why."""
    phrases = []
    for s in sites:
        if not is_contraction(s) or s.get("kernel"):
            continue
        shape = "x".join("?" if s.get(d) is None else str(s[d]) for d in ("m", "n", "k"))
        phrases.append(
            f"{s.get('op', '?')} {shape} in {s.get('function', '?')} ({s.get('reason', '?')})"
        )
    return phrases
