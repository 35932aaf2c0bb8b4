"""Codecs on the imported (input-phase) IR, through the compiler's Python bindings.

For an encoded parameter, its `util.global` is replaced by one global per stored part, and every
use of a `util.global.load` of it gets its own decode, emitted right next to the consumer:

- the use is followed through pure layout ops (linalg.transpose, linalg.broadcast, copy-only
  linalg.generic, each with one use) to the op that really consumes the weight; the decode
  produces that op's operand directly, with the layout folded into its indexing maps, so no
  transposed or broadcast copy of the weight exists either;
- a contraction consumer (matmul, batch_matmul, conv, a linalg.generic with reductions) gets the
  decode as a bit-extend `linalg.generic` placed before it, and the two are wrapped in one
  `flow.dispatch.region`: IREE 3.13 blocks producer fusion into matmuls on CPU
  (`--iree-dispatch-creation-block-matmul-producer-fusion`, a process-global flag the compiler
  C API cannot set per session), and would otherwise hoist small decodes into initializers;
- a `tensor.extract` of the weight (an embedding gather inside a linalg.generic body) becomes
  extracts of the stored parts at the same element plus the scalar decode, so only the rows
  read are decoded;
- any other consumer gets the decode before it and IREE decides (the no-materialization check
  reports the parameter if the decoded weight ends up in a dispatch of its own).

A matmul that is not a matvec also gets a second, load-time form, kept by data-tiled variants
(myelin.codecs._loadtime).

The steps live one idea a module: use analysis (`_uses`), the emission toolkit (`_emit`),
dispatch regions (`_regions`), chunked K (`_chunked`), gather decode (`_gather`), the
load-time form (`_loadtime`), matvecs (`_matvec`) and q4's kernel form (`_q4_gpu`); this module
orders them for one parameter.
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir

from myelin.codecs._blocked import emit_blocked
from myelin.codecs._chunked import emit_chunked
from myelin.codecs._contract import Layout
from myelin.codecs._emit import emit_tensor_decode, load_part, split_of, tensor_type
from myelin.codecs._gather import byte_view, emit_scalar_decode
from myelin.codecs._loadtime import emit_load_time_form, wants_load_time_form
from myelin.codecs._matvec import (
    emit_grouped,
    emit_scaled,
    mark_matvec,
    matvec_loops,
)
from myelin.codecs._q4_gpu import emit_kernel_form
from myelin.codecs._regions import wrap_in_dispatch_region
from myelin.codecs._uses import classify, follow, module_globals, symbol_users


def _part_global_name(name: str, role: str) -> str:
    return name if role == "data" else f"{name}.{role}"


def _replace_global(
    old: ir.Operation, scope: str, key: str, layout: Layout, context: ir.Context
) -> list[tuple[str, ir.Type]]:
    """New globals for the parts, bound to `scope::key<suffix>`; returns (name, type) each."""
    name = ir.StringAttr(old.attributes["sym_name"]).value
    created = []
    for part in layout.parts:
        part_type = ir.Type.parse(tensor_type(part.shape, part.element), context)
        value = ir.Attribute.parse(
            f'#flow.parameter.named<"{scope}"::"{key}{part.suffix}"> : {part_type}', context
        )
        new = old.clone(ip=ir.InsertionPoint(old))
        new.attributes["sym_name"] = ir.StringAttr.get(
            _part_global_name(name, part.role) + ".encoded", context
        )
        new.attributes["type"] = ir.TypeAttr.get(part_type, context)
        new.attributes["initial_value"] = value
        created.append((ir.StringAttr(new.attributes["sym_name"]).value, part_type))
    return created


def rewrite(
    module: ir.Operation, name: str, scope: str, key: str, layout: Layout, context: ir.Context
) -> list[str]:
    """Encode the parameter held by global `name`; returns one line per use ("contraction
    linalg.batch_matmul", ...). The old global and every load of it are gone afterwards."""
    globals_ = module_globals(module)
    old = globals_[name]
    rank = len(layout.logical_shape)
    part_globals = _replace_global(old, scope, key, layout, context)
    loads = symbol_users(module).get(name, [])
    report: list[str] = []
    byte_views: dict[int, tuple[str, ir.Type]] = {}  # part index -> its i8 global (gathers)
    for load in loads:
        for use in list(load.results[0].uses):
            chain = follow(load.results[0], use.owner, use.operand_number, rank)
            kind = classify(chain)
            report.append(f"{kind.kind} {kind.consumer}")
            anchor = chain.consumer if chain.consumer.parent == load.parent else load
            if anchor is load:
                parts = [load_part(g, t, load) for g, t in part_globals]
                # keep them after the original load, which dominates every use
                for v in parts:
                    v.owner.move_after(load)
            else:
                parts = [load_part(g, t, chain.consumer) for g, t in part_globals]
            what = f"{scope}::{key}"
            if kind.kind == "gather":
                for i, part in enumerate(layout.parts):
                    if part.element == "i4":
                        if i not in byte_views:
                            byte_views[i] = byte_view(old, scope, key, part, context)
                        stale = parts[i].owner  # where the part's load was placed
                        parts[i] = load_part(*byte_views[i], stale)
                        stale.erase()
                emit_scalar_decode(chain, layout, parts, context)
            else:
                matvec = None
                if kind.kind == "contraction":
                    matvec = matvec_loops(chain.consumer, chain.operand)
                    if wants_load_time_form(chain, matvec):
                        emit_load_time_form(chain, load.results[0], layout, parts, what, context)
                if kind.kind == "contraction" and split_of(layout) is not None:
                    # the Hopper kernel's form next to the fused one (myelin.codecs._q4_gpu)
                    emit_kernel_form(chain, layout, parts, what, context)
                    if emit_grouped(chain, layout, parts, what, context):
                        continue
                    if emit_chunked(chain, layout, parts, what, context):
                        continue
                if kind.kind == "contraction":
                    if emit_blocked(chain, layout, parts, what, context, scaled=True):
                        continue  # int8's matvec on its blocks
                    if emit_scaled(chain, layout, parts, what, context):
                        continue
                    if emit_blocked(chain, layout, parts, what, context):
                        continue
                # blocks anywhere else: decoded in place, through `floordiv` / `mod`
                plain = replace(layout, blocked=None)
                placed = emit_tensor_decode(chain, plain, parts, what, context)
                if kind.kind == "contraction":
                    wrap_in_dispatch_region([*placed, chain.consumer], context)
                    if matvec is not None:
                        mark_matvec(chain.consumer, *matvec, context)
        load.erase()
    old.erase()
    return report
