"""Loading the user's Python builder function named by a graph's `source` ("file.py:fn" or
"pkg.module:fn"; the manifest has already resolved the file)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from myelin.errors import CompileError


def load_function(path: Path, symbol: str | None) -> Callable[[], Any]:
    """Import `path` as a fresh module (its folder on sys.path, so sibling imports work) and
    return its attribute `symbol`."""
    if not symbol:
        raise CompileError(f"{path.name}: a Python source needs a function, e.g. model.py:build")
    path = path.resolve()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"_plex_source_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CompileError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise CompileError(
            f"{path.name}: importing it raised {type(e).__name__}: {str(e).strip()[:300]}"
        ) from e
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    fn = getattr(module, symbol, None)
    if not callable(fn):
        raise CompileError(f"{path.name} has no function {symbol!r}")
    return fn
