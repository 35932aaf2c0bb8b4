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
def cpu_flags() -> frozenset[str]:
    """Codegen-relevant CPU flags of this machine (empty where they cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            if platform.machine() in ("x86_64", "AMD64"):
                return frozenset(flags & _X86_CODEGEN_FLAGS)
            return frozenset(flags)
    return frozenset()


def machine() -> str:
    return platform.machine()
