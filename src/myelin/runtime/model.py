"""A loaded .mln: the chosen variant, its VM modules and its parameters, all backed by one mmap."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import iree.runtime as rt

from myelin.errors import ArtifactError, DeviceUnavailable, EntrypointNotFound
from myelin.mln import MlnReader
from myelin.runtime.admission import AdmissionBudget, CallNeed, MemoryPlan
from myelin.runtime.devices import DeviceRegistry, DeviceRequirement
from myelin.runtime.residency import RESIDENCY_MODES, ParameterResidency
from myelin.signature import Signature, TensorSpec
from myelin.sizes import parse_size

# `memory_budget=FROM_ARTIFACT` (the default) takes the budget the .mln records ([runtime] memory).
FROM_ARTIFACT: Any = object()


@dataclass(frozen=True)
class Entrypoint:
    """A callable function of the loaded variant."""

    name: str
    module: str
    function: str
    signature: Signature
    device: str = ""  # the variant device it runs on (its arguments and results live there)
    memory: MemoryPlan = field(default_factory=lambda: MemoryPlan.from_json(None))


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
        memory_budget: int | str | None = FROM_ARTIFACT,
        residency: str | None = None,
        lock_weights: bool = False,
    ) -> None:
        self.path = Path(path)
        self._vm_instance = vm_instance
        self._lock = threading.Lock()
        self._sessions: set = set()
        self._reader = MlnReader(self.path, verify=verify)
        try:
            self.manifest = self._reader.manifest
            # Runtime policies the build recorded; load arguments override them.
            self.policies: dict[str, Any] = dict(self.manifest.get("policies") or {})
            self.variant = choose_variant(self.manifest, registry, variant, self.path)
            self.registry = registry
            self.devices = registry.devices_for([d["driver"] for d in self.variant["devices"]])
            self.device_names = [d["name"] for d in self.variant["devices"]]
            self._modules = self._load_modules()
            self._providers = self._parameter_providers()
            self.entrypoints = self._entrypoints()
            self.residency = self._residency(residency, lock_weights)
            self.budget = self._budget(memory_budget)
            self.residency.on_load()
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

    def _parameter_ranges(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(scope, key) -> (file offset, length) of every parameter this variant reads."""
        scopes = set(self.variant.get("parameter_scopes", []))
        ranges = {}
        for p in self.manifest["parameters"]:
            if p["scope"] in scopes:
                section = self._reader.sections[p["section"]]
                ranges[(p["scope"], p["key"])] = (section.offset + p["offset"], p["length"])
        return ranges

    def _residency(self, override: str | None, lock: bool) -> ParameterResidency:
        policy = override or self.policies.get("residency") or "resident"
        if policy not in RESIDENCY_MODES:
            where = "residency=" if override else f"{self.path}: the artifact's"
            error = ValueError if override else ArtifactError
            raise error(
                f"{where} unknown residency {policy!r}; expected one of "
                f"{', '.join(RESIDENCY_MODES)}"
            )
        if lock and policy != "resident":
            raise ValueError(
                f"lock_weights=True keeps weights in memory, which residency {policy!r} gives "
                "back; use residency='resident' or drop lock_weights"
            )
        return ParameterResidency(self._reader.mmap, self._parameter_ranges(), policy, lock=lock)

    def _budget(self, override: int | str | None) -> AdmissionBudget | None:
        limit = self.policies.get("memory_budget") if override is FROM_ARTIFACT else override
        if limit is None:
            return None
        if isinstance(limit, str):
            limit = parse_size(limit)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"memory_budget must be a byte count or a size like '2GiB', got {limit!r}"
            )
        return AdmissionBudget(
            limit,
            self.residency.parameter_bytes,
            f"{self.path.name} variant '{self.variant_name}'",
        )

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
            device = e.get("device") or self.device_names[0]
            entries[e["name"]] = Entrypoint(
                e["name"],
                e["module"],
                e["function"],
                sig,
                device,
                memory=MemoryPlan.from_json(e.get("memory")),
            )
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

    def hal_device(self, name: str) -> rt.HalDevice:
        """The HAL device of the variant device `name` (an entrypoint's `device`)."""
        return self.devices[self.device_names.index(name)]

    def call_need(self, entry: Entrypoint | str, inputs: list) -> CallNeed:
        """Bytes a call of `entry` with these inputs needs besides the parameters: what we
        upload, plus the transient and result allocations the build derived from the IR."""
        if isinstance(entry, str):
            entry = self.entrypoint(entry)
        return entry.memory.need(entry.name, inputs)

    def session(self, *, profile: bool = False):
        """A new session: its own VM context over this model's modules and parameters.

        `profile=True` is refused: IREE 3.13's Python runtime has no profile sink, so captures
        run through IREE's tools (`plex profile`, `myelin.runtime.profiling.capture`).
        """
        from myelin.runtime.session import Session

        if profile:
            from myelin.errors import ProfilingUnavailable

            raise ProfilingUnavailable(
                "in-process profiling is not available in IREE 3.13's Python runtime (it has no "
                f"profile sink); capture with `plex profile {self.path.name} -f NAME -o DIR`"
            )
        session = Session(self)
        with self._lock:
            self._sessions.add(session)
        self.residency.after_upload()
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
