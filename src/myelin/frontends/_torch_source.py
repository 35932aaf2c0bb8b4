"""Loading a PyTorch graph source: import the user's Python file, call its function, and turn
what it returns into named entrypoints.

Accepted return values (documented in docs/frontends.md):
  (module, example_args)                   one entrypoint; example_args a tuple of tensors
                                           (positional) or a dict argument name -> tensor
                                           (keywords: only those become inputs)
  torch.export.ExportedProgram             one entrypoint
  {name: (module_or_method, example_args) | ExportedProgram, ...}   several entrypoints

One entrypoint is named `forward` unless the manifest lists exactly one entrypoint name.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from myelin.errors import CompileError
from myelin.frontends import DEFAULT_ENTRYPOINT

_EXPECTED = (
    "expected (module, example_args), a torch.export.ExportedProgram, or a dict of "
    "entrypoint name -> one of those"
)


@dataclass(frozen=True)
class Entry:
    """One entrypoint to export: a module, a bound method of a module, or an exported program."""

    name: str
    target: torch.nn.Module | Callable[..., Any] | torch.export.ExportedProgram
    args: tuple[Any, ...] = ()
    # Example tensors passed by keyword: a library model (Hugging Face, timm) takes many optional
    # arguments; the ones named here become inputs, the others keep their defaults.
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> torch.nn.Module | None:
        """The module that owns the parameters (None for an ExportedProgram)."""
        if isinstance(self.target, torch.nn.Module):
            return self.target
        owner = getattr(self.target, "__self__", None)
        return owner if isinstance(owner, torch.nn.Module) else None

    def arg_names(self) -> list[str] | None:
        """Positional argument names of the traced function; None when it takes *args."""
        if isinstance(self.target, torch.export.ExportedProgram):
            return list(self.target.graph_signature.user_inputs)
        fn = self.target.forward if isinstance(self.target, torch.nn.Module) else self.target
        names = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.VAR_POSITIONAL:
                return None
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
        return names

    def used_args(self) -> list[str]:
        """The arguments the example gives, in call order: these, and only these, are inputs
        (an ExportedProgram's are fixed by its export)."""
        if isinstance(self.target, torch.export.ExportedProgram):
            return self.arg_names() or []
        names = self.arg_names() or [f"arg{i}" for i in range(len(self.args))]
        return [*names[: len(self.args)], *self.kwargs]

    def example(self, arg: str) -> Any:
        """The example value of argument `arg` (None when the example does not give it)."""
        if arg in self.kwargs:
            return self.kwargs[arg]
        names = self.arg_names() or []
        index = names.index(arg) if arg in names else len(self.args)
        return self.args[index] if index < len(self.args) else None


def where(source: Path, symbol: str) -> str:
    return f"{source.name}:{symbol}"


@contextlib.contextmanager
def imported_source(source: Path) -> Iterator[Any]:
    """Import `source` as a module for the duration of the block.

    The folder that makes its dotted name importable goes on sys.path (so the file can import its
    siblings), and every module loaded from there is dropped afterwards: two packages that both
    have a `model.py` must not see each other's, and an edited file must be re-read.
    """
    root, dotted = _module_name(source)
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        try:
            if dotted is None:
                spec = importlib.util.spec_from_file_location(f"_plex_torch_{source.stem}", source)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(dotted)
        except Exception as e:
            raise CompileError(
                f"importing {source.name} failed: {one_line(e)}{user_line(e, root)}"
            ) from e
        yield module
    finally:
        sys.path.remove(str(root))
        # Only what this import added from the package folder: third-party modules it pulled in
        # (transformers, ...) must stay loaded, or a later import would duplicate their classes.
        for name in _modules_under(root, set(sys.modules) - before):
            sys.modules.pop(name, None)


def _module_name(source: Path) -> tuple[Path, str | None]:
    """(folder to put on sys.path, dotted module name); the name is None for a loose file."""
    parts = [] if source.name == "__init__.py" else [source.stem]
    folder = source.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if source.parent == folder:  # not inside a Python package: load the file by path
        return folder, None
    return folder, ".".join(parts)


def _modules_under(root: Path, names_in: set[str]) -> list[str]:
    """Modules among `names_in` loaded from files under `root`, except from another import root
    inside it (a virtualenv's site-packages in the package folder stays loaded). A file in the
    folder that links elsewhere (examples/pipeline's llama_model.py) counts as the folder's: it
    is one of the package's sources, so an edit of what it points to must be re-read too."""
    root = root.resolve()
    others = [p for p in (Path(e).resolve() for e in sys.path if e) if p != root]
    others = [p for p in others if p.is_relative_to(root)]
    names = []
    for name in names_in:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        for path in (Path(file).resolve(), Path(os.path.abspath(file))):
            if path.is_relative_to(root) and not any(path.is_relative_to(o) for o in others):
                names.append(name)
                break
    return names


def call_source(module: Any, source: Path, symbol: str) -> Any:
    """Look up `symbol` (a function, possibly `Class.method`) and call it with no arguments."""
    target: Any = module
    for part in symbol.split("."):
        if not hasattr(target, part):
            raise CompileError(f"{where(source, symbol)}: {source.name} defines no {symbol!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CompileError(f"{where(source, symbol)}: {symbol!r} is not a function")
    try:
        with torch.no_grad():
            return target()
    except Exception as e:
        raise CompileError(
            f"{where(source, symbol)} raised {one_line(e)}{user_line(e, source.parent)}"
        ) from e


def entries(value: Any, *, what: str, entrypoints: tuple[str, ...] | None) -> list[Entry]:
    """Named entrypoints from what the source function returned."""
    if isinstance(value, dict):
        if not value:
            raise CompileError(f"{what} returned an empty dict; {_EXPECTED}")
        found = [_entry(str(name), v, what=what) for name, v in value.items()]
        if entrypoints is not None:
            names = [e.name for e in found]
            missing = [n for n in entrypoints if n not in names]
            if missing:
                raise CompileError(
                    f"{what}: entrypoint(s) {', '.join(missing)} listed in the manifest are not "
                    f"in the returned dict (it has {', '.join(names)})"
                )
            found = [e for e in found if e.name in entrypoints]
        return found
    name = entrypoints[0] if entrypoints is not None and len(entrypoints) == 1 else None
    return [_entry(name or DEFAULT_ENTRYPOINT, value, what=what)]


def _entry(name: str, value: Any, *, what: str) -> Entry:
    if not name.isidentifier():
        raise CompileError(f"{what}: entrypoint name {name!r} is not an identifier")
    if isinstance(value, torch.export.ExportedProgram):
        return Entry(name, value)
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise CompileError(
            f"{what} returned {_describe(value)} for entrypoint {name!r}; {_EXPECTED}"
        )
    target, args = value
    if isinstance(args, torch.Tensor):
        args = (args,)
    kwargs: dict[str, Any] = {}
    if isinstance(args, Mapping):
        kwargs, args = {str(k): v for k, v in args.items()}, ()
    if not isinstance(args, tuple | list) or not all(_is_arg(a) for a in (*args, *kwargs.values())):
        raise CompileError(
            f"{what}: example_args of entrypoint {name!r} must be a tuple of tensors or a dict "
            f"of argument name -> tensor, got {_describe(args)}"
        )
    unaliased = _unaliased((*args, *kwargs.values()))
    entry = Entry(
        name,
        target,
        unaliased[: len(args)],
        dict(zip(kwargs, unaliased[len(args) :], strict=True)),
    )
    if not isinstance(target, torch.nn.Module) and entry.root is None:
        raise CompileError(
            f"{what}: entrypoint {name!r} is {_describe(target)}; it must be a torch.nn.Module "
            "or a method of one (e.g. model.decode), so that its weights can be named"
        )
    return entry


def _unaliased(args: tuple | list) -> tuple[Any, ...]:
    """Copy example tensors that share memory with an earlier one.

    torch.export treats aliased inputs as one: given `decode(tok, pos, cache, cache)`, the graph
    reads the v-cache argument for both caches and silently ignores the other. The compiled
    function always takes separate buffers, so separate examples are what the user meant.
    """
    seen: set[int] = set()
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel() > 0:
            ptr = a.untyped_storage().data_ptr()
            if ptr in seen:
                a = a.clone()
                ptr = a.untyped_storage().data_ptr()
            seen.add(ptr)
        out.append(a)
    return tuple(out)


def _is_arg(a: Any) -> bool:
    return isinstance(a, torch.Tensor)


def _describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def user_line(e: BaseException, folder: Path) -> str:
    """` (file.py:LINE)` for the innermost traceback frame inside `folder`, else ''."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = Path(frame.filename)
        if path.is_absolute() and path.resolve().is_relative_to(folder.resolve()):
            return f" ({path.name}:{frame.lineno})"
    return ""
