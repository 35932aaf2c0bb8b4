"""Triton kernels compiled for sm_90a at build time (Triton is a build-time extra: `kernels`).

Nothing here runs at run time: the build embeds each kernel's cubin in the module as an IREE
external executable object, and the runtime only loads it. IREE's CUDA HAL launches a kernel
with exactly its bindings (operands, then results) followed by its i32 push constants, so a
kernel takes its pointers first and its sizes after, and Triton's trailing scratch parameters are
removed from the PTX before it is assembled (`_drop_scratch_params`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from myelin.errors import CompileError

# The PTX ISA the PTX is stamped with: Triton 3.9 stamps its own ptxas's newest (9.4), which only
# a CUDA 13.4 driver could JIT; the body is the same at 8.0 and we assemble it ourselves anyway.
PTX_VERSION = 80


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

    @property
    def name(self) -> str:
        layout = "abt" if self.b_transposed else "ab"
        # The group size is named only when it is neither the default 8 nor 1 (the skinny
        # config's), so the library's own kernels keep their names; the tuning space never
        # pairs group 1 with tall tiles (myelin.kernels._space).
        group = "" if self.group_m in (1, 8) else f"g{self.group_m}"
        return (
            f"plex_matmul_{layout}_{self.dtype}_{self.out_dtype}_"
            f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}s{self.num_stages}"
            f"{group}"
        )


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    cubin: bytes
    ptx: str
    shared_bytes: int  # dynamic shared memory the launch must declare
    threads: int  # threads per block: num_warps * 32


_TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}


def _matmul_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def plex_matmul(
        a_ptr, b_ptr, c_ptr, M, N, K,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        B_T: tl.constexpr,
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
        c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return plex_matmul


def compile_matmul(config: MatmulConfig, arch: str = "sm_90a") -> CompiledKernel:
    """Triton -> PTX (sm_90a: wgmma) -> our ptxas pass -> cubin, with no GPU present."""
    t_in, t_out = _TRITON_TYPES[config.dtype], _TRITON_TYPES[config.out_dtype]
    signature = {
        "a_ptr": f"*{t_in}", "b_ptr": f"*{t_in}", "c_ptr": f"*{t_out}",
        "M": "i32", "N": "i32", "K": "i32",
        "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "GROUP_M": "constexpr",
        "B_T": "constexpr",
    }  # fmt: skip
    constexprs = {
        "BM": config.block_m, "BN": config.block_n, "BK": config.block_k,
        "GROUP_M": config.group_m, "B_T": config.b_transposed,
    }  # fmt: skip
    # Pointers 16-byte aligned, N and K multiples of 16 (checked where the kernel is matched).
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 4, 5)}
    return compile_triton(
        _matmul_fn, signature, constexprs, attrs,
        num_warps=config.num_warps, num_stages=config.num_stages, name=config.name, arch=arch,
    )  # fmt: skip


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
) -> CompiledKernel:
    """One Triton kernel (`make_fn()` returns the jitted function) compiled for `arch` into a
    cubin whose entry is `name` and whose parameters are exactly what IREE passes."""
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
    options = {"num_warps": num_warps, "num_stages": num_stages, "ptx_version": PTX_VERSION}
    with tempfile.TemporaryDirectory() as cache:
        import os

        old = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION")}
        os.environ["TRITON_CACHE_DIR"] = cache  # no writes to the user's ~/.triton
        os.environ["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, said explicitly
        try:
            target = GPUTarget("cuda", capability, 32)
            kernel = triton.compile(source, target=target, options=options)
        finally:
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    meta = kernel.metadata
    ptx = _drop_scratch_params(
        kernel.asm["ptx"],
        global_scratch=int(getattr(meta, "global_scratch_size", 0) or 0),
        profile_scratch=int(getattr(meta, "profile_scratch_size", 0) or 0),
    )
    ptx = _rename_entry(ptx, meta.name, name)
    cubin = assemble(ptx, arch)
    return CompiledKernel(name, cubin, ptx, int(meta.shared), num_warps * 32)


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
    head, brace, body = ptx.partition("\n{")
    start = head.index(".entry")
    params = head[start:]
    names = re.findall(r"\.param\s+\.\w+\s+(?:\.ptr\s+\.global\s+\.align\s+\d+\s+)?(\w+)", params)
    if len(names) < 2:
        raise CompileError(f"unexpected Triton PTX entry: {params[:200]!r}")
    trailing = names[-2:]
    for name in trailing:
        if re.search(rf"\b{name}\b", body):
            raise CompileError(f"Triton PTX uses its scratch parameter {name}")
    lines = params.splitlines()
    kept = [ln for ln in lines if not any(re.search(rf"\b{n}\b", ln) for n in trailing)]
    # The parameter before the dropped ones is now last: no trailing comma.
    for i in range(len(kept) - 1, -1, -1):
        if ".param" in kept[i]:
            kept[i] = kept[i].rstrip().rstrip(",")
            break
    return head[:start] + "\n".join(kept) + brace + body


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
