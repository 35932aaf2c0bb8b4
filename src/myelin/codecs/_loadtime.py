"""Codecs with data tiling: the encoded weight decoded once at load into the packed layout.

IREE's data tiling (`--iree-global-opt-data-tiling`) packs a matmul's weight into its kernel's
tile layout; for an fp32 parameter IREE hoists that pack into an initializer, run once at load.
A decode fused into its consumer's dispatch (codecs._rewrite) cannot be data-tiled (IREE 3.13 packs
the decoded weight inside the dispatch and the CPU backend refuses it), so on MiniLM the fused
decode + matmul ran 1.8-3x slower than data-tiled fp32.

So the encode step gives such a contraction two forms, and the compile step keeps one per
variant (`choose_forms`), since one encoded graph serves every variant:

- the fused form (codecs._rewrite: decode inside the consumer's dispatch, no decoded weight in
  memory), kept when the variant does not data-tile;
- the load-time form: the decode of the whole weight in its logical layout, then the graph's
  own layout ops and a clone of the consumer, as the fp32 graph has them with the parameter's
  load replaced by the decode. Every input of the decode is a parameter, so IREE's
  const-expr hoisting moves decode + transpose + pack into one initializer: the stored
  (encoded) bytes are what the .mln holds and the runtime reads, the packed f32 weight exists
  once in memory (as fp32's packed copy does), and each call runs fp32's data-tiled kernel.
  The decode grows the weight (4x for int8), more than IREE's default hoisting limit
  (`--iree-opt-const-expr-max-size-increase-threshold`, 1 MiB) allows, so data-tiled variants
  raise it (myelin.compiler.targets).

The two forms meet in an `arith.select` on a constant marked with LOAD_TIME_ATTRIBUTE; if a
compile ever skipped `choose_forms`, the constant `false` folds to the fused form.

A matvec (one activation row, a decode step) keeps its fused form even with data tiling: its
weight bytes are the work there, which is what a codec saves (codecs._matvec).
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir

from myelin.codecs._contract import Layout
from myelin.codecs._emit import decode_ops
from myelin.codecs._forms import choose_marked_forms, join_forms

# On the arith.select joining the two forms: "scope::key" of the parameter.
LOAD_TIME_ATTRIBUTE = "plex.load_time_decode"
# Consumers that IREE 3.13's data tiling packs (its SetEncoding pass: matmul-like contractions);
# a conv or a generic reduction keeps the fused decode.
DATA_TILED_CONSUMERS = frozenset({"linalg.matmul", "linalg.batch_matmul"})


def wants_load_time_form(chain, matvec: tuple[int, int] | None) -> bool:
    """Whether this contraction use also gets the load-time form."""
    return (
        matvec is None
        and chain.consumer.name in DATA_TILED_CONSUMERS
        and len(chain.consumer.results) == 1
    )


def emit_load_time_form(
    chain, load: ir.Value, layout: Layout, parts: list[ir.Value], what: str, context: ir.Context
) -> None:
    """The load-time form of one use, placed before its consumer, joined to the consumer's
    result by the marked select (the fused form is built afterwards from the same chain).

    The decode produces the parameter's logical tensor (q4 without its split loops, fp16
    without its blocks: at load the
    speed of the decode does not matter and a reshape between decode and pack is one more
    thing for IREE to propagate); the layout ops and the consumer are cloned on top of it."""
    consumer = chain.consumer
    logical = ir.RankedTensorType(load.type)
    plain_layout = replace(layout, split=None, blocked=None)
    identity = list(range(logical.rank))
    placed = decode_ops(plain_layout, parts, logical, identity, parts[0], consumer, what, context)
    old, new = load, placed[-1].results[0]
    for op in chain.ops:
        clone = op.clone(ip=ir.InsertionPoint(consumer))
        for i, v in enumerate(op.operands):
            if v == old:
                clone.operands[i] = new
        old, new = op.results[0], clone.results[0]
    clone = consumer.clone(ip=ir.InsertionPoint(consumer))
    clone.operands[chain.operand] = new
    join_forms(consumer, clone.results[0], LOAD_TIME_ATTRIBUTE, what, context)


def choose_forms(module: ir.Operation, load_time: bool) -> list[str]:
    """Keep one form of every contraction that has two: the load-time form if `load_time`
    (a data-tiled llvm-cpu variant: myelin.codecs.decodes_at_load), else the fused one; erase
    the other. Returns "scope::key" of each parameter that decodes at load (one entry per
    use), in IR order."""
    return choose_marked_forms(module, LOAD_TIME_ATTRIBUTE, load_time)
