"""Vector tiles of data tiling's relayouts on llvm-cpu: whole 16 x 16 tiles
(`relayout_tiles = "whole"`).

Under data tiling a matmul's result leaves it packed (`[M/16, N/16, 16, 16]`) and the next
matmul reads its input packed another way; between them IREE 3.13 puts one dispatch that unpacks,
applies the elementwise ops (a bias, attention's per-head split) and packs again. Its vector tile
is IREE's choice for the elementwise op, one 16-element vector along one tiled dimension: for
BERT's keys and values (`[128, 768]` -> per head `[12, 8, 64, 16, 1]`) a column of 16 rows,
gathered from the packed source with 16 scalar loads per vector.

With "whole" the build edits the tiles IREE chose at the executable-configurations phase, in each
dispatch of one `linalg.unpack`, elementwise `linalg.generic`s and one `linalg.pack`: the
unpack's and the generics' vector tile covers the unpack's whole inner tile (16 rows x 16
columns: 16 contiguous vectors, transposed in registers) and the pack's tile covers the same
elements in its own outer dimensions. What is computed, and in what order each element is, does
not change (outputs bit-identical); dispatch boundaries and distribution stay IREE's.

Measured on the 2-vCPU AMD EPYC (Zen 5), 1 thread, BERT-base at 128 tokens (docs/platforms.md,
"CPU defaults").
"""

from __future__ import annotations

from iree.compiler import ir

_GENERIC = "linalg.generic"
_PACK = "linalg.pack"
_UNPACK = "linalg.unpack"
_VECTOR = "vector_common_parallel = ["


def _ops(root: ir.Operation) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def _ints(op: ir.Operation, name: str) -> list[int] | None:
    return [int(v) for v in op.attributes[name]] if name in op.attributes else None


def _vector_tile(op: ir.Operation) -> list[int] | None:
    if "lowering_config" not in op.attributes:
        return None
    config = str(op.attributes["lowering_config"])
    if not config.startswith("#iree_cpu.lowering_config") or _VECTOR not in config:
        return None
    start = config.index(_VECTOR) + len(_VECTOR)
    return [int(v) for v in config[start : config.index("]", start)].split(",")]


def _set_vector_tile(op: ir.Operation, tile: list[int]) -> None:
    config = str(op.attributes["lowering_config"])
    start = config.index(_VECTOR) + len(_VECTOR)
    text = config[:start] + ", ".join(map(str, tile)) + config[config.index("]", start) :]
    op.attributes["lowering_config"] = ir.Attribute.parse(text)


def whole_tiles(
    rank: int,
    unpack_dims: list[int],
    unpack_tiles: list[int],
    pack_dims: list[int],
    pack_tiles: list[int],
    pack_perm: list[int] | None,
) -> tuple[list[int], list[int]] | None:
    """(the unpacked tensor's vector tile, the pack's outer tile) covering the unpack's whole
    inner tile, or None where the pack's inner tiles do not divide it."""
    tile = [1] * rank
    for dim, size in zip(unpack_dims, unpack_tiles, strict=True):
        tile[dim] = size
    outer = list(tile)
    for dim, size in zip(pack_dims, pack_tiles, strict=True):
        if size <= 0 or tile[dim] % size:
            return None
        outer[dim] = tile[dim] // size
    perm = pack_perm or list(range(rank))
    return tile, [outer[d] for d in perm]


def retile_cpu_relayouts(module: ir.Operation) -> int:
    """Give the unpack, elementwise ops and pack of every static unpack -> elementwise -> pack
    dispatch of `module` (IR at the executable-configurations phase) whole-tile vector tiles;
    the number of dispatches changed."""
    changed = 0
    for function in [op for op in _ops(module) if op.name == "func.func"]:
        ops = _ops(function)
        unpacks = [op for op in ops if op.name == _UNPACK]
        packs = [op for op in ops if op.name == _PACK]
        generics = [op for op in ops if op.name == _GENERIC]
        if len(unpacks) != 1 or len(packs) != 1 or not generics:
            continue
        unpack, pack = unpacks[0], packs[0]
        if any("reduction" in str(op.attributes["iterator_types"]) for op in generics):
            continue
        shape = ir.RankedTensorType(unpack.results[0].type)
        if not shape.has_static_shape or ir.RankedTensorType(pack.operands[0].type) != shape:
            continue
        unpack_dims, pack_dims = _ints(unpack, "inner_dims_pos"), _ints(pack, "inner_dims_pos")
        unpack_tiles = _ints(unpack, "static_inner_tiles")
        pack_tiles = _ints(pack, "static_inner_tiles")
        if not (unpack_dims and pack_dims and unpack_tiles and pack_tiles):
            continue
        if _ints(unpack, "outer_dims_perm") not in (None, list(range(shape.rank))):
            continue
        tiles = whole_tiles(
            shape.rank,
            unpack_dims,
            unpack_tiles,
            pack_dims,
            pack_tiles,
            _ints(pack, "outer_dims_perm"),
        )
        configured = [unpack, *generics, pack]
        current = [_vector_tile(op) for op in configured]
        if tiles is None or any(t is None or len(t) != shape.rank for t in current):
            continue
        wanted = [tiles[0]] * (1 + len(generics)) + [tiles[1]]
        if current == wanted:
            continue
        for op, tile in zip(configured, wanted, strict=True):
            _set_vector_tile(op, tile)
        changed += 1
    return changed
