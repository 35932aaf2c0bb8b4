"""Triton matmul configs as tuning candidates: the space per matmul shape, the constraints
checked before compiling, and the recorded winners a build reads back.

The library's own choice (`choose_matmul_config`) is one config per case; a tuning package can
name another per shape (`[tuning.<name>] kernels = "tuning.json"`: the entries of kind
`KERNEL_ENTRY_KIND`, written by `plex tune`). A shape is the site's op, M (None: dynamic), N, K
and dtypes (`site_key`); an entry for another arch is ignored.

Nothing here imports Triton: the space and its constraints are plain arithmetic, so they are
checked (and tested) without the build-time extra.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterable, Mapping

from myelin.kernels._triton import MatmulConfig

# Dynamic shared memory one block may use on an H100/H200 (sm_90: 227 KiB opt-in; IREE's CUDA
# HAL raises the function's limit to what the dispatch declares).
SHARED_MEMORY_LIMIT = 232_448
# f32 accumulator registers per thread above which the kernel spills (255 registers in all;
# 128x256 tiles on 8 warps, the library's default, use 128).
ACCUMULATORS_PER_THREAD_LIMIT = 128
# An M at most this is "skinny" (decode): its space is the GEMV-shaped one.
SKINNY_M = 16
KERNEL_ENTRY_KIND = "kernel-config"

_ELEMENT_BYTES = {"f16": 2, "bf16": 2}
_OUT_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
# The knobs and their values; the skinny space streams a wide K slice of the weight per block.
_LARGE = {
    "block_m": (64, 128, 256),
    "block_n": (64, 128, 256),
    "block_k": (32, 64, 128),
    "group_m": (4, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
    "persistent": (False, True),
}
_SKINNY = {
    # 1: the CUDA-core GEMV kernel, for M = 1 only (`_gemv_violations`)
    "block_m": (1, 16),
    "block_n": (16, 32, 64, 128, 256),
    "block_k": (64, 128, 256, 512),
    "group_m": (1,),  # one row block: the grouped order has nothing to group
    "num_warps": (2, 4, 8),
    "num_stages": (2, 3, 4, 5, 6),
    # A decode matmul has a few dozen output tiles: a persistent grid would hold as many
    # programs, with nothing to overlap.
    "persistent": (False,),
}
# Where a small budget starts (a seeded sample follows): tile shapes that fill an H200's
# 132 SMs and keep the pipeline full, by the Triton tutorials' Hopper configs; the persistent
# TMA kernels first (the tutorial's persistent matmul: 128x256x64, 3 stages, 8 warps).
_FIRST_LARGE = (
    (128, 256, 64, 8, 8, 3, True),
    (128, 256, 64, 8, 8, 3, False),
    (128, 256, 64, 16, 8, 3, True),
    (128, 128, 64, 8, 8, 4, True),
    (128, 128, 64, 8, 4, 4, True),
    (128, 256, 64, 8, 8, 4, False),
    (256, 128, 64, 8, 8, 3, False),
    (128, 128, 64, 8, 4, 4, False),
)
_FIRST_SKINNY = (
    # the CUDA-core GEMV that beat cuBLAS's kernel at 1 x 8192 by 28672 x 8192 on the H200
    (1, 128, 128, 1, 4, 2, False),
    (16, 64, 256, 1, 4, 4, False),
    (16, 128, 128, 1, 4, 4, False),
    (16, 32, 512, 1, 4, 3, False),
    (16, 64, 512, 1, 4, 3, False),
    (16, 128, 256, 1, 8, 3, False),
    (16, 16, 512, 1, 2, 4, False),
)
KNOBS = tuple(_LARGE)


def site_key(op: str, dtype: str, out_dtype: str, m: int | None, n: int, k: int) -> str:
    """The shape a config is recorded for: `matmul_transpose_b f16->f16 M=8 N=4096 K=4096`."""
    return f"{op} {dtype}->{out_dtype} M={'?' if m is None else m} N={n} K={k}"


def shared_bytes(config: MatmulConfig) -> int:
    """The pipeline's shared memory: one A and one B tile per stage (what Triton 3.9 reported for
    128x256x64 with 3 stages: 147 456 B), and for a persistent kernel the C tile its TMA store
    goes through (Triton 3.9: 213 016 B at 128x256x64, 3 stages, f16 out; the estimate is 24 B
    short of it, its barriers)."""
    per = _ELEMENT_BYTES[config.dtype]
    pipeline = config.num_stages * (config.block_m + config.block_n) * config.block_k * per
    if config.persistent:
        pipeline += config.block_m * config.block_n * _OUT_BYTES[config.out_dtype]
    return pipeline


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def violations(config: MatmulConfig, m: int | None, n: int, k: int) -> list[str]:
    """Why this config cannot (or should not) run this shape; empty: it may be compiled.

    Checked before compiling because Triton compiles some of these anyway: a tile wider than the
    shared memory fails only at launch, too many accumulators spill."""
    why = []
    if config.dtype not in _ELEMENT_BYTES:
        why.append(f"inputs {config.dtype}: kernels take f16 or bf16")
        return why
    gemv = config.block_m == 1  # the CUDA-core GEMV kernel: one row of A per program
    for knob in ("block_n", "block_k") if gemv else ("block_m", "block_n", "block_k"):
        value = getattr(config, knob)
        if value < 16 or value & (value - 1):
            why.append(f"{knob} = {value}: a power of two >= 16 (tl.dot's tiles)")
    if why:
        return why
    if gemv:
        return why + _gemv_violations(config, m, n, k)
    if k % config.block_k:
        why.append(f"K = {k} is not a multiple of block_k = {config.block_k} (no K masks)")
    if n % 16:
        why.append(f"N = {n} is not a multiple of 16 (16-byte rows)")
    if config.block_n > _pow2_at_least(n):
        why.append(f"block_n = {config.block_n} is wider than N = {n}")
    if m is not None and config.block_m > max(16, _pow2_at_least(m)):
        why.append(f"block_m = {config.block_m} is taller than M = {m}")
    smem = shared_bytes(config)
    if smem > SHARED_MEMORY_LIMIT:
        why.append(f"{smem} B of shared memory > the {SHARED_MEMORY_LIMIT} B of an sm_90 block")
    threads = config.num_warps * 32
    accumulators = config.block_m * config.block_n // threads
    if accumulators > ACCUMULATORS_PER_THREAD_LIMIT:
        why.append(
            f"{accumulators} f32 accumulators per thread > {ACCUMULATORS_PER_THREAD_LIMIT} (spills)"
        )
    if config.block_m * config.block_n < config.num_warps * 16 * 8:
        why.append(
            f"{config.num_warps} warps for a {config.block_m}x{config.block_n} tile: idle warps"
        )
    if config.num_stages < 2:
        why.append("num_stages < 2: no pipelining")
    if config.block_m > SKINNY_M and config.group_m == 1:
        why.append("group_m = 1 with tall tiles: use 4, 8 or 16 (group 1 keeps the name of 8)")
    if config.persistent and m is not None and m <= SKINNY_M:
        # Even where N gives hundreds of column tiles (28672 in 64-column tiles: 448), the
        # persistent TMA GEMV lost to the non-persistent one on the H200 (0.117-0.143 vs
        # 0.108-0.112 ms; docs/benchmarks.md, "GEMV configs: the CUDA-core kernel").
        why.append(f"persistent with M = {m}: a decode matmul has too few tiles to loop over")
    return why


def _gemv_violations(config: MatmulConfig, m: int | None, n: int, k: int) -> list[str]:
    """The CUDA-core GEMV kernel's constraints (block_m = 1): it re-reads the weight per row of
    A, so it takes M = 1 only; its per-lane accumulators are the B tile over the threads."""
    why = []
    if m != 1:
        why.append(f"block_m = 1 (the CUDA-core GEMV) with M = {m}: it takes M = 1 only")
    if config.persistent:
        why.append("block_m = 1: the CUDA-core GEMV is not persistent")
    if k % config.block_k:
        why.append(f"K = {k} is not a multiple of block_k = {config.block_k} (no K masks)")
    if n % 16:
        why.append(f"N = {n} is not a multiple of 16 (16-byte rows)")
    if config.block_n > _pow2_at_least(n):
        why.append(f"block_n = {config.block_n} is wider than N = {n}")
    smem = config.num_stages * config.block_n * config.block_k * _ELEMENT_BYTES[config.dtype]
    if smem > SHARED_MEMORY_LIMIT:
        why.append(f"{smem} B of shared memory > the {SHARED_MEMORY_LIMIT} B of an sm_90 block")
    accumulators = config.block_n * config.block_k // (config.num_warps * 32)
    if accumulators > ACCUMULATORS_PER_THREAD_LIMIT:
        why.append(
            f"{accumulators} f32 accumulators per thread > {ACCUMULATORS_PER_THREAD_LIMIT} (spills)"
        )
    if config.group_m != 1:
        why.append("block_m = 1 has one row block per column block: group_m = 1")
    if config.num_stages < 2:
        why.append("num_stages < 2: no pipelining")
    return why


def matmul_space(
    dtype: str, out_dtype: str, b_transposed: bool, m: int | None, n: int, k: int
) -> list[MatmulConfig]:
    """Every config of the shape's space that passes `violations` (skinny M: the GEMV-shaped
    space), in a fixed order."""
    knobs = _SKINNY if m is not None and m <= SKINNY_M else _LARGE
    found = []
    for values in itertools.product(*(knobs[name] for name in KNOBS)):
        config = MatmulConfig(
            dtype, out_dtype, b_transposed, **dict(zip(KNOBS, values, strict=True))
        )
        if not violations(config, m, n, k):
            found.append(config)
    return found


def config_to_json(config: MatmulConfig) -> dict:
    return {name: getattr(config, name) for name in KNOBS}


def config_from_json(data: Mapping, dtype: str, out_dtype: str, b_transposed: bool) -> MatmulConfig:
    """A config as `config_to_json` wrote it; `persistent` may be absent (databases written
    before it was a knob: not persistent)."""
    unknown = set(data) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown kernel config fields {sorted(unknown)}; known: {list(KNOBS)}")
    values = {k: bool(v) if k == "persistent" else int(v) for k, v in data.items()}
    return MatmulConfig(dtype, out_dtype, b_transposed, **values)


def kernel_entry(
    op: str,
    dtype: str,
    out_dtype: str,
    m: int | None,
    n: int,
    k: int,
    config: MatmulConfig,
    *,
    arch: str,
    triton: str,
    iree: str,
    **measured,
) -> dict:
    """One tuning.json entry recording the winning config of a shape (what `tuned_configs`
    reads back); `measured` carries the trials and times."""
    return {
        "kind": KERNEL_ENTRY_KIND,
        "library": "triton",
        "op": op,
        "dtype": dtype,
        "out_dtype": out_dtype,
        "layout": "abt" if op == "matmul_transpose_b" else "ab",
        "m": m,
        "n": n,
        "k": k,
        "arch": arch,
        "triton": triton,
        "iree": iree,
        "config": config_to_json(config),
        **measured,
    }


def tuned_configs(
    database_text: str, arch: str, what: str = "tuning.json"
) -> dict[str, MatmulConfig]:
    """The recorded kernel configs of a tuning database for `arch`, by `site_key`. An entry where
    the library's own config won (`kept: false`) names none, so a later library default is not
    pinned to the old one. A config that breaks its shape's constraints is an error naming the
    entry (a hand edit, or another version's space)."""
    data = json.loads(database_text)
    found: dict[str, MatmulConfig] = {}
    for name, entry in sorted(data.get("entries", {}).items()):
        if entry.get("kind") != KERNEL_ENTRY_KIND or entry.get("arch") != arch:
            continue
        if entry.get("kept") is False:  # the library's config won: its current choice applies
            continue
        op, m, n, k = entry["op"], entry["m"], entry["n"], entry["k"]
        try:
            config = config_from_json(
                entry["config"], entry["dtype"], entry["out_dtype"], op == "matmul_transpose_b"
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{what}: entry {name}: bad kernel config: {e}") from e
        why = violations(config, m, n, k)
        if why:
            raise ValueError(f"{what}: entry {name}: config {config.name} is invalid: {why[0]}")
        found[site_key(op, entry["dtype"], entry["out_dtype"], m, n, k)] = config
    return found


def with_tuned(
    choose: Callable[[str, str, bool, int | None, int, int], MatmulConfig],
    tuned: Mapping[str, MatmulConfig],
) -> Callable[[str, str, bool, int | None, int, int], MatmulConfig]:
    """`choose` with the recorded configs first: a shape the tuning package names gets its
    config, any other the library's own."""

    def chosen(dtype, out_dtype, b_transposed, m, n, k) -> MatmulConfig:
        op = "matmul_transpose_b" if b_transposed else "matmul"
        key = site_key(op, dtype, out_dtype, m, n, k)
        if key in tuned:
            return tuned[key]
        return choose(dtype, out_dtype, b_transposed, m, n, k)

    return chosen


def spread_sample(configs: Iterable[MatmulConfig], count: int, seed: int = 0) -> list[MatmulConfig]:
    """`count` configs of the space: the valid ones of the Hopper starting points first, then a
    seeded sample, one per tile shape (block_m, block_n, block_k) in turn, so that a small
    budget sees different tiles rather than one tile's stage counts."""
    pool = list(configs)
    firsts = {_knobs(c) for c in pool}
    known = [f for f in (*_FIRST_LARGE, *_FIRST_SKINNY) if f in firsts]
    picked = [c for f in known for c in pool if _knobs(c) == f][:count]
    rng = random.Random(seed)
    groups: dict[tuple, list[MatmulConfig]] = {}
    for c in pool:
        if c not in picked:
            groups.setdefault((c.block_m, c.block_n, c.block_k), []).append(c)
    order = sorted(groups)
    rng.shuffle(order)
    for tile in order:
        rng.shuffle(groups[tile])
    while len(picked) < count and any(groups[t] for t in order):
        for tile in order:
            if groups[tile] and len(picked) < count:
                picked.append(groups[tile].pop())
    return picked


def _knobs(c: MatmulConfig) -> tuple[int | bool, ...]:
    return tuple(getattr(c, name) for name in KNOBS)
