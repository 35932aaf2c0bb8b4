"""Tool versions and the digest of PLeX's step code: both enter every build fingerprint (the
salt), the versions also the artifact's provenance."""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import metadata
from pathlib import Path

OUR_PACKAGES = ("plex", "synapse", "myelin")

# A job type names the module that registers its step (`step_module = "plex.builder.steps"`);
# those modules are the roots of the code a build step can run.
_STEP_MODULE = re.compile(rb"""^\s*step_module\s*(?::[^=]*)?=\s*["']([\w.]+)["']""", re.M)
# Statements that import our modules, at any indentation (steps import lazily).
_FROM_IMPORT = re.compile(
    rb"^\s*from\s+((?:plex|synapse|myelin)[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M
)
_IMPORT = re.compile(rb"^\s*import\s+((?:plex|synapse|myelin)[\w.]*)", re.M)
# Module names in string literals: the tables of lazily imported modules (codecs, frontends).
_MODULE_STRING = re.compile(rb"""["']((?:plex|synapse|myelin)(?:\.\w+)+)["']""")
# Sources a step compiles besides Python (the q4 matvec kernel, the backend plugin ABI).
_OTHER_SOURCES = ("*.c", "*.h")


@functools.cache
def versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "plex": version("plex"),
        "iree-base-compiler": version("iree-base-compiler"),
        "iree-base-runtime": version("iree-base-runtime"),
    }


def _module_files(source_root: Path) -> dict[str, Path]:
    files = {}
    for package in OUR_PACKAGES:
        for path in (source_root / package).rglob("*.py"):
            parts = path.relative_to(source_root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def step_code_files(source_root: Path) -> list[Path]:
    """The files whose code a build step can run: every module named as a job's
    `step_module`, everything those modules import (at any depth, lazily or not, or by name in a
    table), and the C sources of their packages. The CLI, the planner and the docs are outside
    unless a step imports them: editing them cannot change what a step writes, so it must not
    cost a cached compile. A package's `__init__` counts where a step imports from it, not merely
    because Python runs it on the way to a submodule."""
    modules = _module_files(source_root)
    sources = {name: path.read_bytes() for name, path in modules.items()}
    roots = {m.decode() for text in sources.values() for m in _STEP_MODULE.findall(text)}
    seen: set[str] = set()
    pending = [name for name in roots if name in modules]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        referenced = []
        text = sources[name]
        for module, names in _FROM_IMPORT.findall(text):
            module = module.decode()
            referenced.append(module)
            for imported in re.findall(rb"\w+", names.split(b"#")[0]):
                referenced.append(f"{module}.{imported.decode()}")
        referenced += [m.decode() for m in _IMPORT.findall(text)]
        referenced += [m.decode() for m in _MODULE_STRING.findall(text)]
        pending += [m for m in referenced if m in modules and m not in seen]
    files = {modules[name] for name in seen}
    for package_dir in {path.parent for path in files}:
        for pattern in _OTHER_SOURCES:
            files.update(package_dir.glob(pattern))
    return sorted(files)


def code_digest_of(source_root: Path) -> str:
    """sha256 over the step code under `source_root` (the folder holding plex/, synapse/ and
    myelin/): each file's path and bytes."""
    digest = hashlib.sha256()
    for path in step_code_files(source_root):
        digest.update(path.relative_to(source_root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def code_digest() -> str:
    """The digest of the running PLeX's step code. A version number does not change with every
    edit of a working tree or a patched install; the code that produced a cached step does, so
    a changed step never serves an old result."""
    return code_digest_of(Path(__import__("plex").__file__).parent.parent)


def fingerprint_salt() -> str:
    return ";".join(
        [*(f"{k}={v}" for k, v in sorted(versions().items())), f"plex-code={code_digest()}"]
    )
