"""A loaded .mln: the chosen variant, its VM modules and its parameters, all backed by one mmap."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import iree.runtime as rt

from myelin.errors import ArtifactError, DeviceUnavailable, EntrypointNotFound
from myelin.mln import MlnReader
from myelin.runtime.devices import DeviceRegistry, DeviceRequirement
from myelin.signature import Signature, TensorSpec


@dataclass(frozen=True)
class Entrypoint:
    """A callable function of the loaded variant."""

    name: str
    module: str
    function: str
    signature: Signature


def _requirements(variant: dict) -> list[DeviceRequirement]:
    reqs = []
    for d in variant["devices"]:
        requires = d.get("requires") or {}
        reqs.append(
            DeviceRequirement(
                name=d["name"],
                target=d["target"],
                driver=d["driver"],
                cpu_flags=frozenset(requires.get("cpu_flags", ())),
            )
        )
    return reqs


def choose_variant(
    manifest: dict, registry: DeviceRegistry, wanted: str | None, path: Path
) -> dict:
    """The named variant, or the first whose devices all exist here."""
    variants = manifest["variants"]
    names = [v["name"] for v in variants]
    if wanted is not None:
        for v in variants:
            if v["name"] == wanted:
                for req in _requirements(v):
                    reason = registry.why_unusable(req)
                    if reason:
                        raise DeviceUnavailable(
                            f"{path.name}: variant '{wanted}' cannot run here: {reason}; "
                            f"this machine has drivers: {', '.join(registry.usable_drivers())}"
                        )
                return v
        raise DeviceUnavailable(
            f"{path.name} has no variant '{wanted}'; it has: {', '.join(names)}"
        )
    reasons = []
    for v in variants:
        why = [r for r in (registry.why_unusable(q) for q in _requirements(v)) if r]
        if not why:
            return v
        reasons.append(f"'{v['name']}': {'; '.join(why)}")
    raise DeviceUnavailable(
        f"no variant of {path.name} can run on this machine ({' | '.join(reasons)}); "
        f"this machine has drivers: {', '.join(registry.usable_drivers()) or 'none'}"
    )


class Model:
    """Owns the mapping of the file; sessions borrow its modules and parameter providers.

    Parameters are registered zero-copy: IREE wraps the mmap (every parameter section is
    page-aligned), so loading a model adds no anonymous memory for its weights.
    """

    def __init__(
        self,
        vm_instance: rt.VmInstance,
        registry: DeviceRegistry,
        path: str | os.PathLike,
        *,
        variant: str | None = None,
        verify: bool = True,
    ) -> None:
        self.path = Path(path)
        self._vm_instance = vm_instance
        self._lock = threading.Lock()
        self._sessions: set = set()
        self._reader = MlnReader(self.path, verify=verify)
        try:
            self.manifest = self._reader.manifest
            self.variant = choose_variant(self.manifest, registry, variant, self.path)
            self.devices = [
                registry.device(d["driver"], ordinal=i)
                for i, d in enumerate(self.variant["devices"])
            ]
            self._modules = self._load_modules()
            self._providers = self._parameter_providers()
            self.entrypoints = self._entrypoints()
        except BaseException:
            self._release()
            raise

    @property
    def name(self) -> str:
        return self.manifest["app"]["name"]

    @property
    def variant_name(self) -> str:
        return self.variant["name"]

    def _load_modules(self) -> list[rt.VmModule]:
        modules = []
        for m in self.variant["modules"]:
            view = self._reader.section_view(m["section"])
            try:
                module = rt.VmModule.wrap_buffer(self._vm_instance, view)
            except Exception as e:
                raise ArtifactError(
                    f"{self.path}: module '{m['name']}' is not valid VM bytecode: {e}"
                ) from e
            if module.name != m["name"]:
                raise ArtifactError(
                    f"{self.path}: section of module '{m['name']}' holds module '{module.name}'"
                )
            modules.append(module)
        return modules

    def _parameter_providers(self) -> list[rt.ParameterProvider]:
        scopes = list(self.variant.get("parameter_scopes", []))
        if not scopes:
            return []
        handle = rt.FileHandle.wrap_memory(self._reader.mmap, readable=True, writable=False)
        indexes = {scope: rt.ParameterIndex() for scope in scopes}
        for p in self.manifest["parameters"]:
            index = indexes.get(p["scope"])
            if index is None:
                continue
            section = self._reader.sections[p["section"]]
            index.add_from_file_handle(
                p["key"], handle, p["length"], offset=section.offset + p["offset"]
            )
        self._file_handle = handle
        return [indexes[s].create_provider(scope=s) for s in scopes]

    def _entrypoints(self) -> dict[str, Entrypoint]:
        by_module = {m.name: m for m in self._modules}
        entries: dict[str, Entrypoint] = {}
        for e in self.variant["entrypoints"]:
            module = by_module.get(e["module"])
            if module is None or module.lookup_function(e["function"]) is None:
                raise ArtifactError(
                    f"{self.path}: entrypoint '{e['name']}' names missing function "
                    f"{e['module']}.{e['function']}"
                )
            sig = Signature(
                inputs=tuple(TensorSpec.from_json(t) for t in e["inputs"]),
                outputs=tuple(TensorSpec.from_json(t) for t in e["outputs"]),
            )
            entries[e["name"]] = Entrypoint(e["name"], e["module"], e["function"], sig)
        # `module.function` always works, so two graphs with a `forward` stay reachable.
        for entry in list(entries.values()):
            entries.setdefault(f"{entry.module}.{entry.function}", entry)
        return entries

    def entrypoint(self, name: str) -> Entrypoint:
        try:
            return self.entrypoints[name]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name, self.entrypoints, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise EntrypointNotFound(
                f"{self.path.name} has no entrypoint '{name}'{hint} "
                f"(it has: {', '.join(sorted(self.entrypoints))})"
            ) from None

    def session(self):
        from myelin.runtime.session import Session

        session = Session(self)
        with self._lock:
            self._sessions.add(session)
        return session

    def _forget(self, session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def _context_modules(self) -> tuple[list[rt.HalDevice], list[rt.VmModule]]:
        """Modules for a new VM context, in registration order (dependencies first)."""
        if len(self.devices) == 1:
            hal = rt.create_hal_module(self._vm_instance, self.devices[0])
        else:
            hal = rt.create_hal_module(self._vm_instance, devices=self.devices)
        modules = [hal]
        if self._providers:
            modules.append(rt.create_io_parameters_module(self._vm_instance, *self._providers))
        modules.extend(self._modules)
        return self.devices, modules

    def close(self) -> None:
        for s in list(self._sessions):
            s.close()
        self._release()

    def _release(self) -> None:
        # IREE keeps raw pointers into the mapping (modules, parameter file handle, executables
        # it loaded) and holds Python references to the objects that own it. Unmapping
        # explicitly could leave those dangling (seen: a crash at interpreter exit), so we only
        # drop our references and the mapping goes with the last holder.
        for attr in ("_modules", "_providers", "_file_handle", "_reader"):
            if hasattr(self, attr):
                delattr(self, attr)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<myelin.Model {self.name} variant={self.variant_name} path={self.path}>"
