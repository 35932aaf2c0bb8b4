"""MyeLiN: the runtime that loads and runs .mln artifacts, and the IREE compiler adapter.

The runtime surface (`Instance`, `Model`, `Session`) needs only `iree-base-runtime` and numpy;
the compiler adapter lives in `myelin.compiler` and is imported only by builds.
"""

from myelin.errors import (
    ArtifactError,
    CompileError,
    DeviceUnavailable,
    EntrypointNotFound,
    InputError,
    MyelinError,
)
from myelin.runtime.instance import Instance
from myelin.runtime.model import Entrypoint, Model
from myelin.runtime.session import CallError, ResolvedCall, Session

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
