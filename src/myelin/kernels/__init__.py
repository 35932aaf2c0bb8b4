"""Kernel libraries for CUDA devices: contractions IREE's codegen does slowly on Hopper, done by
kernels generated at build time and embedded in the module as IREE external dispatches.

`[devices.<gpu>] kernels = "triton"` turns it on for a CUDA device (docs/kernels.md). The
kernels are Triton-generated sm_90a code (wgmma): a variant holding them records the requirement
(`requires.cuda_arch`) and the runtime skips it on a GPU other than compute capability 9.0.
Triton is needed only to build (`pip install -e ".[kernels]"`); the runtime never imports it.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from dataclasses import dataclass

from myelin.errors import CompileError
from myelin.kernels._coverage import coverage_line, left_to_codegen
from myelin.kernels._space import (
    config_from_json,
    config_to_json,
    kernel_entry,
    matmul_space,
    site_key,
    spread_sample,
    tuned_configs,
)
from myelin.kernels._triton import MatmulConfig
from myelin.platforms import KERNEL_LIBRARIES, KERNELS_CUDA_ARCH

__all__ = [
    "ATTENTION_LIBRARY",
    "KERNELS_CUDA_ARCH",
    "KERNEL_LIBRARIES",
    "KernelizedGraph",
    "MatmulConfig",
    "apply_kernels",
    "config_from_json",
    "config_to_json",
    "coverage_line",
    "kernel_entry",
    "left_to_codegen",
    "matmul_space",
    "normalize_contractions",
    "site_key",
    "spread_sample",
    "tuned_configs",
]

# The library value that also rewrites attention (flash for prefill, split-KV for decode; one
# config each, checked on the H200 at the Llama-7B block's shapes).
ATTENTION_LIBRARY = "triton-attention"


@dataclass(frozen=True)
class KernelizedGraph:
    """Imported IR with the matched contractions rewritten to library kernels."""

    module_bytecode: bytes
    # every matmul (where, shape, the kernel or why none), attention op and concat (to_json)
    sites: tuple[dict, ...]
    kernels: tuple[str, ...]  # the kernels embedded, by name


# Shapes where another persistent config than 128x256x64 / 8 warps / 3 stages measured faster
# on the H200 (CUPTI kernel time, each config alone, 2026-12-02; docs/benchmarks.md, "Persistent
# TMA matmuls and the rotary concat"): (B transposed, N, K) -> the knobs that differ. N = 11008
# has 43 column blocks of 256: 128-column tiles split the last wave finer (0.282 vs 0.290 ms;
# cuBLAS 0.260). The other prefill shapes and 8192^3 keep the default (within 0.3%).
_MEASURED_LARGE: dict[tuple[bool, int, int], dict[str, int]] = {
    (True, 11008, 4096): {"block_n": 128, "num_warps": 4, "num_stages": 4},
}


# GEMV shapes (M = 1) where the CUDA-core GEMV kernel (block_m 1) measured faster than every
# tl.dot config and cuBLAS's kernel on the H200, both stored layouts (CUPTI, interleaved,
# 2026-12-02; docs/benchmarks.md, "GEMV configs: the CUDA-core kernel"): (inputs, N, K) -> its
# knobs. f16 1 x 8192 by 28672 x 8192: 0.105-0.108 ms, the 16x32x256 skinny config 0.134 / 0.172.
_MEASURED_GEMV: dict[tuple[str, int, int], dict[str, int]] = {
    ("f16", 28672, 8192): {"block_n": 128, "block_k": 128, "num_warps": 4, "num_stages": 2},
}


# Tiles for a static M whose output grid is small beside the GPU (block_m, block_n, num_warps,
# num_stages, work per unit time relative to 128x256): a smaller tile that puts more SMs to
# work beats the default's one partial wave. The relative rates are a model (wgmma's
# efficiency falls with the tile, per the Triton Hopper tutorials' configs), and the choice is
# the tile with the least estimated time: waves x tile work / rate.
_GRID_TILES = (
    (128, 256, 8, 3, 1.0),
    (128, 128, 4, 4, 0.85),
    (128, 64, 4, 4, 0.7),
    (64, 64, 4, 4, 0.5),
)
# The SMs an sm_90 build plans its waves for: an H100 SXM's and an H200's 132.
_SM_COUNT = 132
# M x N x K below which a matmul keeps the default tile: a few microseconds on any tile, and
# one config for all of them keeps a build's Triton compiles few.
_GRID_MIN_WORK = 1 << 28


def _tile_for_grid(m: int, n: int, k: int) -> dict[str, int]:
    """The knobs of the `_GRID_TILES` tile with the least estimated time for an M x N output:
    ceil(tiles / SMs) waves, each as long as one tile's work over its rate. The default tile
    (no knobs) where it is best, as at the Llama-7B and BERT-base prefill shapes; a narrower
    or shorter one where the default would leave most SMs idle (ResNet-50's late stages: M 392,
    N 512 is 8 tiles of 128x256) or compute columns past N (N = 64)."""
    if m * n * k < _GRID_MIN_WORK:
        return {}
    best: tuple[float, dict[str, int]] | None = None
    for block_m, block_n, warps, stages, rate in _GRID_TILES:
        if block_n > max(64, 1 << (n - 1).bit_length()):
            continue  # wider than N: the columns past it are computed and thrown away
        tiles = -(-m // block_m) * -(-n // block_n)
        estimate = -(-tiles // _SM_COUNT) * block_m * block_n / rate
        if best is None or estimate < best[0]:
            knobs = {"block_m": block_m, "block_n": block_n}
            knobs |= {"num_warps": warps, "num_stages": stages}
            best = (estimate, {} if (block_m, block_n) == (128, 256) else knobs)
    return best[1] if best else {}


def choose_matmul_config(
    dtype: str, out_dtype: str, b_transposed: bool, m: int | None, n: int, k: int
) -> MatmulConfig:
    """The kernel config for one matmul: 128x256x64 tiles, 8 warps, 3 stages (wgmma), as a
    persistent TMA kernel where the result is f16 or bf16 (its C tile, staged in shared memory
    for the TMA store, fits beside the 3 stages; an f32 one does not), or the shape's measured
    winner (`_MEASURED_LARGE`); a static M of at most 16 (decode: one token per sequence) gets
    16-row tiles over narrow column blocks, so that the weight streams through many SMs, or at
    M = 1 the CUDA-core GEMV where it measured fastest (`_MEASURED_GEMV`).

    On the H200 the persistent kernel took 1.451 ms at 8192^3 (cuBLAS 1.456; the same tile not
    persistent 1.486) and 0.90-0.97x cuBLAS's time at the Llama-7B block's prefill shapes,
    where the non-persistent one reached 0.76-0.86x (docs/benchmarks.md, "Persistent TMA
    matmuls and the rotary concat"). 256x128x64 tiles stay slower at those shapes (0.67-0.75x
    cuBLAS's time; earlier inside the block, "Split-KV decode attention and token-major flash
    attention")."""
    if m == 1 and (dtype, n, k) in _MEASURED_GEMV:
        return MatmulConfig(
            dtype, out_dtype, b_transposed, block_m=1, group_m=1, **_MEASURED_GEMV[(dtype, n, k)]
        )
    if m is not None and m <= 16:
        return MatmulConfig(
            dtype=dtype,
            out_dtype=out_dtype,
            b_transposed=b_transposed,
            block_m=16,
            block_n=32,
            block_k=256 if k % 256 == 0 else 64,
            group_m=1,
            num_warps=4,
            num_stages=4,
        )
    persistent = out_dtype in ("f16", "bf16")
    knobs = _MEASURED_LARGE.get((b_transposed, n, k), {}) if persistent else {}
    if not knobs and m is not None:
        knobs = _tile_for_grid(m, n, k)
    return MatmulConfig(
        dtype=dtype,
        out_dtype=out_dtype,
        b_transposed=b_transposed,
        persistent=persistent,
        **knobs,
    )


def apply_kernels(
    module_bytecode: bytes,
    *,
    library: str,
    arch: str = KERNELS_CUDA_ARCH,
    what: str = "graph",
    tuned: Mapping[str, MatmulConfig] | None = None,
) -> KernelizedGraph:
    """Match the graph's matmuls (IR at the `input` phase), compile the kernels they need and
    rewrite them into external dispatches. Ops no kernel covers are left to IREE; every
    contraction is in the sites, matched or not, with the reason.

    `tuned`: configs a tuning package recorded per shape (`site_key`),
    taken before the library's own choice; a site that got one says so in its reason.

    With the "triton-attention" library, `iree_linalg_ext.attention` ops go to the
    flash-attention kernel (prefill) or the split-KV kernels (decode: at most 16 query rows, no
    mask or an additive one) too (docs/kernels.md).

    Both libraries put the q4 kernel (myelin.kernels._q4) in place of the q4 contractions the
    codec gave a kernel form (decode steps, M <= 16: myelin.codecs.q4_kernel_covers), and turn
    a concat of elementwise results into one elementwise op (myelin.kernels._concat: the rotary
    embedding's, which IREE would otherwise compute in parts and copy together)."""
    from myelin.codecs import finalize
    from myelin.compiler.session import CompilerSession
    from myelin.compiler.targets import TargetDevice
    from myelin.errors import CompileError
    from myelin.kernels import (
        _attention,
        _attention_ir,
        _concat,
        _conv,
        _coverage,
        _normalize,
        _q4,
        _rewrite,
        _space,
        _triton,
    )

    if library not in KERNEL_LIBRARIES:
        raise CompileError(
            f"{what}: unknown kernel library {library!r}; known: {', '.join(KERNEL_LIBRARIES)}"
        )
    flags = ["--iree-hal-target-device=cuda"]
    with CompilerSession(flags) as session:
        module = session.parse(module_bytecode, what=what)
        with session.context:
            # the codec's choices for this CUDA device, as its compile would make them, but
            # keeping the q4 kernel forms: no load-time forms are left whose matmuls would be
            # matched for nothing
            finalize(module, [TargetDevice("kernels", target="cuda", arch=arch)], kernel_forms=True)
            # q4 decode-step matmuls first: their fused forms (erased here) hold matmuls too
            q4_sites, q4_kernels = _q4.rewrite_q4(module, arch)
            # linears the frontends lowered to batched forms, as the 2-D matmuls kernels match
            _normalize.linears_as_matmuls(module)
            # 2-D convolutions as a gather and a 2-D matmul (im2col; 1x1 ones without a gather)
            _conv.convs_as_matmuls(module)
            # attention written as batched matmuls around a softmax, as one attention op
            _attention_ir.hand_written_attention(module)
            choose = _space.with_tuned(choose_matmul_config, tuned or {})
            matches = _rewrite.find_matmuls(module, choose)
            if tuned:
                _mark_tuned(matches, tuned)
            configs = {m.config.name: m.config for m in matches if m.config is not None}
            kernels = {name: _triton.compile_matmul(c, arch) for name, c in configs.items()}
            # a merge's tile (staged in shared memory for the epilogue) can take a kernel past
            # what a block may have, which IREE refuses only when the .mln loads: such a
            # kernel keeps its tiles and leaves the merge to IREE
            limit = _space.SHARED_MEMORY_LIMIT
            for m in matches:
                config = m.config
                if config is None or not config.merge:
                    continue
                used = kernels[config.name].shared_bytes
                if used > limit:
                    why = f"its {config.merge} stays IREE's: {used} B of shared memory with it"
                    _rewrite.without_merge(m, why)
                    assert m.config is not None
                    if m.config.name not in kernels:
                        kernels[m.config.name] = _triton.compile_matmul(m.config, arch)
            used_names = {m.config.name for m in matches if m.config is not None}
            kernels = {name: k for name, k in kernels.items() if name in used_names}
            for name, kernel in kernels.items():  # at build time, not when the .mln loads
                if kernel.shared_bytes > limit:
                    raise CompileError(
                        f"{what}: kernel {name} needs {kernel.shared_bytes} B of shared memory, "
                        f"more than the {limit} B of a block; pick another config for it "
                        '([tuning.*] kernels) or build with kernels = "none"'
                    )
            _rewrite.rewrite(module, matches, kernels, session.context)
            sites = [m.site.to_json() for m in matches] + [q.to_json() for q in q4_sites]
            kernels.update(q4_kernels)
            if library == ATTENTION_LIBRARY:
                found = _attention.find_attention(module)
                wanted = {m.config.name: m.config for m in found if m.config is not None}
                compiled = {}
                for c in wanted.values():
                    compiled.update(_attention.compile_kernels(c, arch))
                _attention.rewrite(module, found, compiled)
                kernels.update(compiled)
                sites += [m.site for m in found]
            # every other contraction stays IREE's: listed with why (myelin.kernels._coverage)
            sites += _coverage.unmatched_contractions(module, library)
            # last: the attention rewrite reads the concats of a cache and its new tokens
            # (reported when rewritten: the other concats stay IREE's, as they were)
            sites += [c.to_json() for c in _concat.fuse_concats(module) if c.fused]
            _conv.forget_marks(module)
            if not module.verify():
                raise CompileError(f"{what}: the graph with kernels does not verify (internal)")
            buffer = io.BytesIO()
            module.write_bytecode(buffer)
    return KernelizedGraph(buffer.getvalue(), tuple(sites), tuple(sorted(kernels)))


def normalize_contractions(
    module: str | bytes, what: str = "graph", *, all_convolutions: bool = False
) -> tuple[str, dict[str, int]]:
    """The IR (input phase, text or bytecode) with the rewrites the kernels step makes before it
    matches anything: batched linears as 2-D matmuls (myelin.kernels._normalize), 2-D
    convolutions as a gather and a matmul (myelin.kernels._conv) and attention written by hand
    as one attention op (myelin.kernels._attention_ir); as text, with how many of each. The
    kernels step applies them on CUDA devices; this lets the normal form be compiled for any
    target, to check that it computes what the written form does. `all_convolutions`: f32
    convolutions too (the kernels step rewrites only those a kernel takes, f16 and bf16), so
    that the rewrite can be checked in f32."""
    from myelin.compiler.session import CompilerSession
    from myelin.kernels import _attention_ir, _conv, _normalize

    with CompilerSession(["--iree-hal-target-device=llvm-cpu"]) as session:
        parsed = session.parse(module, what=what)
        with session.context:
            counts = {
                "linears": _normalize.linears_as_matmuls(parsed),
                "convolutions": _conv.convs_as_matmuls(
                    parsed, None if all_convolutions else _conv.KERNEL_DTYPES
                ),
                "attention": _attention_ir.hand_written_attention(parsed),
            }
            _attention_ir.forget_reasons(parsed)
            _conv.forget_marks(parsed)
            if not parsed.verify():
                raise CompileError(f"{what}: the normalized graph does not verify (internal)")
            return str(parsed), counts


def _mark_tuned(matches: list, tuned: Mapping[str, MatmulConfig]) -> None:
    """A site whose config came from the tuning package says so in the report."""
    from myelin.kernels._space import site_key

    for match in matches:
        site = match.site
        m, n, k = site.shape
        op = "matmul_transpose_b" if site.b_transposed else "matmul"
        if site.kernel is not None and site_key(op, site.dtype, site.out_dtype, m, n, k) in tuned:
            match.site = dataclasses.replace(site, reason=f"{site.reason}; tuned config")
