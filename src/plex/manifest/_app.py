"""`app.toml`: resolve an application and the packages it uses into an AppSpec."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from myelin.platforms import DEFAULT_CUDA_ARCH, HOST_DRIVERS, KERNELS_CUDA_ARCH, TARGET_OPTIONS
from plex.errors import BuildWarning, ManifestError
from plex.manifest._document import TomlDocument, unknown
from plex.manifest._locate import KeyPath
from plex.manifest._package import MANIFEST_NAME, read_package, split_ref
from plex.manifest._planned import check_planned
from plex.manifest._schema import (
    DRIVERS_OF_TARGET,
    NAME,
    AppFile,
    DeviceTable,
)
from plex.manifest._specs import (
    AppSpec,
    BuildOptions,
    DeviceSpec,
    GraphSpec,
    PackageManifest,
    PackageSpec,
    PlacementRule,
    ProfileOptions,
    TuningSpec,
    VariantSpec,
    WeightsSpec,
)

APP_MANIFEST_NAME = "app.toml"
PLEX_PATH = "PLEX_PATH"  # os.pathsep-separated folders, each holding package folders

_REQUIRED_OPTION_EXAMPLE = {"arch": "arch = 'gfx942'"}


def load_app(app_toml: Path | str) -> AppSpec:
    """Read `app.toml` (or a folder holding it), resolve its packages, and return the AppSpec.

    Packages come from `[app] packages` (folders relative to app.toml) and from the folders on
    PLEX_PATH. Raises ManifestError for the first problem, including any feature the app uses
    that is accepted but not implemented yet.
    """
    path = Path(app_toml).resolve()
    if path.is_dir():
        path = path / APP_MANIFEST_NAME
    doc = TomlDocument.read(path)
    app = doc.validate(AppFile)
    packages = _Packages(
        doc,
        path.parent,
        app.app.packages,
        os.environ.get(PLEX_PATH, ""),
        allow_outside_sources=app.app.allow_outside_sources,
    )

    graphs = _select_graphs(doc, app, packages)
    graphs = [replace(g, weights=packages.weights_of(g)) for g in graphs]
    devices = _backend_devices(doc, app, packages, _devices(doc, app))
    variants = _variants(doc, app, devices)
    placement = tuple(PlacementRule(glob, device) for glob, device in app.placement.items())
    modules = {
        (g.name, f"{g.name}_{s.name}" if s else g.name)
        for g in graphs
        for s in (g.shards or (None,))
    }
    for rule in placement:
        if rule.device not in devices:
            raise doc.error(
                ("placement", rule.pattern), *unknown(rule.device, devices, what="device")
            )
        _check_backend_rule(doc, rule, devices[rule.device])
        if not any(rule.names_module(graph, module) for graph, module in modules):
            names = sorted({n for pair in modules for n in pair})
            raise doc.error(
                ("placement", rule.pattern),
                f"{rule.module_glob!r} matches no graph or shard module of this app",
                f"it has: {', '.join(names)}",
            )
    tuning = _tuning_specs(doc, packages, app.myelin.tuning, devices)

    check_planned(doc, "app.toml")
    packages.check_planned(graphs)

    cache = app.build.cache
    return AppSpec(
        name=app.app.name,
        version=app.app.version,
        path=path,
        packages=packages.specs(),
        graphs=tuple(graphs),
        devices=tuple(devices.values()),
        variants=variants,
        favor=app.scheduling.favor,
        residency=app.weights.residency,
        placement=placement,
        memory=app.runtime.memory,
        cancellable=app.runtime.cancellable,
        codecs=tuple(app.weights.codec.items()),
        tuning=tuning,
        profile=(
            ProfileOptions(app.runtime.profile.output, app.runtime.profile.device_timing)
            if app.runtime.profile is not None
            else None
        ),
        build=BuildOptions(
            jobs=app.build.jobs or os.cpu_count() or 1,
            temp_memory=app.build.temp_memory,
            cache=(path.parent / cache).resolve() if cache is not None else None,
            executor=app.build.executor,
        ),
    )


def _tuning_specs(
    doc: TomlDocument, packages: _Packages, given: str | list[str] | None, devices: dict
) -> tuple[TuningSpec, ...]:
    """`[myelin] tuning`: each reference resolved; one spec per compiler target, chosen by the
    user (two for one target would be merged in some incidental order, so they are refused)."""
    refs = [given] if isinstance(given, str) else list(given or [])
    specs: dict[str, TuningSpec] = {}
    for i, text in enumerate(refs):
        at: KeyPath = ("myelin", "tuning") if isinstance(given, str) else ("myelin", "tuning", i)
        spec = packages.resolve(doc, at, text, "tuning")
        if spec.target in specs:
            raise doc.error(
                at,
                f"two tuning specs for target {spec.target!r}: {specs[spec.target].ref} and "
                f"{spec.ref}",
                "select one per target (merge the specs into one file if you need both)",
            )
        if not any(d.target == spec.target for d in devices.values()):
            targets = sorted({d.target for d in devices.values()})
            raise doc.error(
                at,
                f"tuning spec {spec.ref} is for target {spec.target!r}, which no device of "
                f"this app has",
                f"its devices' targets: {', '.join(targets)}",
            )
        specs[spec.target] = spec
    return tuple(specs.values())


class _Packages:
    """The packages an app can refer to: those it lists, then those on PLEX_PATH (loaded lazily)."""

    def __init__(
        self,
        doc: TomlDocument,
        folder: Path,
        listed: list[str],
        plex_path: str,
        *,
        allow_outside_sources: bool,
    ) -> None:
        self._allow_outside_sources = allow_outside_sources
        self._loaded: dict[str, tuple[PackageManifest, TomlDocument]] = {}
        self._listed_at: dict[str, KeyPath] = {}
        for i, relative in enumerate(listed):
            at = ("app", "packages", i)
            package_folder = (folder / relative).resolve()
            if not (package_folder / MANIFEST_NAME).is_file():
                what = "no plex.toml in" if package_folder.is_dir() else "folder not found:"
                raise doc.error(at, f"not a package: {what} {package_folder}")
            package, package_doc = self._read(package_folder)
            name = package.spec.name
            if name in self._loaded:
                other = self._loaded[name][0].spec.path
                if other == package_folder:
                    raise doc.error(at, f"{relative!r} is listed twice")
                raise doc.error(
                    at,
                    f"two packages are named {name!r}: {other} and {package_folder}",
                    "rename one or list only one",
                )
            self._loaded[name] = (package, package_doc)
            self._listed_at[name] = at
        self.listed = tuple(package for package, _ in self._loaded.values())

        self._installed: dict[str, Path] = {}
        for entry in plex_path.split(os.pathsep):
            root = Path(entry).expanduser().resolve() if entry else None
            if root is None or not root.is_dir():
                continue  # like PATH: empty or missing entries are skipped
            for manifest in sorted(root.glob(f"*/{MANIFEST_NAME}")):
                self._index(doc, manifest)

    def _index(self, doc: TomlDocument, manifest: Path) -> None:
        table = TomlDocument.read(manifest).data.get("package")
        name = table.get("name") if isinstance(table, dict) else None
        if not isinstance(name, str):
            name = self._read(manifest)[0].spec.name  # raises the precise error
        package_folder = manifest.parent
        if name in self._loaded and self._loaded[name][0].spec.path != package_folder:
            raise doc.error(
                self._listed_at[name],
                f"two packages are named {name!r}: "
                f"{self._loaded[name][0].spec.path} (listed here) and {package_folder} "
                f"(on {PLEX_PATH})",
                f"list only one, or take it off {PLEX_PATH}",
            )
        other = self._installed.setdefault(name, package_folder)
        if other != package_folder:
            raise ManifestError(
                f"two packages on {PLEX_PATH} are named {name!r}: {other} and {package_folder}",
                file=manifest,
                hint="remove one",
            )

    def _read(self, folder_or_toml: Path) -> tuple[PackageManifest, TomlDocument]:
        return read_package(folder_or_toml, allow_outside_sources=self._allow_outside_sources)

    def get(self, name: str) -> PackageManifest | None:
        if name not in self._loaded and name in self._installed:
            self._loaded[name] = self._read(self._installed[name])
        loaded = self._loaded.get(name)
        return loaded[0] if loaded else None

    def resolve(self, doc: TomlDocument, at: KeyPath, text: str, kind: str) -> Any:
        """The graph, weights or tuning spec (`kind`) that `package:name` names."""
        ref = split_ref(text)
        if ref is None:
            raise doc.error(at, f"invalid reference {text!r}", "expected 'package:name'")
        package = self.get(ref[0])
        if package is None:
            names = sorted({*self._loaded, *self._installed})
            message, hint = unknown(ref[0], names, what="package")
            raise doc.error(at, message, f"{hint}; add others to [app] packages or {PLEX_PATH}")
        table: Mapping[str, Any] = getattr(package, kind)
        if ref[1] not in table:
            accepted = [spec.ref for spec in table.values()]
            word = {
                "graphs": "graph",
                "weights": "weights",
                "tuning": "tuning spec",
                "backends": "backend",
            }[kind]
            raise doc.error(at, *unknown(text, accepted, what=word))
        return table[ref[1]]

    def weights_of(self, graph: GraphSpec) -> WeightsSpec | None:
        if graph.weights_ref is None:
            return None
        doc = self._loaded[graph.package][1]
        return self.resolve(doc, ("graph", graph.name, "weights"), graph.weights_ref, "weights")

    def check_planned(self, graphs: list[GraphSpec]) -> None:
        """Reject not-implemented features of the graphs selected and the weights they use."""
        for name, (_, doc) in self._loaded.items():
            graph_names = {g.name for g in graphs if g.package == name}
            weights_names = {
                g.weights.name for g in graphs if g.weights and g.weights.package == name
            }
            check_planned(doc, "plex.toml", _package_scope(graph_names, weights_names))

    def specs(self) -> tuple[PackageSpec, ...]:
        return tuple(package.spec for package, _ in self._loaded.values())


def _package_scope(graphs: set[str], weights: set[str]) -> Callable[[KeyPath], bool]:
    def in_scope(path: KeyPath) -> bool:
        if path[0] == "graph":
            return path[1] in graphs
        if path[0] == "weights":
            return path[1] in weights
        return True

    return in_scope


def _select_graphs(doc: TomlDocument, app: AppFile, packages: _Packages) -> list[GraphSpec]:
    if app.app.graphs is None:
        return [g for package in packages.listed for g in package.graphs.values()]
    selected: dict[str, GraphSpec] = {}
    for i, text in enumerate(app.app.graphs):
        graph = packages.resolve(doc, ("app", "graphs", i), text, "graphs")
        if graph.ref in selected:
            raise doc.error(("app", "graphs", i), f"{text!r} is listed twice")
        selected[graph.ref] = graph
    return list(selected.values())


# A CUDA device built for Hopper (`arch = "sm_90a"`) uses the kernel library unless it says
# `kernels = "none"`: IREE 3.13 has no sm_90 target, so its own code for such a device is sm_80
# PTX (DEFAULT_CUDA_ARCH, JIT-compiled by the driver), far below the library's sm_90a kernels on
# the contractions they cover (docs/kernels.md, "On by default for Hopper"). The attention
# library: the HF and timm zoo's attention is SDPA, which it takes.
HOPPER_KERNELS = "triton-attention"
NO_KERNELS = "none"
TRITON_HINT = 'pip install -e ".[kernels]" (Triton 3.9.0, needed only to build)'


def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_arch_and_kernels(
    name: str, arch: str | None, kernels: str | None
) -> tuple[str, str | None]:
    """(the arch IREE generates code for, the kernel library) of a CUDA device.

    `arch = "sm_90a"` names Hopper: IREE's code stays sm_80 PTX and the library is on by
    default; without Triton installed the build warns how to get it and falls back to IREE's
    codegen (the variant then runs on any GPU the sm_80 PTX runs on). `kernels = "none"` turns
    the library off; a library named explicitly is kept (its build says Triton is missing)."""
    hopper = arch == KERNELS_CUDA_ARCH
    codegen_arch = DEFAULT_CUDA_ARCH if hopper else (arch or DEFAULT_CUDA_ARCH)
    if kernels == NO_KERNELS:
        return codegen_arch, None
    if kernels is not None or not hopper:
        return codegen_arch, kernels
    if not _triton_installed():
        warnings.warn(
            BuildWarning(
                f'device {name!r} (arch = "{KERNELS_CUDA_ARCH}") would use the kernel library '
                f"({HOPPER_KERNELS}), but Triton is not installed: built with IREE's sm_80 code "
                f'instead, slower on Hopper; {TRITON_HINT}, or say kernels = "{NO_KERNELS}"'
            ),
            stacklevel=2,
        )
        return codegen_arch, None
    return codegen_arch, HOPPER_KERNELS


def _devices(doc: TomlDocument, app: AppFile) -> dict[str, DeviceSpec]:
    tables = app.devices or {"cpu": DeviceTable()}
    devices: dict[str, DeviceSpec] = {}
    for name, d in tables.items():
        at = ("devices", name)
        if not re.fullmatch(NAME, name):
            raise doc.error(at, f"invalid device name {name!r}; must match {NAME}")
        options = TARGET_OPTIONS[d.target]
        given = {
            "cpu": d.cpu,
            "cpu_features": d.cpu_features,
            "data_tiling": d.data_tiling,
            "result_storage": d.result_storage,
            "compute": d.compute,
            "matmul_tiles": d.matmul_tiles,
            "reductions": d.reductions,
            "relayout_tiles": d.relayout_tiles,
            "conv_batch": d.conv_batch,
            "arch": d.arch,
            "kernels": d.kernels,
        }
        for option, value in given.items():
            if value is not None and option not in options:
                hint = (
                    f"options of {d.target}: {', '.join(options)}"
                    if options
                    else f"{d.target} takes no options"
                )
                raise doc.error((*at, option), f"does not apply to target {d.target!r}", hint)
        for option, default in options.items():
            if default is None and given[option] is None:
                example = _REQUIRED_OPTION_EXAMPLE.get(option, option)
                raise doc.error(at, f"target {d.target!r} needs {option!r}", f"e.g. {example}")
        drivers = DRIVERS_OF_TARGET[d.target]
        if d.driver is not None and d.driver not in drivers:
            raise doc.error(
                (*at, "driver"),
                f"driver {d.driver!r} cannot run target {d.target!r}",
                f"accepted for {d.target}: {', '.join(drivers)}",
            )
        value = {o: given[o] if given[o] is not None else options.get(o) for o in given}
        if d.target == "cuda":
            value["arch"], value["kernels"] = _cuda_arch_and_kernels(name, d.arch, d.kernels)
        devices[name] = DeviceSpec(
            name=name,
            target=d.target,
            driver=d.driver or drivers[0],
            driver_pinned=d.driver is not None,
            cpu=value["cpu"],
            cpu_features=value["cpu_features"],
            data_tiling=d.data_tiling,  # unset: chosen for the CPU at plan time
            result_storage=bool(value["result_storage"]),
            compute=d.compute,  # unset: chosen for the weights and the CPU at plan time
            matmul_tiles=d.matmul_tiles,  # unset: chosen for the CPU at plan time
            reductions=d.reductions,  # unset: chosen for the CPU at plan time
            relayout_tiles=d.relayout_tiles,  # unset: chosen for the CPU at plan time
            conv_batch=d.conv_batch,  # unset: chosen with data tiling at plan time
            arch=value["arch"],
            kernels=value["kernels"] or None,
        )
    return devices


def _backend_devices(
    doc: TomlDocument, app: AppFile, packages: _Packages, devices: dict[str, DeviceSpec]
) -> dict[str, DeviceSpec]:
    """Devices with `backend`: the backend resolved (`package:name`, or a name that one listed
    package exports). Such a device is a host-memory device of a host driver (myelin.backends):
    local-task (IREE's worker pool, the default) or local-sync (inline on the calling thread)."""
    out = dict(devices)
    for name, table in app.devices.items():
        if table.backend is None:
            continue
        at = ("devices", name, "backend")
        if table.target != "llvm-cpu" or (table.driver or "local-task") not in HOST_DRIVERS:
            raise doc.error(
                at,
                "a backend device runs on a host driver (local-task or local-sync) with target "
                "llvm-cpu",
                "remove target, and set driver to local-task (the default) or local-sync",
            )
        if ":" in table.backend:
            backend = packages.resolve(doc, at, table.backend, "backends")
        else:
            found = [
                p.backends[table.backend] for p in packages.listed if table.backend in p.backends
            ]
            if len(found) != 1:
                names = [b.ref for p in packages.listed for b in p.backends.values()]
                if not found:
                    raise doc.error(at, *unknown(table.backend, names, what="backend"))
                raise doc.error(
                    at,
                    f"{len(found)} packages export backend {table.backend!r}",
                    "name it as 'package:name'",
                )
            backend = found[0]
        out[name] = replace(devices[name], backend=backend)
    return out


def _check_backend_rule(doc: TomlDocument, rule: PlacementRule, device: DeviceSpec) -> None:
    """An op rule needs a backend device that implements the op; a backend device runs only
    ops its backend implements, so whole graphs or functions cannot be placed on it."""
    at = ("placement", rule.pattern)
    backend = device.backend
    if rule.op is None:
        if backend is not None:
            raise doc.error(
                at,
                f"device {device.name!r} is backend {backend.ref}: it runs ops, not graphs",
                f'place ops on it: "{rule.module_glob}:{backend.ops[0]}" = "{device.name}"',
            )
        return
    if backend is None:
        raise doc.error(
            at,
            f"device {device.name!r} has no backend; only a backend device takes op placements",
            'add backend = "package:name" to the device',
        )
    if rule.op not in backend.ops:
        raise doc.error(
            at,
            f"backend {backend.ref} does not implement {rule.op!r}",
            f"it implements: {', '.join(backend.ops)}",
        )


def _check_not_only_backends(
    doc: TomlDocument, at: tuple[str | int, ...], variant: str, devices: Iterable[DeviceSpec]
) -> None:
    """A backend device runs only the ops placed on it, so a variant needs another device for
    the rest of the model (without one, IREE's compile fails deep inside with no clue why)."""
    members = list(devices)
    if members and all(d.backend is not None for d in members):
        raise doc.error(
            at,
            f"variant {variant!r} has only backend devices ({', '.join(d.name for d in members)}):"
            " a backend device runs only the ops placed on it, not the rest of the model",
            'add a device for the rest, e.g. [devices.cpu] target = "llvm-cpu"',
        )


def _variants(
    doc: TomlDocument, app: AppFile, devices: dict[str, DeviceSpec]
) -> tuple[VariantSpec, ...]:
    if not app.variant:
        _check_not_only_backends(doc, ("devices",), "default", devices.values())
        return (VariantSpec("default", tuple(devices.values())),)
    variants: dict[str, VariantSpec] = {}
    for i, v in enumerate(app.variant):
        if v.name in variants:
            raise doc.error(("variant", i, "name"), f"variant {v.name!r} is declared twice")
        members: dict[str, DeviceSpec] = {}
        for j, device in enumerate(v.devices):
            at = ("variant", i, "devices", j)
            if device not in devices:
                raise doc.error(at, *unknown(device, devices, what="device"))
            if device in members:
                raise doc.error(at, f"{device!r} is listed twice")
            members[device] = devices[device]
        _check_not_only_backends(doc, ("variant", i, "devices"), v.name, members.values())
        variants[v.name] = VariantSpec(v.name, tuple(members.values()))
    return tuple(variants.values())
