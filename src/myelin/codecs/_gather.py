"""Gather decode: a `tensor.extract` of an encoded table (an embedding lookup inside a
linalg.generic body) becomes extracts of its stored parts at the same element plus the scalar
decode, so only the rows read are decoded. A 4-bit part is read through an i8 view of its
bytes (`byte_view`)."""

from __future__ import annotations

from iree.compiler import ir

from myelin.codecs._contract import Layout, StoredPart
from myelin.codecs._emit import (
    decode_lines,
    parse_template,
    remap,
    result_name,
    template_body,
    tensor_type,
)
from myelin.codecs._uses import DIM, Chain


def emit_scalar_decode(
    chain: Chain, layout: Layout, parts: list[ir.Value], context: ir.Context
) -> None:
    """Replace `tensor.extract %weight[...]` by extracts of the parts at the same logical
    element and the scalar decode: only the elements read are ever decoded. A 4-bit part is
    read through its byte view (an i8 global over the same bytes): a scalar i4 extract does not
    compile for CUDA in IREE 3.13 ("failed to emulate bit width")."""
    extract = chain.consumer
    indices = list(extract.operands)[1:]
    rank = len(chain.src)
    logical = [indices[s] for s in chain.src]
    element = str(ir.RankedTensorType(chain.value.type).element_type)
    dims = ", ".join(f"d{i}" for i in range(rank))
    args = [f"%t{i}: {v.type}" for i, v in enumerate(parts)]
    args += [f"%i{d}: index" for d in range(rank)]
    lines = []
    for i, part in enumerate(layout.parts):
        names = []
        for j, expr in enumerate(part.index):
            plain = DIM.fullmatch(expr)
            if plain is not None:
                names.append(f"%i{plain.group(1)}")
                continue
            name = f"%x{i}_{j}"
            lines.append(
                f"{name} = affine.apply affine_map<({dims}) -> ({expr})>"
                f"({', '.join(f'%i{d}' for d in range(rank))})"
            )
            names.append(name)
        if part.element != "i4":
            lines.append(f"%p{i} = tensor.extract %t{i}[{', '.join(names)}] : {parts[i].type}")
            continue
        # `parts[i]` is the byte view of 4-bit data (byte_view): extract the byte holding the
        # element and shift its nibble down (the even element is the low nibble)
        last = part.index[-1]
        operands = ", ".join(f"%i{d}" for d in range(rank))
        apply = f"affine.apply affine_map<({dims}) -> (EXPR)>({operands})"
        lines += [
            f"%y{i} = {apply.replace('EXPR', f'({last}) floordiv 2')}",
            f"%z{i} = {apply.replace('EXPR', f'(({last}) mod 2) * 4')}",
            f"%w{i} = arith.index_cast %z{i} : index to i8",
            f"%b{i} = tensor.extract %t{i}[{', '.join([*names[:-1], f'%y{i}'])}] : {parts[i].type}",
            f"%s{i} = arith.shrui %b{i}, %w{i} : i8",
            f"%p{i} = arith.trunci %s{i} : i8 to i4",
        ]
    lines += decode_lines(layout, element)
    body = "\n".join(f"  {line}" for line in lines)
    text = (
        f"func.func private @decode({', '.join(args)}) -> {element} {{\n{body}\n"
        f"  return {result_name(element)} : {element}\n}}"
    )
    template = parse_template(context, text)
    block, ops = template_body(template)
    ret = ops[-1]
    result = ret.operands[0]
    moved = ops[:-1]
    for op in moved:
        op.move_before(extract)
    remap(moved, [*zip(block.arguments, [*parts, *logical], strict=True)])
    extract.results[0].replace_all_uses_with(result)
    extract.erase()
    for op in reversed(chain.ops):
        op.erase()


def byte_view(
    old: ir.Operation, scope: str, key: str, part: StoredPart, context: ir.Context
) -> tuple[str, ir.Type]:
    """A global of i8 over a 4-bit part's bytes (the same parameter, its innermost dim
    halved): (name, type)."""
    shape = (*part.shape[:-1], part.shape[-1] // 2)
    view_type = ir.Type.parse(tensor_type(shape, "i8"), context)
    new = old.clone(ip=ir.InsertionPoint(old))
    name = ir.StringAttr(old.attributes["sym_name"]).value
    new.attributes["sym_name"] = ir.StringAttr.get(f"{name}.bytes.encoded", context)
    new.attributes["type"] = ir.TypeAttr.get(view_type, context)
    new.attributes["initial_value"] = ir.Attribute.parse(
        f'#flow.parameter.named<"{scope}"::"{key}{part.suffix}"> : {view_type}', context
    )
    return ir.StringAttr(new.attributes["sym_name"]).value, view_type
