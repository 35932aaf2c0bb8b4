"""The import contract CI enforces: `lint-imports` keeps the layers and one-way packages of
pyproject.toml ([tool.importlinter], mirrored by docs/architecture.md), the whole import graph
has no cycle, and no module imports a private name or module of another package."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGES = ("plex", "synapse", "myelin")


def test_lint_imports_keeps_every_contract():
    env = {**os.environ, "PYTHONPATH": str(SRC)}  # this checkout's sources, not an install's
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_architecture_md_names_every_contract():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    architecture = (REPO / "docs" / "architecture.md").read_text()
    missing = [c["name"] for c in contracts["contracts"] if c["name"] not in architecture]
    assert not missing, f"docs/architecture.md does not state: {missing}"


# -- cycles ---------------------------------------------------------------------------------------


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _graph(*packages: str) -> grimp.ImportGraph:
    # imports under `if TYPE_CHECKING:` never run: they are no cycle
    return grimp.build_graph(*packages, exclude_type_checking_imports=True, cache_dir=None)


def test_no_import_cycle_anywhere_in_src():
    assert import_cycles(_graph(*PACKAGES)) == []


def test_the_cycle_check_finds_a_cycle_across_packages(tmp_path, monkeypatch):
    for path, text in {
        "loopy/__init__.py": "",
        "loopy/a/__init__.py": "",
        "loopy/a/one.py": "def f():\n    from loopy.b.two import g\n",  # lazily: still a cycle
        "loopy/b/__init__.py": "",
        "loopy/b/two.py": "from loopy.a import one\n",
        "loopy/b/three.py": "from loopy.b import two\n",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles(_graph("loopy")) == [["loopy.a.one", "loopy.b.two"]]


# -- private imports ------------------------------------------------------------------------------


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports_across_packages(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Every import, at any depth of a module, of an underscore name or of a module with an
    underscore component, from a module in another folder (a package is a folder; private
    names are free inside their own folder). One line each: "importer:line name"."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def folder(module: str) -> str:
        path = modules[module]
        return module if path.name == "__init__.py" else module.rpartition(".")[0]

    found = []
    for importer, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = importer.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [
                    (f"{base}.{a.name}", a.name)
                    if f"{base}.{a.name}" in modules
                    else (base, a.name)
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [(a.name, "") for a in node.names]
            else:
                continue
            for module, name in targets:
                if module not in modules:
                    continue  # not ours
                private = any(_is_private(p) for p in module.split(".")) or _is_private(name)
                if private and folder(module) != folder(importer):
                    shown = (
                        module if module.endswith(f".{name}") or not name else f"{module}.{name}"
                    )
                    found.append(f"{importer}:{node.lineno} {shown}")
    return found


def test_no_module_imports_a_private_name_of_another_package():
    assert private_imports_across_packages(SRC, PACKAGES) == []


def test_the_private_import_check_finds_one(tmp_path):
    for path, text in {
        "pkg/__init__.py": "",
        "pkg/inner/__init__.py": "from pkg.inner._impl import helper\n",  # own folder: fine
        "pkg/inner/_impl.py": "def helper(): ...\ndef _secret(): ...\n",
        "pkg/inner/user.py": "from ._impl import _secret\n",  # own folder: fine
        "pkg/outer.py": "def f():\n    from pkg.inner._impl import helper\n",
        "pkg/other.py": "from pkg.inner import _impl\nfrom pkg.outer import _hidden\n",  # 2: fine
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert private_imports_across_packages(tmp_path, ("pkg",)) == [
        "pkg.other:1 pkg.inner._impl",
        "pkg.outer:2 pkg.inner._impl.helper",
    ]
