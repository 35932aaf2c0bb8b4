"""Loading external backends from a .mln: vendor libraries and plugin through memfds.

IREE's local executable loaders take executable plugins from the `--executable_plugin` flag,
read when a driver is created; the Python runtime creates one driver per name per process. So
a backend's plugin is registered before the process creates the driver of its device
(local-task, or local-sync), and a model with a backend loaded after that driver was created is
refused with that reason (load it first, or in its own process).
Nothing touches the disk: each library and the plugin are copied from their `backend` sections
into anonymous memfds and loaded from `/proc/self/fd/N` (the vendor libraries first, with
RTLD_GLOBAL, so the plugin's links to them resolve by soname).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from myelin.backends import ABI_VERSION
from myelin.errors import DeviceUnavailable
from myelin.mln import BackendRecord, MlnReader

_LOCK = threading.Lock()
# plugin sha256 -> the loaded backend; a plugin is loaded once per process
_LOADED: dict[str, LoadedBackend] = {}
# drivers created in this process (by myelin.runtime.devices) before a plugin was registered
_DRIVERS_CREATED: set[str] = set()


@dataclass
class LoadedBackend:
    name: str
    ops: tuple[str, ...]
    plugin_fd: int
    handle: ctypes.CDLL
    library_fds: tuple[int, ...]
    # drivers that existed when the plugin was registered: it never reaches them
    missed_drivers: frozenset[str] = frozenset()


def note_driver_created(driver: str) -> None:
    """Called by the device registry: plugins registered after this do not reach `driver`."""
    with _LOCK:
        _DRIVERS_CREATED.add(driver)


def loaded_backends() -> list[LoadedBackend]:
    with _LOCK:
        return list(_LOADED.values())


def _memfd(name: str, data: memoryview) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = data
    while view:
        written = os.write(fd, view)
        view = view[written:]
    return fd


# Threads a backend's vendor library gets by default: one. The compiler splits each backend call
# into workgroups (myelin.compiler.backend_ops) that the local-task pool runs on its workers, so
# the parallelism is IREE's; a vendor pool of its own on top oversubscribes the cores (measured
# on MiniLM, 2 vCPUs: OpenBLAS with 2 threads under IREE's 2 workers took 4x the CPU time).
DEFAULT_BACKEND_THREADS = 1


def load_backend(
    reader: MlnReader,
    record: BackendRecord,
    drivers: Iterable[str] = ("local-task",),
    *,
    threads: int = DEFAULT_BACKEND_THREADS,
) -> LoadedBackend:
    """Load one backend's libraries and plugin from the artifact and register the plugin, which
    reaches the `drivers` of the backend's devices only if none of them exists yet."""
    path = reader.path
    if record.abi != ABI_VERSION:
        raise DeviceUnavailable(
            f"{path.name}: backend '{record.name}' was built for backend ABI {record.abi}; this "
            f"runtime has ABI {ABI_VERSION}; rebuild the artifact with this PLeX"
        )
    sections = reader.sections
    for name in (record.plugin, *record.libraries):
        if name not in sections:
            raise DeviceUnavailable(
                f"{path.name}: backend '{record.name}' is missing its section {name!r}; the "
                "artifact is incomplete, rebuild it"
            )
    plugin = reader.section_view(record.plugin)
    digest = hashlib.sha256(plugin).hexdigest()
    with _LOCK:
        loaded = _LOADED.get(digest)
        missed = loaded.missed_drivers if loaded is not None else _DRIVERS_CREATED
        created = sorted(missed.intersection(drivers))
        if loaded is not None and not created:
            return loaded
        if created:
            raise DeviceUnavailable(
                f"{path.name}: backend '{record.name}' must be loaded before this process "
                f"creates its first {created[0]} device (IREE reads executable plugins when "
                "it creates the driver); load this model first, or in a process of its own"
            )
        library_fds = []
        for name in record.libraries:
            fd = _memfd(name.rpartition("/")[2], reader.section_view(name))
            try:
                ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise DeviceUnavailable(
                    f"{path.name}: backend '{record.name}': vendor library {name!r} does not "
                    f"load here: {e}"
                ) from e
            library_fds.append(fd)
        fd = _memfd(f"{record.name}-plugin.so", plugin)
        try:
            handle = ctypes.CDLL(f"/proc/self/fd/{fd}")
            abi = handle.plex_backend_abi_version()
        except (OSError, AttributeError) as e:
            raise DeviceUnavailable(
                f"{path.name}: backend '{record.name}': its plugin does not load here: {e}"
            ) from e
        if abi != ABI_VERSION:
            raise DeviceUnavailable(
                f"{path.name}: backend '{record.name}': the plugin reports ABI {abi}, the "
                f"manifest {record.abi}; the artifact is inconsistent, rebuild it"
            )
        handle.plex_backend_set_threads(ctypes.c_int(threads))
        import iree.runtime as rt

        rt.flags.parse_flags(f"--executable_plugin=/proc/self/fd/{fd}")
        loaded = LoadedBackend(
            record.name, record.ops, fd, handle, tuple(library_fds), frozenset(_DRIVERS_CREATED)
        )
        _LOADED[digest] = loaded
        return loaded


def set_backend_threads(threads: int) -> None:
    """Threads every loaded backend's vendor library may use per call (default 1: the
    parallelism comes from the workgroups of each call, run by IREE's worker pool)."""
    for backend in loaded_backends():
        backend.handle.plex_backend_set_threads(ctypes.c_int(threads))
