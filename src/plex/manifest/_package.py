"""`plex.toml`: read, validate and describe one package."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from dataclasses import replace
from pathlib import Path

from plex.errors import ManifestError
from plex.manifest._document import TomlDocument, unknown
from plex.manifest._schema import (
    FRONTEND_OF_SUFFIX,
    FRONTENDS,
    GRAPH_NAME,
    MAX_NAME_LENGTH,
    NAME,
    PYTHON_FRONTENDS,
    WEIGHTS_FORMATS,
    BackendTable,
    GraphTable,
    PackageFile,
)
from plex.manifest._specs import (
    BackendSpec,
    FrozenDict,
    GraphSpec,
    PackageManifest,
    PackageSpec,
    ShardSpec,
    TuningSpec,
    WeightsSpec,
)

MANIFEST_NAME = "plex.toml"

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*$")  # a module or a function name


def load_package(
    folder_or_toml: Path | str, *, allow_outside_sources: bool = False
) -> PackageManifest:
    """Read and validate a package: a folder holding `plex.toml`, or the file itself.

    References to other packages (`weights = "other:name"`) are checked by `load_app`, which
    also rejects not-implemented features the app uses; here they are only validated. Every file
    the package names must resolve inside its folder (symbolic links followed) unless
    `allow_outside_sources` (an app's `[app] allow_outside_sources = true`).
    """
    return read_package(folder_or_toml, allow_outside_sources=allow_outside_sources)[0]


def fingerprint_package(package: PackageManifest | Path | str) -> str:
    """sha256 (hex) over `plex.toml` and every file it references, names included.

    Given a PackageManifest, the files are hashed again, so the result reflects the disk now.
    """
    if not isinstance(package, PackageManifest):
        package = load_package(package)
    return _fingerprint(package.spec.path, package.files)


def read_package(
    folder_or_toml: Path | str, *, allow_outside_sources: bool = False
) -> tuple[PackageManifest, TomlDocument]:
    """`load_package`, plus the document, for errors that `load_app` finds later."""
    path = Path(folder_or_toml).resolve()
    if path.is_dir():
        folder, manifest = path, path / MANIFEST_NAME
        if not manifest.is_file():
            raise ManifestError(f"not a package: no {MANIFEST_NAME} in this folder", file=folder)
    else:
        folder, manifest = path.parent, path
    doc = replace(TomlDocument.read(manifest), allow_outside_sources=allow_outside_sources)
    model = doc.validate(PackageFile)
    name = model.package.name

    weights: dict[str, WeightsSpec] = {}
    for wname, w in model.weights.items():
        _check_name(doc, ("weights", wname), wname, NAME)
        source = fmt = None
        if w.source is not None:
            source = _existing(doc, ("weights", wname, "source"), folder, w.source)
            fmt = WEIGHTS_FORMATS.get(source.suffix)
            if fmt is None:
                raise doc.error(
                    ("weights", wname, "source"),
                    f"unknown weights format {source.suffix or source.name!r}",
                    f"accepted: {', '.join(WEIGHTS_FORMATS)}",
                )
        weights[wname] = WeightsSpec(
            ref=f"{name}:{wname}",
            package=name,
            name=wname,
            source=source,
            format=fmt,
            scope=w.scope,
            codec=w.codec,
        )

    tuning: dict[str, TuningSpec] = {}
    for tname, t in model.tuning.items():
        _check_name(doc, ("tuning", tname), tname, NAME)
        if t.path is None and not t.layouts and t.kernels is None:
            raise doc.error(
                ("tuning", tname),
                'sets nothing: give it a spec (path = "spec.mlir"), weight layouts '
                '(layouts = { "*.weight" = "nk" }) or kernel configs (kernels = "tuning.json")',
            )
        if t.kernels is not None and t.target != "cuda":
            raise doc.error(
                ("tuning", tname, "kernels"),
                f"kernel configs choose CUDA kernel-library kernels, not {t.target!r} code: "
                'use target = "cuda" or remove kernels',
            )
        tuning[tname] = TuningSpec(
            ref=f"{name}:{tname}",
            package=name,
            name=tname,
            path=None
            if t.path is None
            else _existing(doc, ("tuning", tname, "path"), folder, t.path),
            target=t.target,
            layouts=tuple(t.layouts.items()),
            kernels=None
            if t.kernels is None
            else _existing(doc, ("tuning", tname, "kernels"), folder, t.kernels),
        )

    graphs = {
        gname: _graph(doc, folder, name, gname, g, weights) for gname, g in model.graph.items()
    }
    backends = {bname: _backend(doc, folder, name, bname, b) for bname, b in model.backend.items()}

    files = [manifest]
    files += [g.source for g in graphs.values() if g.source is not None]
    files += [  # a causal-lm source's weights and tokenizer, beside its config.json
        f
        for g in graphs.values()
        if g.frontend == "causal-lm" and g.source is not None
        for f in g.source.parent.iterdir()
        if f.is_file() and not f.name.startswith(".")
    ]
    files += [s.source for g in graphs.values() for s in g.shards]
    files += [w.source for w in weights.values() if w.source is not None]
    files += [t.path for t in tuning.values() if t.path is not None]
    files += [f for b in backends.values() for f in (*b.sources, *filter(None, [b.library]))]
    ordered = tuple(sorted(set(files), key=lambda f: _relative(folder, f)))
    spec = PackageSpec(
        name=name,
        version=model.package.version,
        description=model.package.description,
        path=folder,
        manifest_path=manifest,
        fingerprint=_fingerprint(folder, ordered),
    )
    package = PackageManifest(
        spec=spec,
        graphs=FrozenDict(graphs),
        weights=FrozenDict(weights),
        tuning=FrozenDict(tuning),
        files=ordered,
        backends=FrozenDict(backends),
    )
    return package, doc


def _backend(
    doc: TomlDocument, folder: Path, package: str, name: str, b: BackendTable
) -> BackendSpec:
    """`[backend.<name>]`: sources or a prebuilt plugin, and the vendor files it needs.

    Vendor files (`include_dirs`, `libraries`) live in an installed Python distribution when
    `vendor_module` names one (a BLAS wheel), else in the package folder. A missing one is an
    error here, at its line, not a linker error later.
    """
    at = ("backend", name)
    _check_name(doc, at, name, NAME)
    if bool(b.sources) == (b.library is not None):
        raise doc.error(at, "give either `sources` (C files) or `library` (a prebuilt plugin)")
    # A backend is native code the build compiles and the runtime loads: its C can read any
    # file (`#include`), so confining its file list would protect nothing; its sources may
    # come from beside the package (the example backends share examples/backends/cpu_ops).
    sources = tuple(
        _existing(doc, (*at, "sources", i), folder, s, confined=False)
        for i, s in enumerate(b.sources)
    )
    library = (
        _existing(doc, (*at, "library"), folder, b.library, confined=False) if b.library else None
    )
    if b.vendor_module is not None and b.vendor_distribution is not None:
        raise doc.error(
            (*at, "vendor_distribution"), "give `vendor_module` or `vendor_distribution`, not both"
        )
    vendor = folder
    vendor_name = b.vendor_module or b.vendor_distribution
    if b.vendor_module is not None:
        import importlib.util

        spec = importlib.util.find_spec(b.vendor_module)
        if spec is None or not spec.submodule_search_locations:
            raise doc.error(
                (*at, "vendor_module"),
                f"vendor module {b.vendor_module!r} is not installed",
                "install it (pip install -e '.[blas]' for the BLAS backend)",
            )
        vendor = Path(next(iter(spec.submodule_search_locations)))
    elif b.vendor_distribution is not None:
        prefix = _data_prefix(b.vendor_distribution)
        if prefix is None:
            raise doc.error(
                (*at, "vendor_distribution"),
                f"vendor distribution {b.vendor_distribution!r} is not installed",
                "install it (pip install -e '.[mkl]' for the MKL backend)",
            )
        vendor = prefix
    include_dirs = []
    for i, d in enumerate(b.include_dirs):
        path = (vendor / d).resolve()
        if not path.is_dir():
            raise doc.error(
                (*at, "include_dirs", i),
                f"folder not found: {path}",
                f"install the headers beside {vendor_name}" if vendor_name else "check the path",
            )
        include_dirs.append(path)
    libraries = _vendor_files(doc, at, "libraries", vendor, vendor_name, b.libraries)
    static_libraries = _vendor_files(
        doc, at, "static_libraries", vendor, vendor_name, b.static_libraries
    )
    return BackendSpec(
        ref=f"{package}:{name}",
        package=package,
        name=name,
        sources=sources,
        library=library,
        ops=tuple(dict.fromkeys(b.ops)),
        device=b.device,
        include_dirs=tuple(include_dirs),
        libraries=libraries,
        static_libraries=static_libraries,
        cflags=tuple(b.cflags),
        min_flops=b.min_flops,
    )


def _vendor_files(
    doc: TomlDocument,
    at: tuple[str, ...],
    key: str,
    vendor: Path,
    vendor_name: str | None,
    names: list[str],
) -> tuple[Path, ...]:
    """A backend's `libraries` or `static_libraries`, each an existing file under `vendor`."""
    paths = []
    for i, lib in enumerate(names):
        path = (vendor / lib).resolve()
        if not path.is_file():
            raise doc.error(
                (*at, key, i),
                f"backend library not found: {path}",
                f"reinstall {vendor_name}" if vendor_name else "check the path",
            )
        paths.append(path)
    return tuple(paths)


def _data_prefix(distribution: str) -> Path | None:
    """The install prefix a data-only wheel's files went to (a wheel's `.data/data/lib/x`
    lands in `<prefix>/lib/x`), read from its RECORD: such a file is recorded relative to the
    site-packages folder, climbing out of it (`../../../lib/x`). None if it is not installed or
    has no data files."""
    from importlib import metadata

    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        climb = list(itertools.takewhile(lambda part: part == "..", file.parts))
        if climb:
            return Path(str(dist.locate_file(Path(*climb)))).resolve()
    return None


def split_ref(text: str, package: str | None = None) -> tuple[str, str] | None:
    """("package", "name") of `package:name`, or of `name` when `package` is given; else None."""
    pkg, sep, name = text.rpartition(":")
    if not sep:
        pkg = package or ""
    if not pkg or not name or ":" in pkg:
        return None
    return pkg, name


# The graph keys only a causal-lm graph has, and what each does (for the refusal elsewhere).
_CAUSAL_LM_KEYS = {
    "max_seq": "sizes a causal-lm graph's KV cache",
    "max_batch": "sizes a causal-lm graph's KV cache",
    "dtype": "sets a causal-lm graph's compute and KV cache dtype",
    "prefill_lengths": "adds a causal-lm graph's static-length prefill entrypoints",
}


def _graph(
    doc: TomlDocument,
    folder: Path,
    package: str,
    name: str,
    g: GraphTable,
    weights: dict[str, WeightsSpec],
) -> GraphSpec:
    at = ("graph", name)
    _check_name(doc, at, name, GRAPH_NAME)
    source = symbol = None
    frontend = ""
    if g.source is not None:
        source, symbol, frontend = _source(doc, folder, at, g.source, g.frontend)
    elif g.shards is None:
        raise doc.error((*at, "source"), "missing required key")
    shards = () if g.shards is None else _shards(doc, folder, at, g, source, symbol, frontend)
    if source is None:
        frontend = shards[0].frontend

    if g.entrypoints is not None:
        if not g.entrypoints:
            raise doc.error((*at, "entrypoints"), "must list at least one function")
        _check_unique(doc, (*at, "entrypoints"), g.entrypoints)
    for entry, args in g.arg_names.items():
        if g.entrypoints is not None and entry not in g.entrypoints:
            raise doc.error(
                (*at, "arg_names", entry), *unknown(entry, g.entrypoints, what="entrypoint")
            )
        _check_unique(doc, (*at, "arg_names", entry), args)
    for key, does in _CAUSAL_LM_KEYS.items():
        if getattr(g, key) is not None and frontend != "causal-lm":
            raise doc.error(
                (*at, key),
                f"{key} {does}",
                'set frontend = "causal-lm" or remove it',
            )
    if g.prefill_lengths is not None:
        _check_unique(doc, (*at, "prefill_lengths"), g.prefill_lengths)
        # without max_seq the frontend's default applies, and the frontend checks against it
        for i, length in enumerate(g.prefill_lengths):
            if g.max_seq is not None and length > g.max_seq:
                raise doc.error(
                    (*at, "prefill_lengths", i),
                    f"prefill length {length} is longer than max_seq ({g.max_seq})",
                    "raise max_seq or drop the length",
                )
    if g.dynamic and frontend in ("mlir", "stablehlo"):
        raise doc.error(
            (*at, "dynamic"),
            f"a {frontend} source declares its dynamic dims in its own types ('?')",
            "remove `dynamic`",
        )
    for arg, dims in g.dynamic.items():
        for dim, symbol_name in dims.items():
            if not dim.isdigit():
                raise doc.error((*at, "dynamic", arg, dim), f"{dim!r} is not a dimension index")
            if not re.fullmatch(_IDENTIFIER, symbol_name):
                raise doc.error(
                    (*at, "dynamic", arg, dim), f"invalid dimension name {symbol_name!r}"
                )

    weights_ref = None
    if g.weights is not None:
        ref = split_ref(g.weights, package)
        if ref is None:
            raise doc.error(
                (*at, "weights"),
                f"invalid reference {g.weights!r}",
                "expected 'name' (this package) or 'package:name'",
            )
        weights_ref = f"{ref[0]}:{ref[1]}"
        if ref[0] == package and ref[1] not in weights:
            accepted = [f"{package}:{w}" for w in weights]
            raise doc.error((*at, "weights"), *unknown(weights_ref, accepted, what="weights"))

    return GraphSpec(
        ref=f"{package}:{name}",
        package=package,
        name=name,
        source=source,
        source_symbol=symbol,
        frontend=frontend,
        entrypoints=tuple(g.entrypoints) if g.entrypoints is not None else None,
        arg_names=FrozenDict({k: tuple(v) for k, v in g.arg_names.items()}),
        weights_ref=weights_ref,
        shards=shards,
        dynamic=FrozenDict(
            {a: FrozenDict({int(d): n for d, n in dims.items()}) for a, dims in g.dynamic.items()}
        ),
        host_fallback=g.host_fallback,
        max_seq=g.max_seq,
        max_batch=g.max_batch,
        dtype=g.dtype,
        prefill_lengths=tuple(sorted(g.prefill_lengths)) if g.prefill_lengths else None,
    )


def _shards(
    doc: TomlDocument,
    folder: Path,
    at: tuple[str, ...],
    g: GraphTable,
    source: Path | None,
    symbol: str | None,
    frontend: str,
) -> tuple[ShardSpec, ...]:
    """`shards = { name = ["entrypoint", ...] }` splits the graph's source by entrypoint;
    `[graph.<g>.shards.<name>] source = ...` gives a shard its own file."""
    at = (*at, "shards")
    if not isinstance(g.shards, dict) or not g.shards:
        raise doc.error(at, "expected a table of shards", 'e.g. shards = { encoder = ["encode"] }')
    if g.entrypoints is not None:
        raise doc.error(
            (*at[:-1], "entrypoints"), "a sharded graph lists entrypoints per shard", "remove it"
        )
    owner: dict[str, str] = {}  # entrypoint -> shard, over the shards that split the source
    shards = []
    for shard_name, value in g.shards.items():
        where = (*at, shard_name)
        _check_name(doc, where, shard_name, GRAPH_NAME)
        # the array form `one = ["f"]` is short for `one = { entrypoints = ["f"] }`
        entries_at = where if isinstance(value, list) else (*where, "entrypoints")
        if isinstance(value, list):
            value = {"entrypoints": value}
        if not isinstance(value, dict):
            raise doc.error(
                where, "expected an array of entrypoints or a table (source, frontend, entrypoints)"
            )
        for key in value:
            if key not in ("source", "frontend", "entrypoints"):
                raise doc.error(
                    (*where, key), *unknown(key, ["source", "frontend", "entrypoints"], what="key")
                )
        entrypoints = value.get("entrypoints")
        if entrypoints is not None:
            if not isinstance(entrypoints, list) or not all(
                isinstance(e, str) for e in entrypoints
            ):
                raise doc.error(entries_at, "expected an array of function names")
            if not entrypoints:
                raise doc.error(entries_at, "must list at least one function")
            _check_unique(doc, entries_at, entrypoints)
        own_frontend = value.get("frontend")
        if own_frontend is not None and own_frontend not in FRONTENDS:
            raise doc.error((*where, "frontend"), *unknown(own_frontend, FRONTENDS, what="value"))
        if "source" in value:
            if not isinstance(value["source"], str):
                raise doc.error((*where, "source"), "expected a string")
            path, sym, fe = _source(doc, folder, where, value["source"], own_frontend or g.frontend)
            shards.append(
                ShardSpec(shard_name, path, sym, fe, _tuple(entrypoints), own_source=True)
            )
            continue
        if source is None:
            raise doc.error(
                (*where, "source"),
                "missing required key",
                "the graph has no source of its own, so every shard needs one",
            )
        if entrypoints is None:
            raise doc.error(
                where,
                "a shard of the graph's source must list its entrypoints",
                f'e.g. {shard_name} = ["forward"]',
            )
        if own_frontend is not None:
            raise doc.error((*where, "frontend"), "only a shard with its own source takes one")
        for i, entry in enumerate(entrypoints):
            if entry in owner:
                raise doc.error((*entries_at, i), f"{entry!r} is already in shard {owner[entry]!r}")
            owner[entry] = shard_name
        shards.append(ShardSpec(shard_name, source, symbol, frontend, tuple(entrypoints), False))
    if source is not None and not owner:
        raise doc.error(
            (*at[:-1], "source"),
            "no shard uses the graph's source: every shard has its own",
            "remove it, or list entrypoints of it in a shard",
        )
    return tuple(shards)


def _tuple(names: list[str] | None) -> tuple[str, ...] | None:
    return tuple(names) if names is not None else None


def _source(
    doc: TomlDocument, folder: Path, at: tuple[str, ...], text: str, given_frontend: str | None
) -> tuple[Path, str | None, str]:
    """(file, function or None, frontend) of a graph's or shard's `source` (`at` is its table)."""
    module, sep, symbol = text.rpartition(":")
    if sep and module and _DOTTED.match(symbol):  # a Python source, "model.py:fn" or "pkg.mod:fn"
        if given_frontend is None:
            raise doc.error(
                (*at, "source"),
                "a Python source needs an explicit frontend",
                f"add frontend = {' or '.join(repr(f) for f in PYTHON_FRONTENDS)}",
            )
        if given_frontend not in PYTHON_FRONTENDS:
            raise doc.error(
                (*at, "frontend"),
                f"frontend {given_frontend!r} reads a file, not a Python 'module:function'",
                f"use {' or '.join(repr(f) for f in PYTHON_FRONTENDS)}",
            )
        if module.endswith(".py"):
            return _existing(doc, (*at, "source"), folder, module), symbol, given_frontend
        if not _DOTTED.match(module):
            raise doc.error(
                (*at, "source"),
                f"invalid Python source {text!r}",
                "expected 'file.py:function' or 'package.module:function'",
            )
        base = folder.joinpath(*module.split("."))
        for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if candidate.is_file():
                return _inside(doc, (*at, "source"), folder, candidate), symbol, given_frontend
        raise doc.error(
            (*at, "source"),
            f"module {module!r} not found: no {base}.py or {base / '__init__.py'}",
        )

    if given_frontend == "causal-lm":
        return _model_folder(doc, (*at, "source"), folder, text), None, given_frontend
    path = _existing(doc, (*at, "source"), folder, text)
    if given_frontend in PYTHON_FRONTENDS:
        raise doc.error(
            (*at, "frontend"),
            f"frontend {given_frontend!r} needs a Python source 'module:function'",
            'e.g. source = "model.py:build"',
        )
    frontend = given_frontend or FRONTEND_OF_SUFFIX.get(path.suffix)
    if frontend is None:
        raise doc.error(
            (*at, "source"),
            f"cannot infer the frontend of {path.name!r}",
            "set frontend = 'mlir', 'stablehlo' or 'onnx'",
        )
    return path, None, frontend


def _model_folder(doc: TomlDocument, at: tuple[str, ...], folder: Path, relative: str) -> Path:
    """A causal-lm source: a folder `save_pretrained` wrote; its config.json stands for it
    (the package's files and the import's inputs add the rest of the folder)."""
    path = _inside(doc, at, folder, folder / relative)
    if not path.is_dir():
        raise doc.error(
            at,
            f"a causal-lm source is a model folder (config.json, *.safetensors, "
            f"tokenizer.json); {path} is not a folder",
        )
    return _existing(doc, at, folder, str(Path(relative) / "config.json"))


def _existing(
    doc: TomlDocument, at: tuple[str, ...], folder: Path, relative: str, *, confined: bool = True
) -> Path:
    path = (
        _inside(doc, at, folder, folder / relative) if confined else (folder / relative).resolve()
    )
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "not found"
        raise doc.error(at, f"file {what}: {path}")
    return path


def _inside(doc: TomlDocument, at: tuple[str, ...], folder: Path, path: Path) -> Path:
    """`path` resolved (symbolic links followed), refused unless it lies inside `folder`: a
    package builds from its own files, so `source = "/etc/passwd"`, `"../../x"` or a link out
    of the folder is an error unless the app allows outside sources."""
    resolved = path.resolve()
    if doc.allow_outside_sources or resolved.is_relative_to(folder.resolve()):
        return resolved
    raise doc.error(
        at,
        f"{resolved} is outside the folder {folder}",
        "a package reads only files inside its folder: move the file there, or set "
        "allow_outside_sources = true in the app's [app] table",
    )


def _check_name(doc: TomlDocument, at: tuple[str, ...], name: str, pattern: str) -> None:
    if not re.fullmatch(pattern, name):
        length = f" ({len(name)} characters)" if len(name) > MAX_NAME_LENGTH else ""
        raise doc.error(at, f"invalid name {name!r}{length}; must match {pattern}")


def _check_unique(doc: TomlDocument, at: tuple[str, ...], names: list[str]) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise doc.error((*at, i), f"{n!r} is listed twice")
        seen.add(n)


def _relative(folder: Path, path: Path) -> str:
    return Path(os.path.relpath(path, folder)).as_posix()


def _fingerprint(folder: Path, files: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(_relative(folder, path).encode() + b"\0")
        try:
            with path.open("rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
        except OSError as e:
            raise ManifestError(f"cannot read {path}: {e}") from None
    return digest.hexdigest()
