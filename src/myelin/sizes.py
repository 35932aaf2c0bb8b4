"""Sizes written by people (`"2GiB"`, `"512 MiB"`, `4096`), parsed one way for manifests and
for the runtime's `Instance.load(memory_budget=...)`. Standard library only: the runtime uses it
on devices that have nothing but iree-base-runtime."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in a size such as `"2GiB"`, `"512 MiB"`, `"1.5GB"`, `"4096"` or `4096`.

    Units are case-sensitive (`B`, `KB`, `MB`, `GB`, `TB`, `KiB`, `MiB`, `GiB`, `TiB`); a bare
    number is bytes. Raises ValueError for anything else, negative numbers included.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"a size cannot be negative, got {text}")
        return text
    m = _SIZE.match(text) if isinstance(text, str) else None
    if not m or m.group(2) not in (*_SIZE_UNITS, ""):
        raise ValueError(
            f"invalid size {text!r}; expected a number and a unit such as '2GiB' "
            f"(units: {', '.join(_SIZE_UNITS)})"
        )
    try:
        size = Decimal(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"]
    except InvalidOperation as e:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"invalid size {text!r}") from e
    return int(size)
