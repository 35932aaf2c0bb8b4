"""A loaded .mln: the chosen variant, its VM modules and its parameters, all backed by one mmap."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import iree.runtime as rt

from myelin.errors import (
    ArtifactError,
    DeviceUnavailable,
    EntrypointNotFound,
    ModelClosed,
    NativeCodeRefused,
)
from myelin.mln import (
    RESIDENCY_MODES,
    ArtifactManifest,
    EntrypointRecord,
    KeySource,
    MlnReader,
    VariantRecord,
)
from myelin.runtime.admission import AdmissionBudget, CallNeed, FootprintFormula
from myelin.runtime.devices import DeviceRegistry, host_drivers
from myelin.runtime.parameter_memory import collect as collect_parameter_memory
from myelin.runtime.parameter_memory import parameter_pages, wrap_mapping
from myelin.runtime.residency import ParameterResidency
from myelin.signature import Signature, TensorSpec, parse_abi_declaration
from myelin.sizes import parse_size

# `memory_budget=FROM_ARTIFACT` (the default) takes the budget the .mln records ([runtime] memory).
FROM_ARTIFACT: Any = object()


@dataclass(frozen=True)
class Entrypoint:
    """A callable function of the loaded variant: its record, the device it runs on and its
    compiled memory plan."""

    record: EntrypointRecord
    device: str  # the variant device it runs on (its arguments and results live there)
    memory: FootprintFormula = field(default_factory=lambda: FootprintFormula.from_record(None))

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def module(self) -> str:
        return self.record.module

    @property
    def function(self) -> str:
        return self.record.function

    @property
    def signature(self) -> Signature:
        return self.record.signature


def choose_variant(
    manifest: ArtifactManifest, registry: DeviceRegistry, wanted: str | None, path: Path
) -> VariantRecord:
    """The named variant, or the first whose devices all exist here."""
    names = [v.name for v in manifest.variants]
    if wanted is not None:
        chosen = manifest.variant(wanted)
        if chosen is None:
            raise DeviceUnavailable(
                f"{path.name} has no variant '{wanted}'; it has: {', '.join(names)}"
            )
        why = why_variant_unusable(chosen, registry)
        if why:
            raise DeviceUnavailable(
                f"{path.name}: variant '{wanted}' cannot run here: {'; '.join(why)}; "
                f"this machine has drivers: {', '.join(registry.usable_drivers())}"
            )
        return chosen
    reasons = []
    for v in manifest.variants:
        why = why_variant_unusable(v, registry)
        if not why:
            return v
        reasons.append(f"'{v.name}': {'; '.join(why)}")
    raise DeviceUnavailable(
        f"no variant of {path.name} can run on this machine ({' | '.join(reasons)}); "
        f"this machine has drivers: {', '.join(registry.usable_drivers()) or 'none'}"
    )


def why_variant_unusable(variant: VariantRecord, registry: DeviceRegistry) -> list[str]:
    """Why a variant cannot run here (empty: it can): each device's own requirements (driver,
    CPU features, CUDA arch), then the number of devices per GPU driver (two CUDA devices need
    two GPUs)."""
    why = [r for r in (registry.why_unusable(d) for d in variant.devices) if r]
    if not why:
        too_few = registry.why_too_few(variant.devices)
        if too_few:
            why.append(too_few)
    return why


def _type_text(spec: TensorSpec) -> str:
    if spec.shape is None:
        return f"{spec.dtype} scalar"
    return f"{spec.dtype}[{', '.join('?' if d is None else str(d) for d in spec.shape)}]"


def check_declared_signature(
    record: EntrypointRecord, function: Any, where: str, path: Path
) -> None:
    """Refuse an entrypoint whose recorded signature is not the function's own: the module's
    `iree.abi.declaration` reflection is what IREE will actually take and return, so a manifest
    pointing an entrypoint at another function (or lying about a shape) fails here, at load,
    instead of returning wrong shapes unchecked."""
    qualified = f"{record.module}.{record.function}"
    try:
        declaration = function.reflection.get("iree.abi.declaration")
    except RuntimeError as e:  # reflection strings that are not UTF-8 (a damaged module)
        raise ArtifactError(
            f"{path}: manifest field {where}.function: {qualified} has unreadable reflection "
            f"({e}); the module section is damaged"
        ) from e
    if declaration is None:
        raise ArtifactError(
            f"{path}: manifest field {where}.function: {qualified} has no "
            "iree.abi.declaration reflection, so it is not an entrypoint PLeX built"
        )
    try:
        declared = parse_abi_declaration(declaration)
    except ValueError as e:
        raise ArtifactError(
            f"{path}: manifest field {where}.function: {qualified} declares a signature this "
            f"runtime cannot read ({e})"
        ) from e
    for key, recorded, actual in (
        ("inputs", record.inputs, declared.inputs),
        ("outputs", record.outputs, declared.outputs),
    ):
        mine = [_type_text(t) for t in recorded]
        theirs = [_type_text(t) for t in actual]
        if mine != theirs:
            verb = "takes" if key == "inputs" else "returns"
            raise ArtifactError(
                f"{path}: manifest field {where}.{key}: records ({', '.join(mine)}) but "
                f"{qualified} {verb} ({', '.join(theirs)}) by its iree.abi.declaration"
            )


class Model:
    """Owns the mapping of the file; sessions borrow its modules and parameter providers.

    Parameters are registered zero-copy: IREE wraps the mapping (every parameter section is
    page-aligned): the file's pages, or with `private_copy` the sealed memfd copy of the file
    (myelin.mln.MlnReader). Module and plugin sections are always wrapped from a hashed private
    copy (`MlnReader.code_section`), so the code IREE runs is the code that was checked.

    Native code that the dynamic loader would run in this process (an external backend's plugin
    and vendor libraries) is loaded only for the chosen variant, and only when the file is
    signed by the trusted key or `allow_native_code` is True; otherwise NativeCodeRefused.
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
        trust: KeySource | None = None,
        private_copy: bool | None = None,
        allow_native_code: bool = False,
    ) -> None:
        self.path = Path(path)
        self._vm_instance = vm_instance
        self._lock = threading.Lock()
        self._sessions: set = set()
        self._closed = False
        # Under a trust policy what was verified must be what runs, weights included: the
        # file is copied into sealed memory before it is hashed (see MlnReader).
        self.private_copy = trust is not None if private_copy is None else private_copy
        # With `trust`, the signature is checked here: before any module is wrapped or any
        # parameter registered.
        self._reader = MlnReader(
            self.path, verify=verify, trust=trust, private_copy=self.private_copy
        )
        self._native_code_trusted = trust is not None or allow_native_code
        try:
            self.artifact_manifest: ArtifactManifest = self._reader.artifact_manifest
            # The JSON as stored, for tools and tests that print or compare it; the runtime
            # itself reads only the records.
            self.manifest: dict[str, Any] = self._reader.manifest
            # Chosen without creating a host driver (myelin.runtime.devices), so that the
            # chosen variant's plugins, loaded next, still reach it: IREE reads executable
            # plugins when it creates a driver. No other variant's plugin is ever loaded.
            self.variant_record = choose_variant(
                self.artifact_manifest, registry, variant, self.path
            )
            self.backends = self._load_backends()
            self.variant: dict[str, Any] = self.manifest["variants"][
                self.artifact_manifest.variants.index(self.variant_record)
            ]
            self.policies: dict[str, Any] = dict(self.manifest.get("policies") or {})
            self.registry = registry
            self._modules = self._load_modules()  # bytecode only: no device needed yet
            # The drivers this host runs the devices on, and the choices it made for them
            # (myelin.runtime.devices.host_drivers): {device: {option: {"value", "reason"}}}.
            drivers, self.host_chosen = host_drivers(self.variant_record.devices)
            self.drivers: list[str] = drivers
            self.devices = registry.devices_for(drivers)
            registry.open_peer_paths(self.devices)
            self.device_names = [d.name for d in self.variant_record.devices]
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
        return self.artifact_manifest.app.name

    def _load_backends(self) -> list:
        """The external backends of the chosen variant's devices (myelin.runtime.backends), once
        the caller has said native code from this file may run here."""
        records: dict[str, tuple[Any, set[str]]] = {}
        for d in self.variant_record.devices:
            if d.backend is not None:  # the drivers its plugin must reach
                records.setdefault(d.backend.name, (d.backend, set()))[1].add(d.driver)
        if not records:
            return []
        if not self._native_code_trusted:
            names = ", ".join(f"'{name}'" for name in records)
            raise NativeCodeRefused(
                f"{self.path}: variant '{self.variant_record.name}' carries native code (the "
                f"plugin of backend {names}) that would run in this process as it loads; load "
                "it only from a file you trust: sign it (`plex sign`) and load with a trust key "
                "(Instance(trust=PUB), --trust PUB), or opt in with "
                "Instance(allow_native_code=True) / --allow-native-code"
            )
        from myelin.runtime.backends import load_backend

        return [load_backend(self._reader, r, drivers) for r, drivers in records.values()]

    @property
    def variant_name(self) -> str:
        return self.variant_record.name

    def _variant_path(self) -> str:
        index = self.artifact_manifest.variants.index(self.variant_record)
        return f"variants[{index}]"

    def _load_modules(self) -> list[rt.VmModule]:
        modules = []
        for m in self.variant_record.modules:
            # Hashed in private memory whatever `verify` says (verify=False is meant to skip
            # hashing gigabytes of weights): IREE's bytecode loader is not robust against
            # damaged bytes (fuzzing found a 4-byte change that made wrap_buffer allocate
            # 2.7 GB and hang), and bytes that change after their check would run unchecked.
            view = self._reader.code_section(m.section)
            try:
                module = rt.VmModule.wrap_buffer(self._vm_instance, view)
                # a name that is not UTF-8 fails its conversion here (RuntimeError): found by
                # tools/fuzz.py on a module section changed under verify=False
                name = module.name
            except Exception as e:
                raise ArtifactError(
                    f"{self.path}: module '{m.name}' is not valid VM bytecode: {e}"
                ) from e
            if name != m.name:
                raise ArtifactError(
                    f"{self.path}: section of module '{m.name}' holds module '{module.name}'"
                )
            modules.append(module)
        return modules

    def _parameter_ranges(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(scope, key) -> (file offset, length) of every parameter this variant reads."""
        sections = self._reader.sections
        return {
            (p.scope, p.key): (sections[p.section].offset + p.offset, p.length)
            for p in self.artifact_manifest.parameters_in(self.variant_record.parameter_scopes)
        }

    def _residency(self, override: str | None, lock: bool) -> ParameterResidency:
        policy = override or self.artifact_manifest.runtime_policies.residency
        if policy not in RESIDENCY_MODES:
            raise ValueError(
                f"residency= unknown residency {policy!r}; expected one of "
                f"{', '.join(RESIDENCY_MODES)}"
            )
        if lock and policy != "resident":
            raise ValueError(
                f"lock_weights=True keeps weights in memory, which residency {policy!r} gives "
                "back; use residency='resident' or drop lock_weights"
            )
        return ParameterResidency(self._reader.mmap, self._parameter_ranges(), policy, lock=lock)

    def _budget(self, override: int | str | None) -> AdmissionBudget | None:
        recorded = self.artifact_manifest.runtime_policies.memory_budget
        limit = recorded if override is FROM_ARTIFACT else override
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
        scopes = list(self.variant_record.parameter_scopes)
        if not scopes:
            return []
        parameters = self.artifact_manifest.parameters_in(scopes)
        sections = self._reader.sections
        start, end = parameter_pages(
            [sections[p.section] for p in parameters], self._reader.file_size
        )
        # Not FileHandle.wrap_memory(mmap) itself: IREE can release what it wraps on one of its
        # worker threads, without the GIL (myelin.runtime.parameter_memory).
        handle = wrap_mapping(self._reader.mmap, start, end)
        indexes = {scope: rt.ParameterIndex() for scope in scopes}
        for p in parameters:
            section = sections[p.section]
            indexes[p.scope].add_from_file_handle(
                p.key, handle, p.length, offset=section.offset + p.offset - start
            )
        self._file_handle = handle
        return [indexes[s].create_provider(scope=s) for s in scopes]

    def _entrypoints(self) -> dict[str, Entrypoint]:
        """Every callable name (VariantRecord.callable_entrypoints), each entrypoint checked
        against its function's own reflection."""
        by_module = {m.name: m for m in self._modules}
        where_of = self._variant_path()
        loaded: dict[str, Entrypoint] = {}
        for i, e in enumerate(self.variant_record.entrypoints):
            where = f"{where_of}.entrypoints[{i}]"
            module = by_module.get(e.module)
            function = module.lookup_function(e.function) if module is not None else None
            if function is None:
                raise ArtifactError(
                    f"{self.path}: manifest field {where}.function: entrypoint '{e.name}' names "
                    f"missing function {e.module}.{e.function}"
                )
            check_declared_signature(e, function, where, self.path)
            loaded[e.name] = Entrypoint(
                e,
                self.variant_record.device_of(e).name,
                FootprintFormula.from_record(e.memory),
            )
        return {
            name: loaded[e.name] for name, e in self.variant_record.callable_entrypoints().items()
        }

    def reflection(self, name: str) -> dict[str, str]:
        """The reflection strings of entrypoint `name`'s function: IREE's ABI entries and what
        a frontend recorded beside the code (a causal LM's record and tokenizer)."""
        entry = self.entrypoint(name)
        module = next(m for m in self._modules if m.name == entry.module)
        return dict(module.lookup_function(entry.function).reflection)

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

    def session(self, *, profile: bool = False, spin_us: float = 0.0):
        """A new session: its own VM context over this model's modules and parameters.

        `spin_us` > 0: an async call (entrypoints built `cancellable`, as CUDA ones are) blocks
        on its fence until shortly before the time its previous call took, then polls it for up
        to `spin_us` microseconds before blocking again: it returns sooner after the GPU is done
        and burns a CPU core meanwhile (docs/runtime.md, "Overhead"). A `spin_us` longer than
        the call polls from the start, as CUDA's own synchronize does by default on a host with
        more cores than GPUs (what torch's `torch.cuda.synchronize()` waits with). 0 (the
        default) blocks.

        `profile=True` is refused: IREE 3.13's Python runtime has no profile sink, so captures
        run through IREE's tools (`plex profile`, `myelin.runtime.profiling.capture`).
        """
        from myelin.runtime.session import Session

        if self._closed:
            raise ModelClosed(
                f"{self.path.name}: the model is closed; load it again for a new session"
            )
        if profile:
            from myelin.errors import ProfilingUnavailable

            raise ProfilingUnavailable(
                "in-process profiling is not available in IREE 3.13's Python runtime (it has no "
                f"profile sink); capture with `plex profile {self.path.name} -f NAME -o DIR`"
            )
        session = Session(self, spin_us=spin_us)
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
        host = self._host_functions()
        if host is not None:  # ONNX host fallback (myelin.runtime.host_ops)
            fences = "--iree-execution-model=async-external" in (self.variant_record.flags or ())
            modules.append(host.vm_module(self._vm_instance, self.devices[0], fences=fences))
        modules.extend(self._modules)
        return self.devices, modules

    def _host_functions(self):
        """The host functions the variant's modules import, or None (made once per model)."""
        if not hasattr(self, "_host"):
            functions = [f for m in self.variant_record.modules for f in m.host_functions]
            self._host = None
            if functions:
                from myelin.runtime.host_ops import HostFunctions

                self._host = HostFunctions(functions, self._reader.section_view)
        return self._host

    def close(self) -> None:
        self._closed = True
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
        collect_parameter_memory()  # what IREE has let go of by now (the rest: at a later load)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<myelin.Model {self.name} variant={self.variant_name} path={self.path}>"
