"""Loading external backends from a .mln: vendor libraries and plugin through memfds.

IREE's local executable loaders take executable plugins from the `--executable_plugin` flag,
read when a driver is created; the Python runtime creates one driver per name per process. So
a backend's plugin is registered before the process creates the driver of its device
(local-task, or local-sync), and a model with a backend loaded after that driver was created is
refused with that reason (load it first, or in its own process).
Nothing touches the disk: each library and the plugin are copied from their `backend` sections
into sealed memfds, hashed there against the manifest (whatever `verify` says: an unhashed plugin
is never loaded), and loaded from `/proc/self/fd/N` (the vendor libraries first, with
RTLD_GLOBAL, so the plugin's links to them resolve by soname). A sealed memfd cannot be written
by anyone, so the bytes the dynamic loader maps are the bytes that were hashed.

Whether a file's native code may be loaded at all (a trust key, or the caller's opt-in) is the
model's decision (myelin.runtime.model), made after the variant is chosen; this module loads only
what it is given.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from myelin.backends import ABI_VERSION
from myelin.errors import ArtifactError, DeviceUnavailable
from myelin.mln import BackendRecord, MlnReader, sealed_memfd, sha256_of

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


def drivers_created() -> frozenset[str]:
    """The HAL drivers this process has created (what note_driver_created was told)."""
    with _LOCK:
        return frozenset(_DRIVERS_CREATED)


def loaded_backends() -> list[LoadedBackend]:
    with _LOCK:
        return list(_LOADED.values())


def _hashed_memfd(reader: MlnReader, section: str, name: str) -> int:
    """A sealed memfd holding `section`, its copy hashed against the manifest; ArtifactError
    (the fd closed) when the copy is not what the manifest (and a signature over it) says."""
    fd = sealed_memfd(name, reader.section_view(section))
    try:
        if reader.sections[section].length == 0:  # nothing to map (and mmap refuses to)
            digest = sha256_of(memoryview(b"")).hex()
        else:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as copy, memoryview(copy) as view:
                digest = sha256_of(view).hex()
    except BaseException:
        os.close(fd)
        raise
    if digest != reader.sections[section].sha256:
        os.close(fd)
        raise ArtifactError(
            f"{reader.path}: section {section!r} is corrupt (sha256 mismatch); the file was "
            "damaged after it was built — rebuild or re-copy it"
        )
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
    # Copied and hashed first, before anything is looked up or loaded: a plugin whose bytes
    # are not the manifest's is refused as damaged, whatever this process has loaded so far.
    fds: list[int] = []
    try:
        for name in record.libraries:
            fds.append(_hashed_memfd(reader, name, name.rpartition("/")[2]))
        fds.append(_hashed_memfd(reader, record.plugin, f"{record.name}-plugin.so"))
        loaded = _register(reader, record, fds, drivers, threads)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if loaded.plugin_fd != fds[-1]:  # this plugin was loaded before: these copies are unused
        for fd in fds:
            os.close(fd)
    return loaded


def _register(
    reader: MlnReader,
    record: BackendRecord,
    fds: list[int],
    drivers: Iterable[str],
    threads: int,
) -> LoadedBackend:
    """dlopen the hashed copies (`fds`: the libraries, then the plugin) and hand the plugin to
    IREE, once per plugin per process."""
    path = reader.path
    digest = reader.sections[record.plugin].sha256  # the bytes of fds[-1], checked
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
        *library_fds, fd = fds
        for name, library_fd in zip(record.libraries, library_fds, strict=True):
            try:
                ctypes.CDLL(f"/proc/self/fd/{library_fd}", mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise DeviceUnavailable(
                    f"{path.name}: backend '{record.name}': vendor library {name!r} does not "
                    f"load here: {e}"
                ) from e
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
