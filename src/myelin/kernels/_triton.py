"""Triton kernels compiled for sm_90a at build time (Triton is a build-time extra: `kernels`).

Nothing here runs at run time: the build embeds each kernel's cubin in the module as an IREE
external executable object, and the runtime only loads it. IREE's CUDA HAL launches a kernel
with exactly its bindings (operands, then results) followed by its i32 push constants, so a
kernel takes its pointers first and its sizes after, and Triton's trailing scratch parameters are
removed from the PTX before it is assembled (`_drop_scratch_params`). A persistent TMA kernel
does use Triton's global scratch (its device-side tensor descriptors): that parameter becomes one
more result binding, which the wrapper sizes from Triton's metadata (`_bind_scratch_param`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from myelin.errors import CompileError

# The PTX ISA the PTX is stamped with: Triton 3.9 stamps its own ptxas's newest (9.4), which only
# a CUDA 13.4 driver could JIT; the body is the same at 8.0 and we assemble it ourselves anyway.
PTX_VERSION = 80
# The TMA kernels' `cp.async.bulk.tensor` and `tensormap.replace` need PTX ISA 8.6 (sm_90a).
PTX_VERSION_TMA = 86


@dataclass(frozen=True)
class MatmulConfig:
    """One matmul kernel: C[M, N] = A[M, K] x B (B is [K, N], or [N, K] when `b_transposed`),
    inputs f16 or bf16, f32 accumulation, C in `out_dtype`."""

    dtype: str  # "f16" | "bf16"
    out_dtype: str  # "f16" | "bf16" | "f32"
    b_transposed: bool
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    # Persistent TMA kernel: min(SM count, tiles) programs loop over the output tiles, A and B
    # loaded and C stored through device-side tensor descriptors (`_persistent_fn`).
    persistent: bool = False
    # A convolution's matmul whose A (the im2col columns) the kernel reads from the NHWC input
    # itself (`_conv_fn`): the gather is never made. B^T only, not persistent, no bias.
    im2col: bool = False
    # ... and C is no multiple of block_k (ResNet's stem: C = 3): A's K index is split into
    # tap and channel per column, and the columns past the real K are masked to zero.
    im2col_masked: bool = False
    # block_m = 1 (only where M == 1): the CUDA-core GEMV kernel (`_gemv_fn`), no tl.dot.
    # The kernel adds a bias [N] (in C's type) to the f32 sums before C is written: a linear's
    # bias add then needs no dispatch of its own (the tl.dot kernels only; not the GEMV).
    bias: bool = False
    # An activation applied to the f32 sums (after the bias) before C is written, by its name in
    # myelin.kernels._epilogue.ACTIVATIONS ("": none): its elementwise dispatch then goes.
    activation: str = ""
    # A second [M, N] operand (in C's type) the result is then merged with, by its name in
    # `MERGE_CODES` ("add": a residual connection; "mul": Llama's gate x up; "": none).
    merge: str = ""

    @property
    def name(self) -> str:
        layout = ("tma_" if self.persistent else "") + ("abt" if self.b_transposed else "ab")
        kind = ("conv_masked" if self.im2col_masked else "conv") if self.im2col else "matmul"
        # The group size is named only when it is neither the default 8 nor 1 (the skinny
        # config's), so the library's own kernels keep their names; the tuning space never
        # pairs group 1 with tall tiles (myelin.kernels._space).
        group = "" if self.group_m in (1, 8) else f"g{self.group_m}"
        return (
            f"plex_{kind}_{layout}_{self.dtype}_{self.out_dtype}_"
            f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}s{self.num_stages}"
            f"{group}{'_bias' if self.bias else ''}"
            f"{'_' + self.activation if self.activation else ''}"
            f"{'_' + self.merge if self.merge else ''}"
        )


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    cubin: bytes
    ptx: str
    shared_bytes: int  # dynamic shared memory the launch must declare
    threads: int  # threads per block: num_warps * 32
    # Triton's global scratch per program (bytes; 0: none). A kernel with scratch takes it as the
    # binding after its results, `scratch_bytes` x the grid's largest program count in size.
    scratch_bytes: int = 0
    # The alignment the kernel rounds the scratch binding's base up to; the binding holds that
    # much more than the grid's slices (IREE packs transients at its own, smaller alignment).
    scratch_align: int = 0
    # A persistent kernel's largest grid (the arch's SM count); 0: one program per output tile.
    max_programs: int = 0


_TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
# The kernels' ACT constexpr per `MatmulConfig.activation` (myelin.kernels._epilogue finds them)
ACTIVATION_CODES = {"": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu": 4}
# The kernels' MERGE constexpr per `MatmulConfig.merge`
MERGE_CODES = {"": 0, "add": 1, "mul": 2}


def _matmul_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_matmul(
        a_ptr, b_ptr, bias_ptr, merge_ptr, c_ptr, M, N, K,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        B_T: tl.constexpr, BIAS: tl.constexpr, ACT: tl.constexpr, MERGE: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BM)
        num_pid_n = tl.cdiv(N, BN)
        # Grouped order: GROUP_M row blocks share each column block of B while it is in L2.
        in_group = GROUP_M * num_pid_n
        first_m = (pid // in_group) * GROUP_M
        group_rows = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % in_group) % group_rows)
        pid_n = (pid % in_group) // group_rows
        # Rows and columns past the edge load row/column 0 again (no masks in the K loop) and
        # are masked at the store.
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        rows = offs_m % M
        cols = tl.max_contiguous(tl.multiple_of(offs_n % N, 16), 16)
        offs_k = tl.arange(0, BK)
        a_ptrs = a_ptr + rows[:, None] * K + offs_k[None, :]
        if B_T:
            b_ptrs = b_ptr + cols[None, :] * K + offs_k[:, None]
            b_step = BK
        else:
            b_ptrs = b_ptr + offs_k[:, None] * N + cols[None, :]
            b_step = BK * N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K, BK):  # K % BK == 0: checked where the kernel is matched
            acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
            a_ptrs += BK
            b_ptrs += b_step
        if BIAS:  # bias_ptr is None (no parameter) otherwise
            acc += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        # the activation (`ACTIVATION_CODES`), as the persistent kernel does
        if ACT == 1:  # gelu
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        elif ACT == 2:  # gelu_tanh: tanh(u) = 1 - 2 / (exp(2u) + 1)
            u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
            acc = 0.5 * acc * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
        elif ACT == 3:  # silu
            acc = acc * tl.sigmoid(acc)
        elif ACT == 4:  # relu
            acc = tl.maximum(acc, 0.0)
        c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if MERGE != 0:  # merge_ptr is None (no parameter) otherwise; `MERGE_CODES`
            other = tl.load(merge_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask)
            if MERGE == 1:
                acc += other.to(tl.float32)
            else:
                acc *= other.to(tl.float32)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return plex_matmul


def _conv_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_conv(
        x_ptr, w_ptr, c_ptr, M, N, K, OH, OW, HP, WP, C, KW, SH, SW, DH, DW, KR,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        MASKED: tl.constexpr,
    ):  # fmt: skip
        # The matmul kernel with A = im2col(x) read in place: x is [batch, HP, WP, C] (NHWC,
        # padded), A's row m is output pixel (b, oh, ow), its column k is tap (i, j) and channel
        # c, k = (i * KW + j) * C + c. Where C % BK == 0 each K step lies in one tap: one offset
        # per step, added to each row's base. Otherwise (MASKED) each column gets its own
        # offset, and the columns from the real K (KR) to the filter's padded K read zeros.
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BM)
        num_pid_n = tl.cdiv(N, BN)
        in_group = GROUP_M * num_pid_n
        first_m = (pid // in_group) * GROUP_M
        group_rows = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % in_group) % group_rows)
        pid_n = (pid % in_group) // group_rows
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        rows = offs_m % M
        cols = tl.max_contiguous(tl.multiple_of(offs_n % N, 16), 16)
        pixel = rows % (OH * OW)
        image = (rows // (OH * OW)).to(tl.int64)
        base = ((image * HP + (pixel // OW) * SH) * WP + (pixel % OW) * SW) * C
        offs_k = tl.arange(0, BK)
        b_ptrs = w_ptr + cols[None, :] * K + offs_k[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            if MASKED:
                kk = k0 + offs_k
                tap = kk // C
                step = ((tap // KW) * DH * WP + (tap % KW) * DW) * C + (kk - tap * C)
                a_ptrs = x_ptr + base[:, None] + step[None, :]
                a = tl.load(a_ptrs, mask=(kk < KR)[None, :], other=0.0)
            else:
                tap = k0 // C
                step = ((tap // KW) * DH * WP + (tap % KW) * DW) * C + (k0 - tap * C)
                a = tl.load(x_ptr + base[:, None] + step + offs_k[None, :])
            acc = tl.dot(a, tl.load(b_ptrs), acc)
            b_ptrs += BK
        c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return plex_conv


# The geometry a `plex_conv` kernel takes after M, N, K, as i32 push constants, in order.
# KR: the real K (C x KH x KW), which the filter's K pads to a multiple of 64.
CONV_GEOMETRY = ("OH", "OW", "HP", "WP", "C", "KW", "SH", "SW", "DH", "DW", "KR")


def _gemv_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_gemv(
        a_ptr, b_ptr, bias_ptr, merge_ptr, c_ptr, M, N, K,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        B_T: tl.constexpr, BIAS: tl.constexpr, ACT: tl.constexpr, MERGE: tl.constexpr,
    ):  # fmt: skip
        # One row of A per program (BM == 1) by a BN-column block of B, on the CUDA cores: a
        # 16-row tl.dot would pad the row 16-fold, and a GEMV is bound by the weight's bytes.
        # Products accumulate per lane over K and are reduced once at the end.
        pid = tl.program_id(0)
        num_pid_n = tl.cdiv(N, BN)
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        offs_n = pid_n * BN + tl.arange(0, BN)
        cols = tl.max_contiguous(tl.multiple_of(offs_n % N, 16), 16)
        offs_k = tl.arange(0, BK)
        a_ptrs = a_ptr + pid_m * K + offs_k
        if B_T:
            b_ptrs = b_ptr + cols[:, None] * K + offs_k[None, :]
            b_step = BK
            acc = tl.zeros((BN, BK), dtype=tl.float32)
        else:
            b_ptrs = b_ptr + offs_k[:, None] * N + cols[None, :]
            b_step = BK * N
            acc = tl.zeros((BK, BN), dtype=tl.float32)
        for _ in range(0, K, BK):  # K % BK == 0: checked where the kernel is matched
            x = tl.load(a_ptrs).to(tl.float32)
            w = tl.load(b_ptrs).to(tl.float32)
            if B_T:
                acc += w * x[None, :]
            else:
                acc += w * x[:, None]
            a_ptrs += BK
            b_ptrs += b_step
        out = tl.sum(acc, axis=1) if B_T else tl.sum(acc, axis=0)
        tl.store(c_ptr + pid_m * N + offs_n, out.to(c_ptr.dtype.element_ty), mask=offs_n < N)

    return plex_gemv


def _persistent_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_matmul_tma(
        a_ptr, b_ptr, bias_ptr, merge_ptr, c_ptr, M, N, K,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        B_T: tl.constexpr, BIAS: tl.constexpr, ACT: tl.constexpr, MERGE: tl.constexpr,
        PROGRAMS: tl.constexpr,
    ):  # fmt: skip
        # Persistent: the grid is min(PROGRAMS, tiles) (the wrapper's workgroup count), and each
        # program takes every PROGRAMS-th tile, so the tiles are covered on any grid of that size
        # (a GPU with fewer SMs runs the extra programs when an SM frees up).
        start = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BM)
        num_pid_n = tl.cdiv(N, BN)
        tiles = num_pid_m * num_pid_n
        # Device-side descriptors: built in Triton's global scratch (the extra binding). TMA
        # clips rows past M on the store and reads zeros past it, so no masks anywhere.
        a_desc = tl.make_tensor_descriptor(
            a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK]
        )
        if B_T:
            b_desc = tl.make_tensor_descriptor(
                b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK]
            )
        else:
            b_desc = tl.make_tensor_descriptor(
                b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN]
            )
        c_desc = tl.make_tensor_descriptor(
            c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN]
        )
        in_group = GROUP_M * num_pid_n
        for tile in tl.range(start, tiles, PROGRAMS, flatten=True):
            # Grouped order, as the non-persistent kernel's.
            first_m = (tile // in_group) * GROUP_M
            group_rows = min(num_pid_m - first_m, GROUP_M)
            pid_m = first_m + ((tile % in_group) % group_rows)
            pid_n = (tile % in_group) // group_rows
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k in range(0, K, BK):
                a = a_desc.load([pid_m * BM, k])
                b = b_desc.load([pid_n * BN, k]).T if B_T else b_desc.load([k, pid_n * BN])
                acc = tl.dot(a, b, acc)
            if BIAS:  # bias_ptr is None (no parameter) otherwise
                offs_n = pid_n * BN + tl.arange(0, BN)
                acc += tl.load(bias_ptr + offs_n, mask=offs_n < N).to(tl.float32)[None, :]
            # the activation, as the non-persistent kernel (a helper would be one copy, but
            # Triton's interpreter, which the tests run, cannot call a jit function the
            # kernel's factory defines)
            if ACT == 1:  # gelu
                acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
            elif ACT == 2:  # gelu_tanh
                u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
                acc = 0.5 * acc * (2.0 - 2.0 / (tl.exp(2.0 * u) + 1.0))
            elif ACT == 3:  # silu
                acc = acc * tl.sigmoid(acc)
            elif ACT == 4:  # relu
                acc = tl.maximum(acc, 0.0)
            if MERGE != 0:  # merge_ptr is None (no parameter) otherwise; `MERGE_CODES`
                rows = pid_m * BM + tl.arange(0, BM)
                cols = pid_n * BN + tl.arange(0, BN)
                inside = (rows[:, None] < M) & (cols[None, :] < N)
                at = merge_ptr + rows[:, None] * N + cols[None, :]
                other = tl.load(at, mask=inside).to(tl.float32)
                if MERGE == 1:
                    acc += other
                else:
                    acc *= other
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_ptr.dtype.element_ty))

    return plex_matmul_tma


def compile_matmul(config: MatmulConfig, arch: str = "sm_90a") -> CompiledKernel:
    """Triton -> PTX (sm_90a: wgmma) -> our ptxas pass -> cubin, with no GPU present."""
    t_in, t_out = _TRITON_TYPES[config.dtype], _TRITON_TYPES[config.out_dtype]
    if (config.bias or config.activation or config.merge) and config.block_m == 1:
        raise ValueError(f"{config.name}: the GEMV kernel has no epilogue (bias, activation)")
    if config.im2col:
        return _compile_conv(config, arch)
    # The bias and the merge operand are bindings (after B, in that order, as IREE orders an
    # external dispatch's operands) only where the config has them: a None constexpr is no
    # parameter at all.
    signature = {
        "a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}",
        "bias_ptr": f"*{t_out}" if config.bias else "constexpr",
        "merge_ptr": f"*{t_out}" if config.merge else "constexpr", "c_ptr": f"*{t_out}",
        "M": "i32", "N": "i32", "K": "i32",
        "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP_M": "constexpr",
        "B_T": "constexpr", "BIAS": "constexpr", "ACT": "constexpr", "MERGE": "constexpr",
    }  # fmt: skip
    constexprs = {
        "BM": config.block_m, "BN": config.block_n, "BK": config.block_k,
        "GROUP_M": config.group_m, "B_T": config.b_transposed, "BIAS": config.bias,
        "ACT": ACTIVATION_CODES[config.activation], "MERGE": MERGE_CODES[config.merge],
    }  # fmt: skip
    if not config.bias:
        constexprs["bias_ptr"] = None
    if not config.merge:
        constexprs["merge_ptr"] = None
    # Pointers 16-byte aligned, N and K multiples of 16 (checked where the kernel is matched).
    aligned = [n for n, t in signature.items() if t.startswith("*")] + ["N", "K"]
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    if config.persistent:
        signature["PROGRAMS"] = "constexpr"
        constexprs["PROGRAMS"] = programs = sm_count(arch)
        kernel = compile_triton(
            _persistent_fn, signature, constexprs, attrs,
            num_warps=config.num_warps, num_stages=config.num_stages, name=config.name,
            arch=arch, ptx_version=PTX_VERSION_TMA, scratch_binding=True,
        )  # fmt: skip
        return dataclasses.replace(kernel, max_programs=programs)
    return compile_triton(
        _gemv_fn if config.block_m == 1 else _matmul_fn, signature, constexprs, attrs,
        num_warps=config.num_warps, num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip


def _compile_conv(config: MatmulConfig, arch: str) -> CompiledKernel:
    """The implicit-im2col kernel: bindings x, w, c, then M, N, K and `CONV_GEOMETRY`."""
    plain = not (config.bias or config.activation or config.merge or config.persistent)
    if not plain or not config.b_transposed:
        raise ValueError(f"{config.name}: the convolution kernel is A x B^T, plain, no bias")
    t_in, t_out = _TRITON_TYPES[config.dtype], _TRITON_TYPES[config.out_dtype]
    signature = {"x_ptr": f"*{t_in}", "w_ptr": f"*{t_in}", "c_ptr": f"*{t_out}"}
    signature |= {name: "i32" for name in ("M", "N", "K", *CONV_GEOMETRY)}
    constexprs = {
        "BM": config.block_m, "BN": config.block_n, "BK": config.block_k,
        "GROUP_M": config.group_m, "MASKED": config.im2col_masked,
    }  # fmt: skip
    signature |= dict.fromkeys(constexprs, "constexpr")
    # Pointers 16-byte aligned; N and K multiples of 16, and C of BK unless masked (checked
    # where matched).
    aligned = (0, 1, 2, 4, 5) + (() if config.im2col_masked else (10,))
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return compile_triton(
        _conv_fn, signature, constexprs, attrs, num_warps=config.num_warps,
        num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip


def sm_count(arch: str) -> int:
    """The persistent kernels' largest grid: the arch's SM count (myelin.platforms)."""
    from myelin.platforms import CUDA_SM_COUNT

    try:
        return CUDA_SM_COUNT[arch]
    except KeyError:
        raise CompileError(
            f"persistent kernels need the SM count of {arch}; known: {', '.join(CUDA_SM_COUNT)}"
        ) from None


_PRIVATE_CACHE_LOCK = threading.Lock()
# One Triton compile at a time per process. Triton parses the kernel's Python source (`ast.parse`)
# at each compile, and CPython 3.11.7's parser is not safe to run in several threads at once:
# kernel nodes compiling concurrently failed with "SystemError: AST constructor recursion depth
# mismatch" (a fresh-clone CI run, 2026-12-06). Compiles take seconds; the build's other nodes
# still run beside them.
_COMPILE_LOCK = threading.Lock()
_private_cache: tempfile.TemporaryDirectory | None = None


def _use_private_cache(triton) -> None:
    """Point Triton's cache at one folder of this process's own, set once and never swapped.

    Builds do not write to the user's ~/.triton (unless TRITON_CACHE_DIR says where to). The
    folder is process-wide and set once because Triton reads it from a process-global knob at
    each compile: setting it around each compile (as an environment variable) let concurrent
    kernel nodes remove or swap one another's folder mid-compile. Triton's file cache writes each
    entry atomically, so compiles in several threads share the one folder safely; the folder
    goes when the process ends."""
    global _private_cache
    with _PRIVATE_CACHE_LOCK:
        if _private_cache is not None or os.environ.get("TRITON_CACHE_DIR"):
            return
        _private_cache = tempfile.TemporaryDirectory(prefix="plex-triton-")
        triton.knobs.cache.dir = _private_cache.name


def compile_triton(
    make_fn,
    signature: dict,
    constexprs: dict,
    attrs: dict,
    *,
    num_warps: int,
    num_stages: int,
    name: str,
    arch: str,
    ptx_version: int = PTX_VERSION,
    scratch_binding: bool = False,
) -> CompiledKernel:
    """One Triton kernel (`make_fn()` returns the jitted function) compiled for `arch` into a
    cubin whose entry is `name` and whose parameters are exactly what IREE passes.

    `scratch_binding`: the kernel may use Triton's global scratch, which then becomes the
    binding after the declared pointers (`CompiledKernel.scratch_bytes` per program)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        raise CompileError(
            'kernels = "triton" needs Triton at build time: pip install -e ".[kernels]" '
            f"(Triton 3.9.0); {e}"
        ) from e
    capability = int(arch.removeprefix("sm_").rstrip("a"))
    source = ASTSource(fn=make_fn(), signature=signature, constexprs=constexprs, attrs=attrs)
    options = {
        "num_warps": num_warps,
        "num_stages": num_stages,
        "ptx_version": ptx_version,
        "enable_fp_fusion": True,  # Triton 3.9's default, said explicitly
    }
    _use_private_cache(triton)
    target = GPUTarget("cuda", capability, 32)
    with _COMPILE_LOCK:
        kernel = triton.compile(source, target=target, options=options)
    meta = kernel.metadata
    global_scratch = int(getattr(meta, "global_scratch_size", 0) or 0)
    profile_scratch = int(getattr(meta, "profile_scratch_size", 0) or 0)
    if scratch_binding and global_scratch and not profile_scratch:
        # Triton addresses program p's scratch at base + p * size (p linear over the grid); its
        # size is a multiple of its alignment, so an aligned base aligns every program's slice.
        align = int(getattr(meta, "global_scratch_align", 1) or 1)
        if global_scratch % align or align & (align - 1):
            raise CompileError(
                f"Triton's global scratch ({global_scratch} B per program, aligned to {align}): "
                "not a whole number of aligned slices"
            )
        ptx = _bind_scratch_param(kernel.asm["ptx"], align)
    else:
        ptx = _drop_scratch_params(
            kernel.asm["ptx"], global_scratch=global_scratch, profile_scratch=profile_scratch
        )
        global_scratch = 0
    ptx = _rename_entry(ptx, meta.name, name)
    cubin = assemble(ptx, arch)
    return CompiledKernel(
        name, cubin, ptx, int(meta.shared), num_warps * 32, global_scratch,
        align if global_scratch else 0,
    )  # fmt: skip


def _entry_params(ptx: str) -> tuple[str, str, str, list[str]]:
    """The PTX split around its `.entry` parameter list: (before, params, brace + body, names)."""
    head, brace, body = ptx.partition("\n{")
    start = head.index(".entry")
    params = head[start:]
    names = re.findall(r"\.param\s+\.\w+\s+(?:\.ptr\s+\.global\s+\.align\s+\d+\s+)?(\w+)", params)
    if len(names) < 2:
        raise CompileError(f"unexpected Triton PTX entry: {params[:200]!r}")
    return head[:start], params, brace + body, names


def _bind_scratch_param(ptx: str, align: int) -> str:
    """Move Triton's `global_scratch` parameter to just after the declared pointers, where IREE
    passes the dispatch's last binding, drop the unused `profile_scratch` after it, and round
    the scratch base up to `align` where the kernel loads it.

    IREE's CUDA HAL launches with the bindings, then the push constants, and nothing after them:
    the scratch must be a binding. PTX names its parameters, so moving the declaration moves
    nothing else. The wrapper gives it a result tensor the size of the grid's scratch plus
    `align`: IREE suballocates transients at its resource offset alignment, which may be less
    than the tensor descriptors' (Triton asks 128 B), so the kernel aligns the base itself."""
    before, params, rest, names = _entry_params(ptx)
    scratch, profile = names[-2:]
    if re.search(rf"\b{profile}\b", rest):
        raise CompileError(f"Triton PTX uses its profile scratch parameter {profile}")
    load = re.compile(rf"^(\s*)ld\.param\.(?:b|u)64\s+(%rd\d+),\s*\[{scratch}\];\s*$", re.M)
    loads = load.findall(rest)
    if len(loads) != 1 or len(re.findall(rf"\b{scratch}\b", rest)) != 1:
        raise CompileError(f"Triton PTX reads its scratch parameter {scratch} other than once")
    indent, reg = loads[0]
    rest = load.sub(
        lambda mt: (
            f"{mt.group(0)}\n{indent}add.s64 \t{reg}, {reg}, {align - 1};"
            f"\n{indent}and.b64 \t{reg}, {reg}, {-align};"
        ),
        rest,
    )
    lines = params.splitlines()
    decls = {n: next(i for i, ln in enumerate(lines) if re.search(rf"\b{n}\b", ln)) for n in names}
    pointers = [n for n in names[:-2] if ".ptr" in lines[decls[n]]]
    leading = names[: len(pointers)]
    if leading != pointers:
        raise CompileError("Triton PTX entry: the pointers are not the first parameters")
    scratch_line = lines[decls[scratch]].strip().rstrip(",")
    kept = [ln for i, ln in enumerate(lines) if i not in (decls[scratch], decls[profile])]
    at = kept.index(lines[decls[leading[-1]]]) + 1
    kept.insert(at, "\t" + scratch_line + ",")
    for i in range(len(kept) - 1, -1, -1):
        if ".param" in kept[i]:
            kept[i] = kept[i].rstrip().rstrip(",")
            break
    return before + "\n".join(kept) + rest


def _drop_scratch_params(ptx: str, *, global_scratch: int, profile_scratch: int) -> str:
    """Remove the two `.u64` scratch parameters Triton appends after the declared ones.

    IREE passes exactly the bindings and push constants; a kernel declaring more parameters
    would read garbage for them. They are dropped only when the kernel never uses them (both
    scratch sizes 0 and the names unreferenced in the body)."""
    if global_scratch or profile_scratch:
        raise CompileError(
            f"the Triton kernel needs scratch memory (global {global_scratch} B, profile "
            f"{profile_scratch} B), which an IREE external dispatch does not provide"
        )
    before, params, rest, names = _entry_params(ptx)
    trailing = names[-2:]
    for name in trailing:
        if re.search(rf"\b{name}\b", rest):
            raise CompileError(f"Triton PTX uses its scratch parameter {name}")
    lines = params.splitlines()
    kept = [ln for ln in lines if not any(re.search(rf"\b{n}\b", ln) for n in trailing)]
    # The parameter before the dropped ones is now last: no trailing comma.
    for i in range(len(kept) - 1, -1, -1):
        if ".param" in kept[i]:
            kept[i] = kept[i].rstrip().rstrip(",")
            break
    return before + "\n".join(kept) + rest


def _rename_entry(ptx: str, old: str, new: str) -> str:
    """The entry takes the kernel's config name: the IREE export names it."""
    return re.sub(rf"\b{re.escape(old)}\b", new, ptx)


def assemble(ptx: str, arch: str) -> bytes:
    """PTX -> cubin with the ptxas Triton ships (no CUDA toolkit needed here). A cubin loads
    without the driver's JIT, so the driver's CUDA version does not bound the PTX's."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(int(arch.removeprefix("sm_").rstrip("a")))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        done = subprocess.run(
            [ptxas.path, f"-arch={arch}", str(src), "-o", str(out)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise CompileError(f"ptxas failed on a Triton kernel: {done.stderr.strip()[:2000]}")
        return out.read_bytes()
