"""q4 weights on Hopper: a skinny-M (M <= 16) q4 x f16/bf16 matmul kernel with the 4-bit
unpacking fused, for the encoded matmuls of a decode step.

Without it, a CUDA variant decodes q4 into floats inside each contraction's dispatch (IREE
codegen, the contracted axis cut into chunks of 256 and summed: myelin.codecs._chunked), which on a
decode step reads the 4-bit weight through many small dispatches and spends its time decoding.
This kernel reads the stored parts in place (format 15: K-major in blocks of B outputs, codes
[N / B, K, B] two per byte along B, group factors [N / B, K / g, B], output factors [N]) once per
call:

- per program, one stored block of BN = B outputs and a share KS of the contracted axis
  (split-K, so that a 4096-output projection still streams through every SM);
- computed transposed, out^T = W^T x^T: the outputs on the dot's wide side (BN / 2 per nibble:
  the tensor cores' 64-row side on Hopper), the M <= 16 activation rows on its narrow side; the
  low nibbles (even outputs) and the high ones (odd outputs) are two dots, so the codes are
  never interleaved in registers (the first version joined and reshaped them into [G, BN] and
  took x @ W: 0.7-1.4x slower on the decoder7b shapes, benchmarks/probes/gpu/q4_configs_h200.py);
- per group of 32 contracted elements: the codes unpacked by mask and shift to f16 (exact: 0..15)
  and the group's partial products `P[n, m] = sum_e q[e, n] * x[m, e]` by `tl.dot` (f32
  accumulation), then the group's factors once per output: `acc_s += P * scale8`, `acc_o +=
  offset8 * xs[m]` with `xs` the group's activation sum (codecs.md, "q4's grouped matvec");
- at the end `part[s, m, n] = acc_s * row_scale[n] + acc_o * row_offset[n]` in f32.

IREE sums the shares, adds the consumer's init and narrows to the consumer's result type in one
codegen dispatch after the kernel (myelin.codecs._q4_gpu builds that IR and states which matmuls
the kernel takes: `covers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir

from myelin.codecs import Q4_BLOCKS, Q4_MATMUL_ATTRIBUTE, q4_kernel_forms
from myelin.codecs import Q4_KERNEL_GROUP as GROUP
from myelin.codecs import Q4_KERNEL_MAX_M as MAX_M
from myelin.codecs import q4_kernel_covers as covers  # noqa: F401  (the contract, here too)
from myelin.kernels._triton import CompiledKernel, compile_triton

# The split-K rule, from the H200 sweep (docs/kernels.md): at least about two programs per SM of
# an H200 (132 SMs), each with at most 16 groups of the contracted axis (a longer share runs
# alone at the end), and at least 4.
_WANTED_PROGRAMS = 256
_MAX_SHARE_GROUPS = 16
_MIN_SHARE = 128  # contracted elements per program at least (4 groups)
_TYPES = {"f16": "fp16", "bf16": "bf16"}


@dataclass(frozen=True)
class Q4Config:
    """One q4 matmul kernel: out[M, N] from x[M, K] and a q4:g32 [K, N] weight."""

    dtype: str  # the activation's: "f16" | "bf16"
    n: int
    k: int
    block_n: int
    split: int  # programs along K; each takes k / split
    block_m: int = MAX_M
    num_warps: int = 4
    num_stages: int = 4

    @property
    def name(self) -> str:
        return (
            f"plex_q4_matmul_{self.dtype}_n{self.n}_k{self.k}_"
            f"{self.block_m}x{self.block_n}_s{self.split}_w{self.num_warps}s{self.num_stages}"
        )

    @property
    def grid(self) -> tuple[int, int]:
        return self.n // self.block_n, self.split


def choose(dtype: str, n: int, k: int) -> Q4Config:
    """One stored block of outputs per program: 256 where N allows (128 bytes of codes per
    contracted row; the codec's Q4_BLOCKS, which the kernel's indexing reads); the
    contracted axis split by the smallest divisor of its group count that gives
    _WANTED_PROGRAMS programs with at most _MAX_SHARE_GROUPS groups each (any divisor: 11008
    = 43 * 256 splits 43 ways), else the largest split that keeps _MIN_SHARE elements each."""
    block_n = next(b for b in Q4_BLOCKS if n % b == 0)
    blocks, groups = n // block_n, k // GROUP
    splits = [d for d in range(1, groups + 1) if groups % d == 0 and k // d >= _MIN_SHARE]
    split = next(
        (d for d in splits if blocks * d >= _WANTED_PROGRAMS and groups // d <= _MAX_SHARE_GROUPS),
        splits[-1],
    )
    return Q4Config(dtype=dtype, n=n, k=k, block_n=block_n, split=split)


def _q4_fn():
    from myelin.kernels._q4_triton import plex_q4_matmul

    return plex_q4_matmul


def compile_q4(config: Q4Config, arch: str = "sm_90a") -> CompiledKernel:
    """Triton -> PTX -> cubin for `arch`, with no GPU present (myelin.kernels._triton)."""
    signature = {
        "x_ptr": f"*{_TYPES[config.dtype]}", "q_ptr": "*u8", "s_ptr": "*u8", "o_ptr": "*i8",
        "rs_ptr": "*fp32", "ro_ptr": "*fp32", "part_ptr": "*fp32", "M": "i32",
        "N": "constexpr", "K": "constexpr", "KS": "constexpr", "G": "constexpr",
        "BM": "constexpr", "BN": "constexpr",
    }  # fmt: skip
    constexprs = {
        "N": config.n, "K": config.k, "KS": config.k // config.split, "G": GROUP,
        "BM": config.block_m, "BN": config.block_n,
    }  # fmt: skip
    # IREE's bindings are 16-byte aligned at least; every row the kernel steps by is a multiple
    # of 16 elements or bytes (N % 64 == 0, K % 128 == 0: `covers`).
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(7)}
    return compile_triton(
        _q4_fn, signature, constexprs, attrs,
        num_warps=config.num_warps, num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip


@dataclass(frozen=True)
class Q4Site:
    """One q4 contraction of the graph (a kernel form) and the kernel it went to."""

    function: str
    parameter: str  # "scope::key"
    shape: tuple[int, int, int]  # (M, N, K)
    dtype: str
    kernel: str | None
    reason: str

    def to_json(self) -> dict:
        m, n, k = self.shape
        return {
            "function": self.function,
            "location": self.parameter,
            "op": "q4_matmul",
            "m": m,
            "n": n,
            "k": k,
            "dtype": self.dtype,
            "out_dtype": "f32",
            "kernel": self.kernel,
            "reason": self.reason,
        }


def _wrapper_text(name: str, kernel: CompiledKernel, config: Q4Config, types: list[str]) -> str:
    """The kernel's wrapper: the codes viewed as bytes, the kernel writing its K shares
    [split, M, N] in f32, and IREE's sum of the shares into the consumer's init."""
    from myelin.kernels._rewrite import _hex

    x_t, q_t, s_t, o_t, rs_t, ro_t, init_t = types
    m = ir.RankedTensorType(ir.Type.parse(init_t)).get_dim_size(0)
    n, k, split = config.n, config.k, config.split
    bytes_t = f"tensor<{k}x{n // 2}xi8>"
    part_t = f"tensor<{split}x{m}x{n}xf32>"
    data = f'dense<"{_hex(kernel.cubin)}"> : vector<{len(kernel.cubin)}xi8>'
    binding = "#hal.pipeline.binding<storage_buffer"
    blocks, _ = config.grid
    return f"""
util.func private @{name}(%x: {x_t}, %q: {q_t}, %s: {s_t}, %o: {o_t}, %rs: {rs_t},
                          %ro: {ro_t}, %init: {init_t}) -> {init_t} {{
  %qb = flow.tensor.bitcast %q : {q_t} -> {bytes_t}
  %m_i32 = arith.constant {m} : i32
  %wx = arith.constant {blocks} : index
  %wy = arith.constant {split} : index
  %p = hal.dispatch.extern "{kernel.name}"[%wx, %wy](%m_i32, %x, %qb, %s, %o, %rs, %ro)
      : (i32, {x_t}, {bytes_t}, {s_t}, {o_t}, {rs_t}, {ro_t}) -> {part_t}
    count(%device: !hal.device, %gx: index, %gy: index) -> (index, index, index) {{
      %one = arith.constant 1 : index
      hal.return %gx, %gy, %one : index, index, index
    }}
    layout(#hal.pipeline.layout<constants = 1, bindings = [
      {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}, ReadOnly>,
      {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}, ReadOnly>, {binding}>]>)
    objects({{
      #hal.executable.target<"cuda", "cuda-nvptx-fb"> ordinal(0) = [
        #hal.executable.object<{{path = "{kernel.name}.cubin", data = {data}}}>
      ]
    }})
    <{{workgroup_size = [{kernel.threads} : index, 1 : index, 1 : index],
       workgroup_local_memory = {kernel.shared_bytes} : index}}>
  %sum = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> (d2, d0, d1)>,
                                          affine_map<(d0, d1, d2) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%p : {part_t}) outs(%init : {init_t}) {{
    ^bb0(%a: f32, %acc: f32):
      %t = arith.addf %acc, %a : f32
      linalg.yield %t : f32
  }} -> {init_t}
  util.return %sum : {init_t}
}}
"""


def rewrite_q4(module: ir.Operation, arch: str) -> tuple[list[Q4Site], dict[str, CompiledKernel]]:
    """Replace the kernel form of every q4 contraction (myelin.codecs._q4_gpu; kept by
    `myelin.codecs.finalize` for a kernels build) by a call of its kernel's wrapper; returns the
    sites and the kernels compiled."""
    from myelin.kernels._rewrite import _function_name, add_functions, call_in_place_of

    body = module.regions[0].blocks[0]
    sites: list[Q4Site] = []
    kernels: dict[str, CompiledKernel] = {}
    wrappers: dict[tuple[str, ...], str] = {}
    for op in q4_kernel_forms(module):
        expand = op.operands[0].owner
        expand = getattr(expand, "operation", expand)
        x = expand.operands[0]  # the activation as [M, K]
        operands = [x, *op.operands[1:7]]
        types = [str(v.type) for v in operands]
        x_t = ir.RankedTensorType(x.type)
        m, k = x_t.get_dim_size(0), x_t.get_dim_size(1)
        n = ir.RankedTensorType(op.results[0].type).get_dim_size(1)
        dtype = str(x_t.element_type)
        parameter = ir.StringAttr(op.attributes[Q4_MATMUL_ATTRIBUTE]).value
        config = choose(dtype, n, k)
        if config.name not in kernels:
            kernels[config.name] = compile_q4(config, arch)
        key = (config.name, *types)
        name = wrappers.get(key)
        if name is None:
            name = wrappers[key] = f"__plex_q4_kernel_{len(wrappers)}_{config.name}"
            add_functions(body, _wrapper_text(name, kernels[config.name], config, types))
        call = call_in_place_of(op, name, operands)
        sites.append(
            Q4Site(_function_name(call), parameter, (m, n, k), dtype, config.name, "matched q4")
        )
        op.erase()
        if not list(expand.results[0].uses):
            expand.erase()
    return sites, kernels
