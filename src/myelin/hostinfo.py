"""What this machine's CPU can execute, for matching artifacts built with `cpu = "host"`.

A module compiled for the build machine's CPU may use instructions another CPU lacks and would
die with SIGILL; the build records the features it relied on and the runtime refuses a variant
whose features this CPU does not have, instead of crashing.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# x86 feature flags (as /proc/cpuinfo spells them) that LLVM's host CPU model may use for codegen.
_X86_CODEGEN_FLAGS = frozenset(
    {
        "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "popcnt",
        "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
        "avx512_fp16", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
        "avx512_vpopcntdq", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    }
)  # fmt: skip


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (none where there is no such file)."""
    fields: dict[str, str] = {}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return fields
    for line in lines:
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what the platform module knows."""
    return cpuinfo().get("model name") or platform.processor() or platform.machine()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """Codegen-relevant CPU flags of this machine (empty where they cannot be read)."""
    fields = cpuinfo()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    if platform.machine() in ("x86_64", "AMD64"):
        return frozenset(flags & _X86_CODEGEN_FLAGS)
    return frozenset(flags)


# AMD's x86 family 25 models that are Zen 4 (the family's others are Zen 3), as LLVM's host
# detection tells them apart.
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x75), range(0x78, 0x7C), range(0xA0, 0xB0))


def llvm_cpu() -> str | None:
    """LLVM's name for this machine's CPU where the build tunes for the generation: AMD Zen 3,
    Zen 4 and Zen 5 ("znver3" ... "znver5"), by x86 family and model as LLVM's host detection
    names them; None for any other. A VM can report a bare "AMD EPYC" for all three, and Zen 4
    runs a 512-bit operation in two halves where Zen 5 has whole 512-bit units."""
    fields = cpuinfo()
    if fields.get("vendor_id") != "AuthenticAMD":
        return None
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return None
    if family == 26:
        return "znver5"
    if family == 25:
        return "znver4" if any(model in r for r in _ZEN4_MODELS) else "znver3"
    return None


def machine() -> str:
    return platform.machine()


def cuda_compute_capability(ordinal: int = 0) -> tuple[int, int] | None:
    """(major, minor) of this machine's CUDA GPU `ordinal`, read from the driver library
    (libcuda, which IREE's CUDA driver loads anyway); None without a driver or GPU.

    The runtime compares it with a variant's `requires.cuda_arch`: sm_90a code (library kernels)
    loads only on compute capability 9.0 and would fail at module load elsewhere."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device = ctypes.c_int()
    major, minor = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
    if cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) != 0:
        return None
    return major.value, minor.value


def cuda_arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code for `arch` runs on a GPU of `capability`: `sm_XYa` (arch-specific features
    such as wgmma) on X.Y exactly, plain `sm_XY` on X.Y and later (as PTX JIT or cubin)."""
    digits = arch.removeprefix("sm_").rstrip("a")
    wanted = (int(digits[:-1]), int(digits[-1]))
    return capability == wanted if arch.endswith("a") else capability >= wanted
