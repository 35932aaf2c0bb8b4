"""Which codec each parameter gets: a package default, ordered glob rules, and the rule that keeps
precise parameters (norms, biases, small tensors) in fp32.

Resolution, for a parameter `scope::key`:
1. a rule whose pattern has no wildcard and names it exactly (`scope::key` or `key`) wins;
2. otherwise precise parameters stay fp32: rank < 2, fewer than PRECISE_MAX_ELEMENTS elements,
   or a norm/bias by name (their error shows up in every activation, their bytes are few);
3. otherwise the last rule whose glob matches `scope::key` or `key` wins (like .gitattributes);
4. otherwise the default (the package's `[weights.<name>] codec`, fp32 without a package).
Every choice carries the reason, so `plex inspect` can say why a parameter has its codec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from myelin.codecs._contract import NO_CODEC

PRECISE_MAX_ELEMENTS = 4096
_PRECISE_NAME = re.compile(r"norm|bias|(^|[._])ln(f|_?[0-9]*)?([._]|$)", re.IGNORECASE)
_FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class CodecRule:
    pattern: str  # a glob over "scope::key" and "key"
    codec: str


@dataclass(frozen=True)
class CodecPolicy:
    """The codec intent for one graph's parameters."""

    default: str = NO_CODEC
    default_from: str = ""  # where the default comes from, for reasons ("weights mlp:params")
    rules: tuple[CodecRule, ...] = ()
    # (codec, what instead, why) for codecs a device of the app cannot decode (`device_limits`):
    # a parameter they would take gets the codec named instead (fp32: none), and the build notes
    # why.
    unsupported: tuple[tuple[str, str, str], ...] = ()

    @property
    def trivial(self) -> bool:
        """True when nothing can be encoded: the build needs no encode step."""
        return self.default == NO_CODEC and all(r.codec == NO_CODEC for r in self.rules)

    def to_json(self) -> dict:
        return {
            "default": self.default,
            "default_from": self.default_from,
            "rules": [[r.pattern, r.codec] for r in self.rules],
            **({"unsupported": [list(u) for u in self.unsupported]} if self.unsupported else {}),
        }


@dataclass(frozen=True)
class Choice:
    codec: str
    reason: str
    not_applied: str = ""  # the codec asked for, where a device cannot decode it (`unsupported`)


def _has_wildcard(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def precise_reason(key: str, dtype: str, shape: tuple[int, ...]) -> str | None:
    """Why a parameter stays fp32 by default, or None if a codec may shrink it."""
    if dtype not in _FLOATS:
        return f"{dtype}, not floating point"
    if len(shape) < 2:
        return f"rank {len(shape)} (norms, biases)"
    count = 1
    for d in shape:
        count *= d
    if count < PRECISE_MAX_ELEMENTS:
        return f"small ({count} elements < {PRECISE_MAX_ELEMENTS})"
    if _PRECISE_NAME.search(key):
        return "a norm or bias by name"
    return None


def choose(scope: str, key: str, dtype: str, shape: tuple[int, ...], policy: CodecPolicy) -> Choice:
    choice = _choose(scope, key, dtype, shape, policy)
    for codec, instead, why in policy.unsupported:
        if _base(choice.codec) == codec:
            reason = f"kept {instead}: {codec}: {why} ({choice.reason})"
            return Choice(instead, reason, choice.codec)
    return choice


def _base(codec: str) -> str:
    return codec.split(":", 1)[0]  # "q4:g32" -> "q4"


# IREE 3.13's SPIR-V pipeline on Vulkan's baseline target (vp_android_baseline_2022: 32-bit
# storage, 16 KiB of workgroup memory) fails to compile a matmul that decodes its weight
# ("uses 32768 bytes of shared memory; exceeded the limit of 16384 bytes", for each of fp16,
# bf16, int8 and q4 on a 128x256 weight) and computes fp16's decode wrong where it does compile
# (a 16x32 weight, on lavapipe). A named target (arch = "ampere") compiles fp16, bf16 and int8;
# q4's decode there did not finish compiling in 5 minutes (the 128x256 weight, 2026-12-06).
_VULKAN_BASELINE_WHY = (
    "IREE 3.13 cannot compile its decode for a vulkan-spirv device without arch (Vulkan's "
    "baseline target: workgroup memory over 16 KiB; fp16 miscomputes); set the device's arch "
    'to its GPU (e.g. "ampere") to keep the codec'
)
_VULKAN_Q4_WHY = (
    "IREE 3.13's SPIR-V pipeline does not finish compiling q4's decode for a vulkan-spirv device"
)


def device_limits(
    devices: Sequence[Any], codecs: Sequence[str]
) -> tuple[tuple[str, str, str], ...]:
    """(codec, what the weight keeps instead, why) for each of `codecs` that a device of the app
    (myelin.compiler.targets.TargetDevice, or a manifest DeviceSpec) cannot decode. Encoded
    weights are the graph's, shared by every variant: one such device decides for all."""
    vulkan = [d for d in devices if d.target == "vulkan-spirv"]
    if not vulkan:
        return ()
    names = sorted({_base(c) for c in codecs} - {NO_CODEC})
    if any(not d.arch for d in vulkan):
        return tuple((c, NO_CODEC, _VULKAN_BASELINE_WHY) for c in names)
    return tuple(("q4", "fp16", _VULKAN_Q4_WHY) for c in names if c == "q4")


def _choose(
    scope: str, key: str, dtype: str, shape: tuple[int, ...], policy: CodecPolicy
) -> Choice:
    names = (f"{scope}::{key}", key)
    matches = [r for r in policy.rules if any(fnmatchcase(n, r.pattern) for n in names)]
    exact = [r for r in matches if not _has_wildcard(r.pattern)]
    if exact:
        rule = exact[-1]
        return Choice(rule.codec, f'[weights.codec] "{rule.pattern}" (exact name)')
    why = precise_reason(key, dtype, shape)
    if why is not None:
        return Choice(NO_CODEC, f"kept fp32: {why}; name it exactly in [weights.codec] to override")
    if matches:
        rule = matches[-1]
        return Choice(rule.codec, f'[weights.codec] "{rule.pattern}"')
    if policy.default != NO_CODEC:
        return Choice(policy.default, f"default of {policy.default_from or 'the package'}")
    return Choice(NO_CODEC, "default")
