"""MyeLiN: the runtime that loads and runs .mln artifacts, and the IREE compiler adapter.

The runtime surface (`Instance`, `Model`, `Session`) needs only `iree-base-runtime` and numpy;
the compiler adapter lives in `myelin.compiler` and is imported only by builds. Runtime names
load lazily, so `import myelin.mln` (used by builds and `plex inspect`) starts no IREE runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

from myelin.errors import (
    ArtifactError,
    CompileError,
    DeviceUnavailable,
    EntrypointNotFound,
    InputError,
    MyelinError,
)

_LAZY = {
    "Instance": "myelin.runtime.instance",
    "Model": "myelin.runtime.model",
    "Entrypoint": "myelin.runtime.model",
    "Session": "myelin.runtime.session",
    "ResolvedCall": "myelin.runtime.session",
    "CallError": "myelin.runtime.session",
}

__all__ = [
    "ArtifactError",
    "CallError",
    "CompileError",
    "DeviceUnavailable",
    "Entrypoint",
    "EntrypointNotFound",
    "InputError",
    "Instance",
    "Model",
    "MyelinError",
    "ResolvedCall",
    "Session",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'myelin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
