"""One tuning spec per process at a time: IREE 3.13 keeps `--iree-codegen-tuning-spec-path` in
process-wide options, so a session that sets it changes it for every session after it and for
those compiling concurrently in other threads (verified: a compile without the flag, after one
with it, still loaded the first spec). Every compile therefore names its spec explicitly (the
empty value means none), and compiles that name different specs never overlap; compiles with
the same spec (the usual case: none) still run concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SPEC_PATH_FLAG = "--iree-codegen-tuning-spec-path"

_condition = threading.Condition()
_current: str | None = None
_holders = 0


@contextmanager
def process_wide_spec(flags: Sequence[str]) -> Iterator[list[str]]:
    """Hold the process's tuning-spec option for a compile with `flags`; yields the flags to
    open its session with (the spec path always set, to the given one or to none)."""
    global _current, _holders
    prefix = f"{SPEC_PATH_FLAG}="
    value = next((f[len(prefix) :] for f in reversed(flags) if f.startswith(prefix)), "")
    with _condition:
        while _holders and _current != value:
            _condition.wait()
        _current = value
        _holders += 1
    try:
        yield [*(f for f in flags if not f.startswith(prefix)), f"{prefix}{value}"]
    finally:
        with _condition:
            _holders -= 1
            _condition.notify_all()
