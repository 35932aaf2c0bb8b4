"""Targets and drivers: which IREE compiler target runs on which runtime HAL driver.

One table for the compiler (`myelin.compiler.targets`), the runtime (`myelin.runtime`) and the
manifest schema (`plex.manifest`), whose accepted values are derived from it. Standard library
only: the runtime imports it on devices without the compiler.
"""

from __future__ import annotations

# target -> (HAL device kind in --iree-hal-target-device, drivers that run its code: the first
# is the default)
TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llvm-cpu": ("local", ("local-task", "local-sync")),
    "vmvx": ("local", ("local-task", "local-sync")),
    "cuda": ("cuda", ("cuda",)),
    "vulkan-spirv": ("vulkan", ("vulkan",)),
    "rocm": ("hip", ("hip",)),
    "metal-spirv": ("metal", ("metal",)),
}
DRIVERS: tuple[str, ...] = tuple(dict.fromkeys(d for _, ds in TARGETS.values() for d in ds))
# Drivers whose device memory is the host's: their buffers map into numpy without a copy.
HOST_DRIVERS = frozenset({"local-task", "local-sync"})

# IREE 3.13 has no sm_90 entry in its CUDA target table (see docs/platforms.md); sm_80 PTX is
# JIT-compiled by the driver on Hopper.
DEFAULT_CUDA_ARCH = "sm_80"

# `[devices.<name>] kernels` on a CUDA device: library kernels for the contractions they cover
# (myelin.kernels, docs/kernels.md). Their code is sm_90a, so it runs on compute capability 9.0.
# "triton": matmuls; "triton-attention": matmuls and attention (flash for prefill, split-KV for
# decode: one config each, checked on the H200 at the Llama-7B block's shapes; opt-in until they
# cover more).
KERNEL_LIBRARIES: tuple[str, ...] = ("triton", "triton-attention")
KERNELS_CUDA_ARCH = "sm_90a"
# Streaming multiprocessors per arch, as the kernel library's persistent kernels size their grid:
# min(SM count, output tiles) programs, each looping over every SM-count-th tile. sm_90a: H100 and
# H200 SXM (132). A part with fewer SMs (H100 PCIe: 114) runs the same grid correctly, its extra
# programs waiting for a free SM.
CUDA_SM_COUNT: dict[str, int] = {"sm_90a": 132}

# target -> its options in a manifest's [devices.<name>] and their defaults (None: required)
TARGET_OPTIONS: dict[str, dict[str, str | bool | None]] = {
    # data_tiling "host": the build chooses for the CPU it targets (compiler.targets)
    # compute "host": "f32" (the model's own precision) or "bf16" (compiler.cpu_compute), chosen
    # for the weights' codecs and the CPU (compiler.targets.compute_choice)
    # matmul_tiles "host": "rows" or "iree", chosen for the CPU (compiler.cpu_matmul_tiles)
    # reductions "host": "vector" or "iree", chosen for the CPU (compiler.cpu_reductions)
    # relayout_tiles "host": "whole" or "iree", chosen for the CPU (compiler.cpu_relayout_tiles)
    # conv_batch "host": "images" or "iree", chosen with data tiling (compiler.cpu_convolution)
    "llvm-cpu": {
        "cpu": "host",
        "cpu_features": "",
        "data_tiling": "host",
        "result_storage": False,
        "compute": "host",
        "matmul_tiles": "host",
        "reductions": "host",
        "relayout_tiles": "host",
        "conv_batch": "host",
    },
    "vmvx": {},
    "cuda": {"arch": DEFAULT_CUDA_ARCH, "kernels": "", "result_storage": True},
    # arch: IREE's --iree-vulkan-target ("ampere", "rdna3", "valhall4"...); "" is IREE's
    # baseline (vp_android_baseline_2022: 32-bit storage only, no subgroups), which any Vulkan
    # 1.1 device runs (docs/platforms.md)
    "vulkan-spirv": {"arch": ""},
    "rocm": {"arch": None},
    "metal-spirv": {},
}
assert set(TARGET_OPTIONS) == set(TARGETS)
# llvm-cpu `compute`: the precision of matmul inputs (docs/manifest.md)
CPU_COMPUTE: tuple[str, ...] = ("f32", "bf16")
# llvm-cpu `matmul_tiles`: workgroup tiles of the data-tiled matmuls (docs/platforms.md)
CPU_MATMUL_TILES: tuple[str, ...] = ("rows", "iree")
# llvm-cpu `reductions`: vector tiles and f32 order of the row reductions (docs/platforms.md)
CPU_REDUCTIONS: tuple[str, ...] = ("vector", "iree")
# llvm-cpu `relayout_tiles`: vector tiles of the relayouts between packed matmuls (platforms.md)
CPU_RELAYOUT_TILES: tuple[str, ...] = ("whole", "iree")
# llvm-cpu `conv_batch`: how a batch's 2-D convolutions are compiled (docs/platforms.md)
CPU_CONV_BATCH: tuple[str, ...] = ("images", "iree")


def default_driver(target: str) -> str:
    return TARGETS[target][1][0]
