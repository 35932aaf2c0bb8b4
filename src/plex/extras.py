"""Optional dependencies: which pyproject extra brings which modules, and the one check every
verb runs before its work starts.

A missing extra must fail at once, in one line that names the package and the install command,
not as a ModuleNotFoundError after a whole build (`plex tune` without nevergrad used to end that
way). The hint installs the way the README does (`pip install -e '.[tune]'` from a checkout).
Lower layers keep their own import-time messages for Python callers; this table is what the CLI
and the builder check up front. Presence is looked up with `importlib.util.find_spec`, which
imports nothing (a verb's `--help` and a no-op rebuild stay fast).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plex.errors import PlexError

if TYPE_CHECKING:
    from plex.manifest import AppSpec


class MissingExtra(PlexError):
    """An optional dependency a command needs is not installed."""


@dataclass(frozen=True)
class Extra:
    modules: tuple[str, ...]  # import names (not distribution names) the extra provides
    needed_for: str  # what needs it, as a user names it


# extra (a key of [project.optional-dependencies] in pyproject.toml) -> what it provides.
# `test` (everything) is not listed: no command needs it. `blas` and `mkl` are checked where the
# manifest names their backend (plex.manifest), against the module the backend package declares.
EXTRAS: dict[str, Extra] = {
    "torch": Extra(("torch", "iree.turbine"), 'PyTorch models (frontend = "torch")'),
    "onnx": Extra(("onnx",), 'ONNX models (frontend = "onnx")'),
    "jax": Extra(("jax",), 'JAX models (frontend = "jax")'),
    "tune": Extra(("nevergrad", "z3", "matplotlib"), "plex tune"),
    "kernels": Extra(("triton",), 'kernels = "triton"'),
    "ray": Extra(("ray",), "the ray executor"),
    "sign": Extra(("cryptography",), "signing and trust policies"),
    "minilm": Extra(("transformers", "tokenizers"), "examples/minilm"),
    "fuzz": Extra(("atheris",), "tools/fuzz.py"),
}


def install_hint(extra: str) -> str:
    return f"pip install -e '.[{extra}]'"


def missing_module(extra: str) -> str | None:
    """The first module of `extra` that cannot be imported, or None when all can."""
    for module in EXTRAS[extra].modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package is missing, or set to None
            found = None
        if found is None:
            return module
    return None


def require(extra: str, needed_for: str | None = None) -> None:
    """Fail with one line when `extra` is not installed: what needs it, the missing package
    and the install command (from the repository root, as the README installs)."""
    module = missing_module(extra)
    if module is None:
        return
    what = needed_for or EXTRAS[extra].needed_for
    raise MissingExtra(
        f"{what} needs the '{module.split('.')[0]}' package; install PLeX with the '{extra}' "
        f"extra: {install_hint(extra)}"
    )


def extras_for_executor(executor: str) -> list[str]:
    """The extras an executor (`local`, `ray`, `ray=ADDRESS`) needs."""
    from plex.manifest import parse_executor

    try:
        return ["ray"] if parse_executor(executor).kind == "ray" else []
    except ValueError:  # an unknown executor is refused, with its forms, where it is made
        return []


def extras_for_app(app: AppSpec, executor: str | None = None) -> list[str]:
    """The extras building `app` needs: its graphs' frontends, its devices' kernel libraries,
    and the executor's (`executor`, else the app's `[build] executor`)."""
    needed: dict[str, None] = {}
    for graph in app.graphs:
        for frontend in (graph.frontend, *(s.frontend for s in graph.shards)):
            if frontend in EXTRAS:
                needed[frontend] = None
    for device in app.devices:
        if device.kernels == "triton":
            needed["kernels"] = None
    for name in extras_for_executor(executor or app.build.executor):
        needed[name] = None
    return list(needed)


def require_for_app(app: AppSpec, executor: str | None = None, extra: Iterable[str] = ()) -> None:
    """Check, before a build starts, every extra building `app` needs (plus `extra`)."""
    for name in (*extra, *extras_for_app(app, executor)):
        require(name)
