"""A stand-in for torchvision, only for tests that import timm where no torchvision loads.

timm imports torchvision when it is imported: `torchvision.ops.misc.FrozenBatchNorm2d` for its
models, and transforms and datasets for its data pipeline. The registry's torchvision wheel for
this project's torch is a CUDA build that cannot load beside the CPU torch (`operator
torchvision::nms does not exist`), so the zoo tests put this folder on sys.path only when a real
torchvision cannot be imported. `ops.misc` holds torchvision's FrozenBatchNorm2d; every other
`torchvision.*` module is a placeholder whose names exist (so timm's imports succeed) and fail
when used: a model that calls into torchvision itself is not covered.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Missing:
    """Any name of a placeholder module: attribute access gives more placeholders (timm reads
    `InterpolationMode.BILINEAR` at import); calling one says what is missing."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is not available: torchvision is a test placeholder")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every `torchvision.*` module that has no file here, as a placeholder package."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        # Appended last: the shim's real files (ops.misc) were found by the path finder first.
        if not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


__version__ = "0.0.0+placeholder"
sys.meta_path.append(_PlaceholderFinder())
