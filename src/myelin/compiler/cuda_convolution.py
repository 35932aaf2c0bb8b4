"""f16 and bf16 convolutions left to IREE 3.13's own CUDA codegen: named, so the build can warn.

timm's ResNet-50 in f16, its convolutions compiled by IREE 3.13's CUDA codegen (sm_80 code), ran
on an H100 at 0.01x torch eager's speed and gave a wrong answer (cosine 0.66 to torch's output;
docs/kernels.md, "The zoo"). A CUDA device with the kernel library sends its 2-D convolutions to
the matmul kernels (myelin.kernels._conv); whatever convolution is still in the IR when the
variant compiles (no library, or a form the rewrite does not take) is listed here, one phrase
each, and the build warns with them. IREE is not changed: it is a warning, not a refusal.
"""

from __future__ import annotations

from iree.compiler import ir

from myelin.compiler.placement import find_ops

_HALF = ("f16", "bf16")


def half_convolutions(module: ir.Operation) -> list[str]:
    """`conv_2d_nchw_fchw f16 2x3x230x230 * 64x3x7x7 (loc)` for every convolution of `module`
    whose input is f16 or bf16."""
    found = []
    for op in find_ops(
        module,
        lambda o: o.name.startswith(("linalg.conv", "linalg.depthwise_conv")),
    ):
        types = [v.type for v in op.operands[:2]]
        if not all(isinstance(t, ir.RankedTensorType) for t in types):
            continue
        dtype = str(ir.RankedTensorType(types[0]).element_type)
        if dtype not in _HALF:
            continue
        shapes = " * ".join(
            "x".join("?" if d == ir.ShapedType.get_dynamic_size() else str(d) for d in t.shape)
            for t in map(ir.RankedTensorType, types)
        )
        found.append(f"{op.name.removeprefix('linalg.')} {dtype} {shapes} ({op.location})")
    return found
