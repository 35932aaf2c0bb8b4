"""Fixtures shared by the frontend tests: the library-model zoo (tests/frontends/zoo), built
once per session through `plex build`'s builder."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import build_app

ZOO = Path(__file__).parent / "zoo"
TORCHVISION_PLACEHOLDER = Path(__file__).parent / "_torchvision_shim"


@dataclass
class Zoo:
    mln: Path
    warnings: list[str]  # the build's BuildWarnings, as text


def use_torchvision_placeholder() -> None:
    """timm imports torchvision; where no real one loads (the registry's wheel is a CUDA build
    that fails beside CPU torch), put the placeholder package on sys.path (see its docstring)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        if str(TORCHVISION_PLACEHOLDER) not in sys.path:
            sys.path.insert(0, str(TORCHVISION_PLACEHOLDER))


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")
    pytest.importorskip("transformers")
    use_torchvision_placeholder()
    pytest.importorskip("timm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mln = build_app(ZOO / "app.toml", tmp_path_factory.mktemp("zoo") / "zoo.mln")
    return Zoo(mln, [str(w.message) for w in caught if w.category.__name__ == "BuildWarning"])


@pytest.fixture(scope="session")
def zoo_model(zoo: Zoo):
    import myelin

    model = myelin.Instance().load(zoo.mln)
    yield model
    model.close()


@pytest.fixture(scope="session")
def zoo_source() -> ModuleType:
    """tests/frontends/zoo/zoo.py, for the torch eager references (same seeds, same weights)."""
    use_torchvision_placeholder()
    spec = importlib.util.spec_from_file_location("zoo_reference", ZOO / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
