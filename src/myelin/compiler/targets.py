"""Compiler targets as policy: a named device description turns into IREE compiler flags.

Compiler targets and runtime drivers are independent: a device says which code to generate
(`target`) and which HAL driver runs it (`driver`); only the first reaches the compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from myelin import hostinfo
from myelin.errors import CompileError
from myelin.platforms import DEFAULT_CUDA_ARCH, TARGETS

# CUDA archs IREE 3.13 names but cannot generate code for: the compiler fails deep in codegen
# with "missing GPU target in #hal.executable.target" (docs/platforms.md), so they are refused
# up front.
UNSUPPORTED_CUDA_ARCHS = frozenset({"sm_90", "sm_90a", "sm_100", "sm_100a"})


@dataclass(frozen=True)
class TargetDevice:
    """What the compiler needs to know about one named device."""

    name: str
    target: str = "llvm-cpu"
    cpu: str | None = None  # llvm-cpu: "host", "generic" or an LLVM CPU name
    cpu_features: str | None = None
    arch: str | None = None  # cuda: sm_XX; rocm: gfxNNNN; vulkan-spirv: --iree-vulkan-target
    # llvm-cpu: IREE's data tiling (--iree-global-opt-data-tiling) packs each matmul weight into
    # its kernel's tile layout; apps leave it to the host by default (data_tiling_choice). The
    # packed copies live in memory beside the mapped parameters (+45 MiB anonymous RSS on
    # MiniLM's 40.5 MiB of matrices), and an encoded matmul weight is decoded into them at load
    # (myelin.codecs._loadtime).
    data_tiling: bool = False
    # storage twins `f$into` for DLPack-exportable device results (myelin.compiler.storage_twins)
    result_storage: bool = False
    # llvm-cpu: "f32" computes as the model is written; "bf16" rounds the inputs of every
    # matmul to bf16 (myelin.compiler.cpu_compute); apps leave it to the build, which chooses
    # bf16 only for q4 weights on an AVX512-BF16 CPU (compute_choice)
    compute: str = "f32"
    # llvm-cpu under data tiling: the workgroup tiles of the packed f32 matmuls, "iree" (IREE's
    # own) or "rows" (all activation rows, two weight tiles: myelin.compiler.cpu_matmul_tiles);
    # apps leave it to the host by default (matmul_tiles_choice)
    matmul_tiles: str = "iree"
    # llvm-cpu: row reductions, "iree" (IREE's vector tiles, f32 sums in order) or "vector"
    # (reassociated, 2 x 64 vector tiles: myelin.compiler.cpu_reductions); apps leave it to the
    # host by default (reductions_choice)
    reductions: str = "iree"
    # llvm-cpu under data tiling: the vector tiles of the unpack -> elementwise -> pack
    # dispatches between packed matmuls, "iree" (IREE's own) or "whole" (whole 16 x 16 tiles:
    # myelin.compiler.cpu_relayout_tiles); apps leave it to the host (relayout_tiles_choice)
    relayout_tiles: str = "iree"
    # llvm-cpu under data tiling: a batch's 2-D convolutions, "iree" (IREE's im2col over the
    # batch) or "images" (one image at a time with the elementwise ops after each:
    # myelin.compiler.cpu_convolution); apps leave it to the build (conv_batch_choice)
    conv_batch: str = "iree"


# llvm-cpu data tiling. The hoisting limit is raised so that an encoded weight's decode (4x
# the bytes for int8) is hoisted with its pack into one initializer, run at load
# (myelin.codecs._loadtime); IREE's default, 1 MiB of growth per hoisted value, keeps MiniLM's
# encoded matrices per call. fp32 weights grow by nothing when packed and hoist either way.
# IREE's im2col rewrite of 2-D convolutions rides along: the packed matmul kernels then take
# them. HF ResNet-50 at batch 1 (1 thread, 2026-12-06): 403 ms -> 80 ms, 0.28x -> 1.42x torch.
DATA_TILING_FLAGS = (
    "--iree-global-opt-data-tiling",
    f"--iree-opt-const-expr-max-size-increase-threshold={1 << 40}",
    "--iree-global-opt-use-im2col-for-convs",
)


# llvm-cpu `reductions = "vector"`: f32 reductions may be reassociated, lane-wise partial sums
# (myelin.compiler.cpu_reductions edits their vector tiles)
REASSOCIATE_FLAG = "--iree-llvmcpu-reassociate-fp-reductions=true"


# vulkan-spirv without arch: IREE's baseline target (SPIR-V 1.3, no subgroups, 32-bit storage,
# 16 KiB of workgroup memory) plus 64-bit floats and integers. Without Float64 a torch LayerNorm
# fails to compile ("failed to legalize operation 'arith.constant' ... f64": its eps is an f64
# scalar, and PLeX keeps f64 as the model wrote it). Desktop Vulkan drivers have both (Mesa's
# lavapipe, NVIDIA, AMD, Intel); a GPU without them (most mobile ones) names its arch. A named
# arch is not used for lavapipe: its code assumes the GPU's subgroup size (32 for "ampere"), and
# on lavapipe (8) the MLP's results came out wrong.
VULKAN_BASELINE_FEATURES = "spirv:v1.3,cap:Shader,cap:Float64,cap:Int64"


@dataclass(frozen=True)
class HostChoice:
    """An option the build chose for the CPU it targets (an app left it unset): the value and
    why, recorded in the artifact and shown by `plex inspect`."""

    value: bool | str
    reason: str


def data_tiling_choice(cpu: str | None, cpu_features: str | None) -> HostChoice:
    """Data tiling where it was measured to pay: x86-64 with AVX-512, IREE's AVX-512 mmt4d
    microkernels. There the ViT feed-forward block ran 8x faster (0.19x torch -> 1.6x) and
    attention, decomposed into matmuls (myelin.compiler.cpu_attention), 30x (docs/platforms.md,
    "CPU defaults"). On an AVX2 host MiniLM ran no faster with it (0.93-0.99x) while its packed
    copies cost memory, and arm64 is unmeasured: both stay off. A named LLVM CPU (`znver4`) is
    not looked up: off, and the app pins `data_tiling` to choose."""
    if "+avx512f" in (cpu_features or "").split(","):
        return HostChoice(True, "cpu_features has AVX-512: IREE's AVX-512 matmul microkernels")
    if (cpu or "host") != "host":
        return HostChoice(False, f"cpu {cpu!r} is not looked up")
    if hostinfo.machine() in ("x86_64", "AMD64") and "avx512f" in hostinfo.cpu_flags():
        return HostChoice(True, "AVX-512 host: IREE's AVX-512 matmul microkernels")
    return HostChoice(False, "no AVX-512 on this host: packing measured no faster without it")


def _not_packed_avx512(
    data_tiling: bool, cpu: str | None, cpu_features: str | None, what: str
) -> HostChoice | None:
    """IREE's own choice, with why, where the packed `what` of an AVX-512 host (data tiling on
    an x86-64 AVX-512 CPU, as data_tiling_choice reads it) are not there: the host-chosen CPU
    tiles were measured there only."""
    if not data_tiling:
        return HostChoice("iree", f"no data tiling: no packed {what}")
    if not data_tiling_choice(cpu, cpu_features).value:
        return HostChoice("iree", "not an AVX-512 host: unmeasured there")
    return None


def matmul_tiles_choice(data_tiling: bool, cpu: str | None, cpu_features: str | None) -> HostChoice:
    """ "rows" where the packed matmuls run IREE's AVX-512 kernels (data tiling on an x86-64
    AVX-512 CPU, as data_tiling_choice reads it): BERT-base at 128 tokens, 1 thread, ran in
    0.86-0.92x the time of IREE's own tiles on a Zen 5 core (myelin.compiler.cpu_matmul_tiles).
    Without data tiling there are no packed matmuls to tile; elsewhere it is unmeasured."""
    not_packed = _not_packed_avx512(data_tiling, cpu, cpu_features, "matmuls")
    if not_packed is not None:
        return not_packed
    return HostChoice(
        "rows",
        "AVX-512 packed matmuls: a workgroup takes all activation rows, each weight tile is "
        "read once per call",
    )


def relayout_tiles_choice(
    data_tiling: bool, cpu: str | None, cpu_features: str | None
) -> HostChoice:
    """ "whole" where data tiling packs the matmuls on an x86-64 AVX-512 CPU (as
    data_tiling_choice reads it), where it was measured: BERT-base's per-head relayouts took a
    quarter of their time on a Zen 5 core (myelin.compiler.cpu_relayout_tiles). Without data
    tiling there are no relayouts between packed matmuls; elsewhere it is unmeasured."""
    not_packed = _not_packed_avx512(data_tiling, cpu, cpu_features, "relayouts")
    if not_packed is not None:
        return not_packed
    return HostChoice(
        "whole",
        "AVX-512 relayouts between packed matmuls: whole 16 x 16 vector tiles, "
        "transposed in registers",
    )


def conv_batch_choice(data_tiling: bool) -> HostChoice:
    """ "images" wherever data tiling packs the matmuls: IREE 3.13 packs an NCHW convolution's
    im2col product only at batch 1, so a batch runs one image at a time, each product packed
    (ResNet-50 at batch 16, 1 thread: 2.3x faster, then 0.89x that time with the elementwise
    ops after each convolution split with it; Segformer-b0 0.80x with its depthwise ones
    split too: myelin.compiler.cpu_convolution). Without data tiling no product is packed
    either way."""
    if not data_tiling:
        return HostChoice("iree", "no data tiling: no packed convolutions")
    return HostChoice(
        "images",
        "data tiling packs an NCHW convolution's product only at batch 1: a batch of up to "
        "16 runs one image at a time, with the elementwise ops after each convolution",
    )


def reductions_choice(cpu: str | None, cpu_features: str | None) -> HostChoice:
    """ "vector" on an x86-64 AVX-512 CPU (as data_tiling_choice reads it), where it was
    measured: BERT-base's softmax and layer norms took ~15% less time on a Zen 5 core
    (myelin.compiler.cpu_reductions). Its 2 x 64 tile fills 8 of AVX-512's 32 vector
    registers; elsewhere it is unmeasured."""
    if not data_tiling_choice(cpu, cpu_features).value:
        return HostChoice("iree", "not an AVX-512 host: unmeasured there")
    return HostChoice(
        "vector",
        "AVX-512 row reductions: reassociated f32 sums, 2 x 64-element vector tiles",
    )


# Weight codecs coarser than bf16 activations: a model whose every encoded weight is one of
# these loses nothing measurable when its matmul inputs are rounded to bf16. An int8 weight's
# error (half a step of its row's scale, ~1% of a typical weight) is several times bf16's
# rounding (2^-9), and both codecs' decode kernels already round the activation to 8 bits per
# group, as llama.cpp's Q4_0 / Q8_0 dot products do (docs/llm.md, "Weight codecs and dtype").
BF16_COMPUTE_CODECS = ("q4", "int8")


def _has_bf16(cpu: str | None, cpu_features: str | None) -> bool:
    """AVX512-BF16 dot products, as data_tiling_choice reads the target CPU."""
    if "+avx512bf16" in (cpu_features or "").split(","):
        return True
    if (cpu or "host") != "host":
        return False
    return hostinfo.machine() in ("x86_64", "AMD64") and "avx512_bf16" in hostinfo.cpu_flags()


def compute_choice(
    data_tiling: bool, coarse_weights: bool, cpu: str | None, cpu_features: str | None
) -> HostChoice | None:
    """ "bf16" where a model's encoded weights are all coarser than bf16 (BF16_COMPUTE_CODECS)
    and its packed matmuls have AVX512-BF16 dot products: a TinyLlama-1.1B's 128-token
    prefill ran 1.62x faster on a Zen 5 core with q4 weights, 1.71x on a Zen 4 core with int8
    (myelin.compiler.cpu_compute). None where the
    weights are not all coarse: the model's own precision, nothing to choose."""
    if not coarse_weights:
        return None
    if not data_tiling:
        return HostChoice("f32", "no data tiling: no packed bf16 matmuls")
    if not _has_bf16(cpu, cpu_features):
        return HostChoice("f32", "no AVX512-BF16: bf16 inputs would be widened again")
    return HostChoice(
        "bf16",
        f"every encoded weight is {' or '.join(BF16_COMPUTE_CODECS)}, coarser than bf16: "
        "matmul inputs rounded to bf16 run "
        'AVX512-BF16 dot products (pin compute = "f32" to keep f32 inputs)',
    )


def _device_flags(device: TargetDevice) -> list[str]:
    if device.target not in TARGETS:
        raise CompileError(
            f"device '{device.name}': unknown target {device.target!r}; "
            f"accepted: {', '.join(TARGETS)}"
        )
    flags: list[str] = []
    if device.target in ("llvm-cpu", "vmvx"):
        flags.append(f"--iree-hal-local-target-device-backends={device.target}")
        if device.target == "llvm-cpu":
            flags.append(f"--iree-llvmcpu-target-cpu={device.cpu or 'host'}")
            if device.cpu_features:
                flags.append(f"--iree-llvmcpu-target-cpu-features={device.cpu_features}")
            if device.data_tiling:
                flags += DATA_TILING_FLAGS
            if device.reductions == "vector":
                flags.append(REASSOCIATE_FLAG)
    elif device.target == "cuda":
        arch = device.arch or DEFAULT_CUDA_ARCH
        if arch in UNSUPPORTED_CUDA_ARCHS:
            raise CompileError(
                f"device '{device.name}': IREE 3.13 cannot generate code for CUDA arch {arch} "
                f'(no entry in its target table); use arch = "{DEFAULT_CUDA_ARCH}", whose PTX '
                "the NVIDIA driver compiles for Hopper and newer GPUs"
            )
        flags.append(f"--iree-cuda-target={arch}")
    elif device.target == "vulkan-spirv":
        if device.arch:
            flags.append(f"--iree-vulkan-target={device.arch}")
        else:
            flags.append(f"--iree-vulkan-target-features={VULKAN_BASELINE_FEATURES}")
    elif device.target == "rocm":
        if not device.arch:
            raise CompileError(f"device '{device.name}': a rocm target needs arch, e.g. gfx942")
        flags.append(f"--iree-rocm-target={device.arch}")  # 3.13 has no --iree-hip-target
    return flags


def target_flags(devices: Sequence[TargetDevice]) -> list[str]:
    """Flags selecting the HAL target devices of one variant.

    One device compiles for the plain device kind; several get named devices
    (`name=kind[ordinal]`) so that placement can refer to them by name.
    """
    if not devices:
        raise CompileError("a variant needs at least one device")
    flags: list[str] = []
    if len(devices) == 1:
        flags.append(f"--iree-hal-target-device={TARGETS[_known(devices[0])][0]}")
    else:
        ordinals: dict[str, int] = {}
        for d in devices:
            kind = TARGETS[_known(d)][0]
            n = ordinals.get(kind, 0)
            ordinals[kind] = n + 1
            flags.append(f"--iree-hal-target-device={d.name}={kind}[{n}]")
    _check_one_cuda_arch(devices)
    seen: set[str] = set()
    for d in devices:
        for f in _device_flags(d):
            if f not in seen:
                seen.add(f)
                flags.append(f)
    return flags


def _known(device: TargetDevice) -> str:
    if device.target not in TARGETS:
        raise CompileError(
            f"device '{device.name}': unknown target {device.target!r}; "
            f"accepted: {', '.join(TARGETS)}"
        )
    return device.target


def _check_one_cuda_arch(devices: Sequence[TargetDevice]) -> None:
    """Refuse CUDA devices of one variant with different archs: IREE 3.13 takes one
    --iree-cuda-target per compile, so one of the archs would be silently ignored."""
    archs = {d.name: d.arch or DEFAULT_CUDA_ARCH for d in devices if d.target == "cuda"}
    if len(set(archs.values())) > 1:
        listed = ", ".join(f"'{name}' {arch}" for name, arch in archs.items())
        raise CompileError(
            f"the CUDA devices of one variant need one arch (IREE compiles a module for one "
            f"CUDA target), got {listed}; give them the same arch, or put them in two variants"
        )
