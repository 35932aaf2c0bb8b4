"""llvm-cpu `compute = "bf16"`: every matmul (batch matmuls included) takes its inputs rounded
to bf16 and accumulates in f32; convolutions, elementwise ops, softmax and norms stay f32, and
so do a causal LM's attention products over its cache rows (generic contractions, which IREE's
demotion does not take: myelin.compiler.cpu_attention).

On a CPU with AVX512-BF16 the data-tiled kernels then run bf16 dot products (two products per
f32 lane) on weights packed at half the bytes: the reduced-precision mode OpenVINO's CPU plugin
takes by default on such a CPU. Elsewhere the bf16 inputs are widened again and nothing is
gained. It moves an f32 model's outputs by a few thousandths, so the build chooses it itself
only for a model whose weights are all q4 or int8, coarser than bf16, on a CPU with AVX512-BF16
(myelin.compiler.targets.compute_choice); otherwise it is the app's choice.

IREE 3.13 has the rewrite as a global-optimization pass, but its flags
(`--iree-global-opt-demote-contraction-inputs-type`, `-operations`) are process-wide
command-line options, not session options: a compile session refuses them ("option not
found"), and setting them on the process would demote every later f32 compile of that process
too. The pass itself is public, so PLeX runs it on the module at the input phase, after its own
rewrites (attention as matmuls, 1-D convolutions as im2col), whose matmuls it then covers.

Convolutions are left out (`operation=matmul`): IREE 3.13's demotion of a 2-D convolution
builds an invalid body (`arith.addf` of a bf16 product and the f32 accumulator: "'arith.addf'
op requires the same type for all operands and results"), so a model with a Conv2d would not
compile.
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir
from iree.compiler.passmanager import PassManager

from myelin.compiler.targets import TargetDevice
from myelin.errors import CompileError
from myelin.platforms import CPU_COMPUTE

# compute -> the pass pipeline that gives it (none: the model's own precision)
PIPELINES: dict[str, str | None] = {
    "f32": None,
    "bf16": "builtin.module(iree-global-opt-demote-contraction-inputs{operation=matmul type=bf16})",
}
assert set(PIPELINES) == set(CPU_COMPUTE)  # the manifest accepts what is compiled here


def compute_of(devices: Sequence[TargetDevice]) -> str:
    """The one compute mode of a variant's llvm-cpu devices ("f32" without any). A module is
    rewritten as a whole, so llvm-cpu devices of one variant must agree."""
    modes = {d.compute for d in devices if d.target == "llvm-cpu"}
    if len(modes) > 1:
        listed = ", ".join(f"'{d.name}' {d.compute}" for d in devices if d.target == "llvm-cpu")
        raise CompileError(
            f"the llvm-cpu devices of one variant need one compute mode, got {listed}: a "
            "module's contractions are rewritten together; give them the same `compute`, or put "
            "them in two variants"
        )
    mode = modes.pop() if modes else "f32"
    if mode not in PIPELINES:
        raise CompileError(f"unknown compute {mode!r}; accepted: {', '.join(PIPELINES)}")
    return mode


def demote_contractions(module: ir.Operation, devices: Sequence[TargetDevice]) -> str:
    """Rewrite `module`'s contractions for its variant's compute mode (in its context); the
    mode applied."""
    mode = compute_of(devices)
    pipeline = PIPELINES[mode]
    if pipeline is not None:
        PassManager.parse(pipeline, context=module.context).run(module)
    return mode
