"""Finding the HAL devices a variant needs on this machine, and moving device arrays between
them.

A variant's devices are created in its order, with one ordinal per driver: the compiler names
them `name=kind[ordinal]` (myelin.compiler.targets) and IREE matches the n-th device of a kind in
the list given to the HAL module, so `[cpu (local-task), gpu (cuda)]` is local[0] and cuda[0].
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import iree.runtime as rt

from myelin import hostinfo
from myelin.errors import DeviceUnavailable
from myelin.mln import DeviceRecord
from myelin.platforms import HOST_DRIVERS
from myelin.runtime._iree_private import buffer_view_of, device_of
from myelin.runtime.pending import MAX_IN_FLIGHT

# How a CUDA device allocates call results and transients (`Instance(cuda_allocator=...)`):
# - "pool": IREE's default, CUDA stream-ordered allocations from IREE's memory pools. A result
#   the caller drops is freed with a synchronous cuMemFree (IREE frees only queue-deallocated
#   buffers asynchronously), and memory a pool holds above its release threshold goes back to
#   the driver at the next context synchronize (torch.cuda.synchronize()) and is mapped again by
#   the next call.
# - "caching": IREE's caching allocator (`allocators=["caching"]` on the device) over
#   synchronous allocations (`--cuda_async_allocations=false`): a freed buffer is kept and the
#   next allocation of its size reuses it, so a steady stream of calls allocates nothing.
#   Unbounded, it keeps every freed buffer (up to 64) for the life of the process.
# - "caching:<capacity>[;<free count>]": the same, bounded: memory it holds (in use and kept)
#   stays under <capacity> bytes (a suffix K, M, G: KiB, MiB, GiB), and it keeps at most
#   <free count> freed buffers (default 64). Past the bound it frees its oldest kept buffer
#   before allocating. IREE's form of it: `caching:device_local=*;<bytes>;<count>`.
# The free count: as many as a session can have submissions in flight, whose results a serving
# loop drops together. With 16, a burst of 50 submitted GEMVs freed 34 results with a
# synchronous cuMemFree each and allocated them again the next burst: ~0.5 ms a burst, 8% of
# its time on the H200 (docs/benchmarks.md, "Submitted calls").
_CACHING_FREE_COUNT = MAX_IN_FLIGHT

# The allocator of every local-sync device: IREE's caching allocator, bounded (1 GiB). Why: a
# local-sync device allocates a call's transient memory inline on every call, and glibc returns
# blocks that large to the OS on free, so each call page-faulted its transients in afresh
# (MiniLM with its matmuls on the BLAS backend, batch 32: 92k minor faults, ~360 MiB, and
# 270-365 ms of kernel time a call, ~20% of the call; with this: none). A local-task device
# allocates them through its queue, which did not fault so.
LOCAL_SYNC_ALLOCATOR = f"caching:device_local=*;{1 << 30};{_CACHING_FREE_COUNT}"
# The default: bounded caching. Measured on the H200 (docs/benchmarks.md, "Transients, out=
# through the twin, the fence wait and the bounded caching allocator"): the block's overhead
# was 0.31-0.37 ms with it (prefill), 0.65-1.30 ms with the pools, and the bound cost nothing
# against the unbounded form; the bound keeps an app with dynamic shapes from holding a freed
# buffer of every size it met.
DEFAULT_CUDA_ALLOCATOR = f"caching:4G;{_CACHING_FREE_COUNT}"
_SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def caching_spec(cuda_allocator: str) -> str | None:
    """IREE's allocator spec for a `cuda_allocator` value ("caching" or its bounded form), None
    for "pool"; a ValueError that names the accepted forms for anything else."""
    if cuda_allocator == "pool":
        return None
    if cuda_allocator == "caching":
        return "caching"
    name, _, bound = cuda_allocator.partition(":")
    capacity, _, count = bound.partition(";")
    capacity, count = capacity.strip().upper(), count.strip()
    suffix = capacity[-1:] if capacity[-1:] in _SIZE_SUFFIXES else ""
    digits = capacity[: len(capacity) - len(suffix)]
    if name != "caching" or not digits.isdigit() or not (count == "" or count.isdigit()):
        raise ValueError(
            f"cuda_allocator must be 'pool', 'caching' or 'caching:<capacity>[;<free count>]' "
            f"(e.g. 'caching:8G;16'), got {cuda_allocator!r}"
        )
    nbytes = int(digits) * _SIZE_SUFFIXES[suffix]
    free = int(count) if count else _CACHING_FREE_COUNT
    if nbytes == 0 or free == 0:
        raise ValueError(
            f"cuda_allocator {cuda_allocator!r}: the capacity and the free count must be above "
            "0 (use 'pool' for no caching)"
        )
    return f"caching:device_local=*;{nbytes};{free}"


# The CUDA driver's allocation mode is a process-wide IREE flag read when the driver is created:
# the first registry to create it decides (driver name -> the allocator it was created for).
_DRIVER_ALLOCATOR: dict[str, str] = {}
_DRIVER_LOCK = threading.Lock()

# The HAL devices of this process, shared by every DeviceRegistry (so by every Instance), keyed
# by everything that makes two devices differ: (driver, ordinal, allocators asked for). A device
# is never freed (`_live_for_the_process`), so a registry creating its own would leak a device
# per Instance: a local-task device's worker threads and memory mappings stay for the process.
# Keys differ per ordinal, so a variant's two local-task devices are still two devices.
_ProcessKey = tuple[str, int, tuple[str, ...]]
_PROCESS_DEVICES: dict[_ProcessKey, rt.HalDevice] = {}
_PROCESS_LOCK = threading.Lock()

# What each move method is, by the memory it goes between (`DeviceRegistry.transfers_by_kind`):
# "host" between two host-memory (CPU) devices, "host-gpu" between host memory and a GPU's memory
# in one copy, "peer" from one GPU's memory into another's. No method stages a GPU-to-GPU move
# through host memory: without a peer path between the two GPUs the move is refused.
TRANSFER_KINDS: dict[str, str] = {
    "queue-copy": "host",
    "host-to-device": "host-gpu",
    "device-to-host-visible": "host-gpu",
    "peer-copy": "peer",
}
# Drivers whose devices can move arrays between each other with a peer copy (myelin.runtime._cuda).
PEER_DRIVERS = frozenset({"cuda"})
# Drivers whose devices IREE 3.13 cannot put in a device group with another device: creating
# the group fails with "Vulkan queue frontier already assigned" (seen on lavapipe, with a CPU
# device or a second Vulkan device beside it). Their graphs run in models of their own, and
# device arrays move between models as between the devices of one variant (`move`).
SOLO_DRIVERS = frozenset({"vulkan"})


# The local-task worker count this process asked for with set_host_threads (None: IREE's
# default topology, a worker per core). IREE reads it once, when the local-task driver starts.
_HOST_THREADS: int | None = None

# Why a one-thread process runs its CPU model on local-sync (host_drivers). On local-task the
# calling thread records and submits a call's dispatches and the one worker runs them while the
# caller sleeps on a fence: every hand-off waits for a core, and on a loaded machine each wait
# costs a scheduler slot (MiniLM's calls moved in 4 ms steps, 16 -> 20 ms). local-sync runs each
# dispatch inline on the calling thread, as ONNX Runtime and OpenVINO do on one thread: the same
# results, never slower in docs/runtime.md's measurements (a causal LM's decode step, ~500 small
# dispatches: 1.03-1.30x; MiniLM, BERT, GPT-2, ViT at batch 1: 1.00-1.25x).
ONE_HOST_THREAD = (
    "a CPU model on one host thread (set_host_threads(1)) runs its dispatches inline on the "
    "calling thread (local-sync) instead of handing each call to one local-task worker and "
    "sleeping until it is done: no hand-off waiting for a core, the same results; more threads "
    "keep local-task"
)


def set_host_threads(threads: int) -> None:
    """Run this process's CPU work on `threads` threads: IREE's local-task worker count
    (`--task_topology_group_count`, process-wide), and what a CPU model's driver choice reads
    (`host_drivers`). Call it before the first model with a CPU device loads: IREE reads the
    count once, when the local-task driver starts, so a later change is refused."""
    from myelin.runtime.backends import drivers_created

    global _HOST_THREADS
    if threads < 1:
        raise ValueError(f"set_host_threads: threads must be 1 or more, got {threads}")
    with _PROCESS_LOCK:
        # the driver's task executor, and its worker count, start with the driver
        started = "local-task" in drivers_created()
        if started and threads != _HOST_THREADS:
            raise RuntimeError(
                f"set_host_threads({threads}): this process's local-task driver already runs "
                f"{_HOST_THREADS or 'the default number of'} worker(s); set the thread count "
                "before loading the first model"
            )
        rt.flags.parse_flags(f"--task_topology_group_count={threads}")
        _HOST_THREADS = threads


def host_threads() -> int | None:
    """The thread count set_host_threads set (None: IREE's default, a worker per core)."""
    return _HOST_THREADS


def host_drivers(devices: Sequence[DeviceRecord]) -> tuple[list[str], dict[str, dict]]:
    """The driver each variant device runs on here, and the choices the runtime made for this
    host ({device: {"driver": {"value", "reason"}}}, empty: every device as the artifact says).
    The one choice: a variant whose only device is an llvm-cpu device on local-task, without a
    backend, runs on local-sync when the process has one host thread (ONE_HOST_THREAD), unless
    the app named its driver (`driver_pinned` in the device record: an app that overlaps its
    own work with `submit` keeps local-task by saying so). Several devices keep their drivers
    (their graphs may run side by side), and so does a process of more threads or IREE's
    default topology (local-sync would run on the calling thread alone)."""
    drivers = [d.driver for d in devices]
    if (
        _HOST_THREADS == 1
        and len(devices) == 1
        and devices[0].target == "llvm-cpu"
        and devices[0].driver == "local-task"
        and devices[0].backend is None
        and not devices[0].extras.get("driver_pinned")
    ):
        choice = {"value": "local-sync", "reason": ONE_HOST_THREAD}
        return ["local-sync"], {devices[0].name: {"driver": choice}}
    return drivers, {}


def driver_ordinals(drivers: Sequence[str]) -> list[int]:
    """Ordinal of each device among the devices of its driver: [local-task, cuda, local-task]
    -> [0, 0, 1]."""
    seen: dict[str, int] = {}
    ordinals = []
    for driver in drivers:
        ordinals.append(seen.get(driver, 0))
        seen[driver] = ordinals[-1] + 1
    return ordinals


@dataclass
class TransferCount:
    """Device-to-device moves of call arguments, per (source, target, method)."""

    count: int = 0
    bytes: int = 0


class DeviceRegistry:
    """Finds HAL devices on demand and remembers which drivers failed (and why).

    Devices are per process (`_PROCESS_DEVICES`): created once per (driver, ordinal, allocators)
    and shared by every registry, so many Instances cost one set of devices. A variant with two
    local-task devices gets two distinct devices, and models loaded on the same driver share
    them. What a registry reports stays its own (one Instance's): the failures it saw, the moves
    it made (`transfers`) and the peer paths it asked about.
    """

    def __init__(self, *, cuda_allocator: str = DEFAULT_CUDA_ALLOCATOR) -> None:
        self._caching = caching_spec(cuda_allocator)  # refuses a bad value here, not later
        self.cuda_allocator = cuda_allocator
        self._lock = threading.Lock()
        self._drivers: dict[str, rt.HalDriver] = {}
        self._devices: dict[tuple[str, int], rt.HalDevice] = {}
        self._failures: dict[str, str] = {}
        self._device_counts: dict[str, int] = {}
        # (lower ordinal, higher ordinal) of two GPUs -> None (peer access on) or why not
        self._peer_paths: dict[tuple[int, int], str | None] = {}
        # (source driver, target driver, method) -> moves made; see `move`.
        self.transfers: dict[tuple[str, str, str], TransferCount] = {}

    def compiled_drivers(self) -> list[str]:
        return sorted(rt.query_available_drivers())

    def _driver(self, name: str) -> rt.HalDriver:
        with self._lock:
            if name in self._drivers:
                return self._drivers[name]
            if name in self._failures:
                raise DeviceUnavailable(self._failures[name])
            if name not in rt.query_available_drivers():
                reason = (
                    f"driver '{name}' is not part of this IREE runtime "
                    f"(it has: {', '.join(self.compiled_drivers())})"
                )
                self._failures[name] = reason
                raise DeviceUnavailable(reason)
            try:
                driver = self._create_driver(name)
            except DeviceUnavailable as e:
                self._failures[name] = str(e)
                raise
            except Exception as e:  # IREE reports a missing libcuda etc. as a RuntimeError
                reason = f"driver '{name}' cannot start here: {_first_line(e)}"
                self._failures[name] = reason
                raise DeviceUnavailable(reason) from e
            self._drivers[name] = driver
            from myelin.runtime.backends import note_driver_created

            note_driver_created(name)  # plugins registered later would not reach it
            return driver

    def _create_driver(self, name: str) -> rt.HalDriver:
        """The driver, created once per process by IREE; for CUDA, in the allocation mode this
        registry asks for (a process-wide flag, so a second mode is refused)."""
        if name != "cuda":
            return rt.get_driver(name)
        with _DRIVER_LOCK:
            made = _DRIVER_ALLOCATOR.get(name)
            if made is None:
                if self._caching is not None:
                    rt.flags.parse_flags("--cuda_async_allocations=false")
                driver = rt.get_driver(name)
                _DRIVER_ALLOCATOR[name] = self.cuda_allocator
                return driver
        if made != self.cuda_allocator:
            raise DeviceUnavailable(
                f"driver 'cuda' was created in this process for cuda_allocator='{made}'; "
                f"IREE's allocation mode is per process: use one cuda_allocator for every "
                "Instance of the process"
            )
        return rt.get_driver(name)

    def _allocators(self, driver: str) -> list[str] | None:
        if driver == "local-sync":
            return [LOCAL_SYNC_ALLOCATOR]
        return [self._caching] if driver == "cuda" and self._caching is not None else None

    @property
    def caches_cuda_memory(self) -> bool:
        """Whether CUDA memory that is freed is kept for reuse ("caching", bounded or not)."""
        return self._caching is not None

    def device(self, driver: str, ordinal: int = 0) -> rt.HalDevice:
        """The process's device `ordinal` of `driver`, created by the first registry that asks."""
        key = (driver, ordinal)
        with self._lock:
            if key in self._devices:
                return self._devices[key]
        drv = self._driver(driver)
        allocators = self._allocators(driver)
        shared: _ProcessKey = (driver, ordinal, tuple(allocators or ()))
        with _PROCESS_LOCK:  # held while creating: two registries never make one key twice
            dev = _PROCESS_DEVICES.get(shared)
            if dev is None:
                dev = self._create_device(drv, driver, ordinal, allocators)
                _live_for_the_process(dev)
                _PROCESS_DEVICES[shared] = dev
        with self._lock:
            return self._devices.setdefault(key, dev)

    def _create_device(
        self, drv: rt.HalDriver, driver: str, ordinal: int, allocators: list[str] | None
    ) -> rt.HalDevice:
        try:
            if ordinal == 0 or driver in HOST_DRIVERS:
                # each call creates a distinct device
                return drv.create_default_device(allocators=allocators)
            # the n-th physical device (GPU n)
            available = drv.query_available_devices()
            if ordinal >= len(available):
                raise DeviceUnavailable(
                    f"driver '{driver}' has {len(available)} device(s); the variant needs "
                    f"{ordinal + 1}"
                )
            return drv.create_device(available[ordinal]["device_id"], allocators=allocators)
        except DeviceUnavailable:
            raise
        except Exception as e:
            reason = f"driver '{driver}' has no usable device: {_first_line(e)}"
            with self._lock:
                self._failures[driver] = reason
            raise DeviceUnavailable(reason) from e

    def devices_for(self, drivers: Sequence[str]) -> list[rt.HalDevice]:
        """One device per entry of a variant's device list, in order (see the module doc)."""
        return [self.device(d, o) for d, o in zip(drivers, driver_ordinals(drivers), strict=True)]

    def driver_of(self, device: rt.HalDevice) -> str | None:
        """The driver of a device of this process's registries (another Instance's model's output
        moves like this one's); None for a device made elsewhere."""
        key = self._key_of(device)
        return key[0] if key is not None else None

    def _key_of(self, device: rt.HalDevice) -> tuple[str, int] | None:
        with self._lock:
            for key, dev in self._devices.items():
                if dev is device:
                    return key
        with _PROCESS_LOCK:
            for (driver, ordinal, _), dev in _PROCESS_DEVICES.items():
                if dev is device:
                    return driver, ordinal
        return None

    def device_count(self, driver: str) -> int | None:
        """How many devices `driver` offers here (GPUs of a GPU driver); None for a host driver,
        which creates as many distinct devices as asked for. Raises DeviceUnavailable when the
        driver cannot start."""
        if driver in HOST_DRIVERS:
            return None
        with self._lock:
            if driver in self._device_counts:
                return self._device_counts[driver]
        drv = self._driver(driver)
        try:
            count = len(drv.query_available_devices())
        except Exception as e:  # Vulkan without a driver manifest (ICD) fails its instance
            reason = f"driver '{driver}' finds no device here ({_first_line(e)})"
            raise DeviceUnavailable(_with_install_hint(driver, reason)) from e
        with self._lock:
            return self._device_counts.setdefault(driver, count)

    def why_too_few(self, requirements: Sequence[DeviceRecord]) -> str | None:
        """None when this machine has as many devices of each GPU driver as a variant lists
        (its n-th CUDA device is GPU n) and IREE can group them (SOLO_DRIVERS), else a reason
        for people."""
        solo = sorted({r.driver for r in requirements if r.driver in SOLO_DRIVERS})
        if solo and len(requirements) > 1:
            names = ", ".join(r.name for r in requirements)
            return (
                f"IREE 3.13 cannot run a '{solo[0]}' device beside other devices in one variant "
                f"(devices {names}); build the graphs placed on it as an app of their own and "
                "pass its device results between the two models"
            )
        needed: dict[str, int] = {}
        for r in requirements:
            needed[r.driver] = needed.get(r.driver, 0) + 1
        for driver, count in needed.items():
            try:
                have = self.device_count(driver)
            except DeviceUnavailable as e:
                return str(e)
            if have == 0:
                return _with_install_hint(driver, f"driver '{driver}' finds no device here")
            if have is not None and have < count:
                names = ", ".join(r.name for r in requirements if r.driver == driver)
                return (
                    f"it needs {count} '{driver}' devices ({names}) and this machine has "
                    f"{have}; use a variant with fewer devices, or a machine with {count}"
                )
        return None

    def onto(self, values: Sequence[object], target: rt.HalDevice) -> Sequence[object]:
        """Call arguments with every device array that lives on another device moved onto
        `target` (see `move`); numpy arrays and scalars pass unchanged."""
        if not any(isinstance(v, rt.DeviceArray) and device_of(v) is not target for v in values):
            return values
        return [self.move(v, target) if isinstance(v, rt.DeviceArray) else v for v in values]

    def move(self, array: rt.DeviceArray, target: rt.HalDevice) -> rt.DeviceArray:
        """`array` on `target`: a device array passed to an entrypoint that runs on another
        device (graph A's output into graph B, placed elsewhere) moves device to device, with
        the HAL, never through a numpy array:

        - host-memory device -> host-memory device: a queue copy on the target device into a
          buffer of its allocator;
        - host-memory device -> GPU: one host-to-device copy from the source buffer's own memory
          (the CPU device's memory is host memory) into a buffer of the GPU's allocator;
        - GPU -> host-memory device: a queue copy on the GPU into host-visible memory of the
          GPU's allocator, which the CPU device reads in place;
        - GPU -> GPU of one driver that has peer copies (CUDA): peer access between the two
          GPUs enabled once (myelin.runtime._cuda), then a queue copy on the target GPU from the
          source buffer into a buffer of the target's allocator. Two GPUs without a peer path
          are refused: the move would go through host memory.
        """
        source = device_of(array)
        if source is target:
            return array
        source_driver = self.driver_of(source)
        target_driver = self.driver_of(target)
        view = buffer_view_of(array)
        nbytes = view.byte_length
        source_host = source_driver in HOST_DRIVERS
        target_host = target_driver in HOST_DRIVERS
        if source_driver is None or target_driver is None:
            raise DeviceUnavailable(
                "a device array from a device this runtime did not create cannot be moved to "
                "the entrypoint's device; pass a numpy array, or an output of this model"
            )
        if source_host and target_host:
            method = "queue-copy"
            buffer = target.allocator.allocate_buffer(
                memory_type=rt.MemoryType.DEVICE_LOCAL,
                allowed_usage=rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING,
                allocation_size=nbytes,
            )
            _queue_copy(target, view.get_buffer(), buffer)
        elif source_host:
            method = "host-to-device"
            mapped = view.map()  # the source device's memory, viewed in place
            buffer = target.allocator.allocate_buffer_copy(
                memory_type=rt.MemoryType.DEVICE_LOCAL,
                allowed_usage=rt.BufferUsage.DEFAULT,
                device=target,
                buffer=mapped,
            )
            del mapped
        elif target_host:
            method = "device-to-host-visible"
            buffer = source.allocator.allocate_buffer(
                memory_type=rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE,
                # CPU dispatches bind their buffers through a persistent mapping (seen on the
                # H200: without it the CPU graph's dispatch fails with PERMISSION_DENIED).
                allowed_usage=int(rt.BufferUsage.DEFAULT)
                | int(rt.BufferUsage.MAPPING)
                | int(rt.BufferUsage.MAPPING_PERSISTENT),
                allocation_size=nbytes,
            )
            _queue_copy(source, view.get_buffer(), buffer)
        elif source_driver == target_driver and source_driver in PEER_DRIVERS:
            method = "peer-copy"
            self._require_peer_path(source, target)
            buffer = target.allocator.allocate_buffer(
                memory_type=rt.MemoryType.DEVICE_LOCAL,
                allowed_usage=rt.BufferUsage.DEFAULT,
                allocation_size=nbytes,
            )
            _queue_copy(target, view.get_buffer(), buffer)
        else:
            raise DeviceUnavailable(
                f"moving a device array from a '{source_driver}' device to a '{target_driver}' "
                "device is not supported yet; pass output='numpy' between these two entrypoints"
            )
        moved = rt.HalBufferView(buffer, view.shape, view.element_type)
        with self._lock:
            count = self.transfers.setdefault(
                (source_driver, target_driver, method), TransferCount()
            )
            count.count += 1
            count.bytes += nbytes
        return rt.DeviceArray(
            target, moved, implicit_host_transfer=True, override_dtype=array.dtype
        )

    def open_peer_paths(self, devices: Sequence[rt.HalDevice]) -> None:
        """Enable peer access between every two GPUs of a variant, at load: the runtime's moves
        need it (`move`), and so does Stream's own transfer inside a module, which hands gpu1 a
        buffer gpu0 wrote (`stream.cmd.flush to(@gpu1)`, docs/platforms.md). Where a pair has no
        peer path the reason is kept and a move between them raises it."""
        gpus = [d for d in devices if self.driver_of(d) in PEER_DRIVERS]
        for i, first in enumerate(gpus):
            for second in gpus[i + 1 :]:
                self._peer_path(first, second)

    def _peer_path(self, source: rt.HalDevice, target: rt.HalDevice) -> str | None:
        """None when the GPUs of two CUDA devices can access each other's memory (enabled once
        per pair), else why not."""
        a, b = self._key_of(source), self._key_of(target)
        assert a is not None and b is not None
        pair = (min(a[1], b[1]), max(a[1], b[1]))
        with self._lock:
            if pair in self._peer_paths:
                return self._peer_paths[pair]
        from myelin.runtime._cuda import enable_peer_access

        reason = enable_peer_access(*pair)
        with self._lock:
            return self._peer_paths.setdefault(pair, reason)

    def _require_peer_path(self, source: rt.HalDevice, target: rt.HalDevice) -> None:
        """Raise DeviceUnavailable (with the fix) where two GPUs have no peer path."""
        reason = self._peer_path(source, target)
        if reason is not None:
            a, b = self._key_of(source), self._key_of(target)
            assert a is not None and b is not None
            raise DeviceUnavailable(
                f"cannot move a device array from GPU {a[1]} to GPU {b[1]} without going through "
                f"host memory: {reason}; pass output='numpy' between these two entrypoints, or "
                "place both on one GPU"
            )

    def transfers_by_kind(self) -> dict[str, TransferCount]:
        """The moves made so far, summed per kind (TRANSFER_KINDS: host, host-gpu, peer)."""
        out: dict[str, TransferCount] = {}
        with self._lock:
            for (_, _, method), count in self.transfers.items():
                total = out.setdefault(TRANSFER_KINDS[method], TransferCount())
                total.count += count.count
                total.bytes += count.bytes
        return out

    def why_unusable(self, requirement: DeviceRecord) -> str | None:
        """None when a variant's device can be used here, else a reason for people."""
        missing = requirement.cpu_flags - hostinfo.cpu_flags()
        if missing and hostinfo.cpu_flags():
            return (
                f"device '{requirement.name}' was compiled for CPU features this CPU lacks "
                f'({", ".join(sorted(missing))}); rebuild with cpu = "generic" or for this CPU'
            )
        if requirement.driver in HOST_DRIVERS:
            # Not created just to ask: a variant's backend plugins must be registered before
            # its host driver exists (myelin.runtime.backends), and a host driver that is
            # compiled in always starts.
            if requirement.driver not in rt.query_available_drivers():
                return (
                    f"device '{requirement.name}': driver '{requirement.driver}' is not part of "
                    f"this IREE runtime (it has: {', '.join(self.compiled_drivers())})"
                )
        else:
            try:
                self._driver(requirement.driver)
            except DeviceUnavailable as e:
                return f"device '{requirement.name}': {e}"
        arch = requirement.requires.cuda_arch if requirement.requires is not None else None
        if arch is not None:
            capability = self.cuda_capability()
            if capability is None or not hostinfo.cuda_arch_runs_on(arch, capability):
                found = (
                    "no GPU found"
                    if capability is None
                    else (f"this GPU is compute capability {capability[0]}.{capability[1]}")
                )
                return (
                    f"device '{requirement.name}' holds {arch} code (library kernels), and "
                    f"{found}; build a variant without kernels for this GPU"
                )
        return None

    def cuda_capability(self) -> tuple[int, int] | None:
        """Compute capability of the first CUDA GPU (the one a variant's first CUDA device gets)."""
        return hostinfo.cuda_compute_capability(0)

    def usable_drivers(self) -> list[str]:
        usable = []
        for name in self.compiled_drivers():
            try:
                self._driver(name)
                usable.append(name)
            except DeviceUnavailable:
                pass
        return usable


# What a machine without any device of a driver needs, for the error that says so.
_INSTALL_HINTS = {
    "vulkan": (
        "install the GPU's Vulkan driver, or Mesa's software Vulkan device lavapipe "
        "(Debian/Ubuntu: apt-get install mesa-vulkan-drivers libvulkan1; docs/platforms.md)"
    ),
}


def _with_install_hint(driver: str, reason: str) -> str:
    hint = _INSTALL_HINTS.get(driver)
    return f"{reason}; {hint}" if hint else reason


def _queue_copy(device: rt.HalDevice, source: rt.HalBuffer, target: rt.HalBuffer) -> None:
    """A copy on `device`'s queue, waited for: the callee's synchronous ABI reads its inputs
    without waiting on fences."""
    semaphore = device.create_semaphore(0)
    device.queue_copy(source, target, [], [(semaphore, 1)])
    semaphore.wait(1)


def _live_for_the_process(obj: object) -> None:
    """Never free a HAL device. A buffer a user still holds at interpreter exit (a result
    returned with output="device") is released during teardown; if its device was freed first,
    the release crashes the process (seen with the device registry collected before the buffer).
    Devices are process-lifetime resources anyway (iree.runtime caches its own the same way), so
    we take one extra reference that is never dropped."""
    import ctypes

    from myelin.runtime._iree_private import disable_leak_checker

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    # nanobind would report the device as leaked at exit; it is kept on purpose.
    disable_leak_checker()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
