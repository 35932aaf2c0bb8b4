"""Profile captures of one entrypoint call, through IREE's own tools.

IREE 3.13's Python runtime has no profile sink (`HalDevice.begin_profiling` with a mode raises),
so a capture runs the call in `iree-run-module` (or `iree-benchmark-module` for repeats) with
HAL-native profiling (`--device_profiling_mode/--device_profiling_output`), on the modules and
parameters of the chosen variant extracted from the .mln. `iree-profile` then summarizes the
capture (hottest dispatches, memory high water) and exports its events, which we write as a
Chrome trace-event file (`trace.json`: chrome://tracing and ui.perfetto.dev open it).

Every capture gets its own id and its own files; nothing is overwritten. A driver that cannot
record what was asked for (device timestamps on a CPU driver) raises ProfilingUnavailable.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from myelin.errors import EntrypointNotFound, NativeCodeRefused, ProfilingUnavailable
from myelin.mln import EntrypointRecord, MlnReader, ProfileRecord, VariantRecord
from myelin.platforms import HOST_DRIVERS
from myelin.untrusted import path_inside

# HAL profiling families (iree-run-module --help). CPU drivers record host-side execution;
# device timestamps need a GPU driver.
HOST_FAMILIES = (
    "queue-events",
    "host-execution",
    "memory-events",
    "command-region-events",
    "executable-metadata",
)
DEVICE_TIMING_FAMILIES = ("dispatch-events", "device-queue-events")
# Families a driver's profiling does not record: IREE 3.13's Vulkan driver refuses the capture
# ("UNIMPLEMENTED; unsupported Vulkan profiling data families") with either of these; its
# dispatch timestamps (device timing) are recorded.
UNSUPPORTED_FAMILIES = {"vulkan": frozenset({"host-execution", "command-region-events"})}
TRACE_NAME = "trace.json"
DEFAULT_OUTPUT = "capture-{capture}.ireeprof"

_counter = itertools.count()


def tool(name: str) -> Path:
    """A tool of the iree-base-runtime wheel (iree-run-module, iree-profile, ...)."""
    import iree._runtime_libs as libs

    path = Path(libs.__file__).parent / name
    if not path.is_file():
        found = shutil.which(name)
        if found is None:
            raise ProfilingUnavailable(
                f"IREE tool {name} is not installed with this runtime; reinstall iree-base-runtime"
            )
        path = Path(found)
    return path


def capture_id() -> str:
    """Unique per capture: UTC time, process id and a counter."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{stamp}-{os.getpid()}-{next(_counter)}"


def output_path(template: str, out_dir: Path, capture: str) -> Path:
    """Where a capture goes: `template` with `{capture}` replaced (added before the suffix when
    the template lacks it, so two captures never share a file), inside `out_dir`: the template
    comes from the artifact, so an absolute path or one leading out is refused (UnsafePath)."""
    if "{capture}" not in template:
        stem, dot, suffix = template.rpartition(".")
        template = f"{stem}-{{capture}}.{suffix}" if dot and stem else f"{template}-{{capture}}"
    relative = template.replace("{capture}", capture)
    return path_inside(out_dir, relative, what="[runtime.profile] output")


@dataclass(frozen=True)
class DispatchStat:
    name: str
    count: int
    total_ns: int
    avg_ns: float
    max_ns: int
    timing: str  # "device" (device timestamps) or "host" (host execution, CPU drivers)


@dataclass
class Capture:
    """One profile capture and what was read out of it."""

    id: str
    profile: Path  # the .ireeprof bundle (iree-profile reads it)
    trace: Path  # Chrome trace-event JSON
    dispatches: list[DispatchStat] = field(default_factory=list)  # hottest first
    memory_high_water: int | None = None  # peak bytes of queue-ordered allocations
    command: list[str] = field(default_factory=list)


def capture(
    artifact: str | os.PathLike,
    function: str,
    inputs: Sequence[Any],
    out_dir: str | os.PathLike,
    *,
    variant: str | None = None,
    output: str | None = None,
    device_timing: bool | None = None,
    repeat: int = 1,
    allow_native_code: bool = False,
) -> Capture:
    """Run `function` once (or `repeat` times) under HAL profiling; write the capture and
    `trace.json` into `out_dir`. `output` and `device_timing` default to the artifact's
    `[runtime.profile]`. A variant with an external backend runs its plugin (native code from
    the file) in IREE's tool only with `allow_native_code=True`, as `Instance` does."""
    from myelin.runtime.devices import DeviceRegistry
    from myelin.runtime.model import choose_variant

    artifact = Path(artifact)
    out_dir = Path(out_dir)
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    with MlnReader(artifact) as reader:
        manifest = reader.artifact_manifest
        policy = manifest.runtime_policies.profile or ProfileRecord()
        if device_timing is None:
            device_timing = policy.device_timing
        template = output or policy.output or DEFAULT_OUTPUT
        chosen = choose_variant(manifest, DeviceRegistry(), variant, artifact)
        entry = _entrypoint(chosen, function, artifact)
        drivers = [d.driver for d in chosen.devices]
        if device_timing:
            cpu = sorted({d for d in drivers if d in HOST_DRIVERS})
            if cpu:
                raise ProfilingUnavailable(
                    f"device_timing: driver '{cpu[0]}' runs on the host and records no device "
                    "timestamps; profile without device timing, or a GPU variant (--variant)"
                )
        unsupported = frozenset().union(*(UNSUPPORTED_FAMILIES.get(d, ()) for d in drivers))
        families = tuple(
            f
            for f in HOST_FAMILIES + (DEVICE_TIMING_FAMILIES if device_timing else ())
            if f not in unsupported
        )
        ident = capture_id()
        out_dir.mkdir(parents=True, exist_ok=True)
        profile = output_path(template, out_dir, ident)
        profile.parent.mkdir(parents=True, exist_ok=True)
        work = out_dir / f".work-{ident}"
        work.mkdir()
        try:
            if not allow_native_code:
                _refuse_native_code(chosen, artifact)
            command = _command(reader, chosen, entry, inputs, work, profile, families, repeat)
            try:
                _run(command, drivers)
            except ProfilingUnavailable:
                profile.unlink(missing_ok=True)  # a refused capture leaves no file behind
                raise
            result = Capture(id=ident, profile=profile, trace=out_dir / TRACE_NAME, command=command)
            result.dispatches = hottest_dispatches(profile)
            result.memory_high_water = memory_high_water(profile)
            records = export_records(profile, work / "export.jsonl")
            trace = chrome_trace(records, title=f"{artifact.name} {function} ({chosen.name})")
            partial = result.trace.with_name(f".{TRACE_NAME}.partial")
            partial.write_text(json.dumps(trace))
            os.replace(partial, result.trace)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return result


def _refuse_native_code(variant: VariantRecord, artifact: Path) -> None:
    names = sorted({d.backend.name for d in variant.devices if d.backend is not None})
    if names:
        raise NativeCodeRefused(
            f"{artifact}: variant '{variant.name}' carries native code (the plugin of backend "
            f"{', '.join(names)}) that the capture would run; profile only files you trust, "
            "with capture(..., allow_native_code=True) / plex profile --allow-native-code"
        )


def _entrypoint(variant: VariantRecord, name: str, artifact: Path) -> EntrypointRecord:
    entries = variant.callable_entrypoints()
    if name not in entries:
        raise EntrypointNotFound(
            f"{artifact.name} has no entrypoint '{name}' (it has: {', '.join(sorted(entries))})"
        )
    return entries[name]


def _command(
    reader: MlnReader,
    variant: VariantRecord,
    entry: EntrypointRecord,
    inputs: Sequence[Any],
    work: Path,
    profile: Path,
    families: Sequence[str],
    repeat: int,
) -> list[str]:
    """The tool command line, with the variant's modules, parameters and inputs as files."""
    import iree.runtime as rt

    args = [f"--device={d.driver}" for d in variant.devices]
    args += _backend_plugins(reader, variant, work)
    # Modules in registration order, up to the entrypoint's: the tool calls into the last one.
    for m in variant.modules:
        path = path_inside(work, f"{m.name}.vmfb", what="module name")
        path.write_bytes(reader.section_view(m.section))
        args.append(f"--module={path}")
        if m.name == entry.module:
            break
    handle = rt.FileHandle.wrap_memory(reader.mmap, readable=True, writable=False)
    for scope in variant.parameter_scopes:
        index = rt.ParameterIndex()
        for p in reader.artifact_manifest.parameters_in([scope]):
            section = reader.sections[p.section]
            index.add_from_file_handle(p.key, handle, p.length, offset=section.offset + p.offset)
        archive = path_inside(work, f"{scope}.irpa", what="parameter scope")
        index.create_archive_file(str(archive))
        args.append(f"--parameters={scope}={archive}")
    for i, value in enumerate(inputs):
        if isinstance(value, np.ndarray):
            path = work / f"input{i}.npy"
            np.save(path, value, allow_pickle=False)
            args.append(f"--input=@{path}")
        else:
            args.append(f"--input={value}")
    args += [
        f"--function={entry.function}",
        f"--device_profiling_mode={','.join(families)}",
        f"--device_profiling_output={profile}",
    ]
    if repeat == 1:
        return [str(tool("iree-run-module")), *args, "--output_max_element_count=0"]
    return [
        str(tool("iree-benchmark-module")),
        *args,
        f"--benchmark_min_time={repeat}x",
        "--benchmark_repetitions=1",
    ]


def _backend_plugins(reader: MlnReader, variant: VariantRecord, work: Path) -> list[str]:
    """`--executable_plugin` flags for the variant's external backends (myelin.runtime.backends).

    The tool is another process: the plugin and its vendor libraries are written into the work
    folder, the libraries under their sonames, which `_run` puts on the loader's search path."""
    flags = []
    for device in variant.devices:
        backend = device.backend
        if backend is None:
            continue
        for name in backend.libraries:
            library = path_inside(work, name.rpartition("/")[2], what="backend library")
            library.write_bytes(reader.section_view(name))
        plugin = path_inside(work, f"{backend.name}-plugin.so", what="backend name")
        plugin.write_bytes(reader.section_view(backend.plugin))
        flags.append(f"--executable_plugin={plugin}")
    return flags


def _run(command: list[str], drivers: Sequence[str]) -> None:
    env = dict(os.environ)
    plugins = [a.partition("=")[2] for a in command if a.startswith("--executable_plugin=")]
    if plugins:  # a backend's vendor libraries, next to its plugin; one vendor thread per call
        folders = [str(Path(p).parent) for p in plugins]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*folders, env.get("LD_LIBRARY_PATH", "")])
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        reason = next(
            (ln for ln in lines if "UNIMPLEMENTED" in ln or "UNAVAILABLE" in ln),
            lines[-1] if lines else f"exit code {done.returncode}",
        )
        raise ProfilingUnavailable(
            f"profiling on {', '.join(sorted(set(drivers)))} failed: {reason.strip()}"
        )


def _profile_jsonl(command: str, profile: Path) -> Iterator[dict]:
    done = subprocess.run(
        [str(tool("iree-profile")), command, "--format=jsonl", str(profile)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ProfilingUnavailable(
            f"iree-profile {command} cannot read {profile.name}: {done.stderr.strip()}"
        )
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            yield json.loads(line)


def hottest_dispatches(profile: Path) -> list[DispatchStat]:
    """Dispatch functions by total time, hottest first."""
    stats = []
    for row in _profile_jsonl("dispatch", profile):
        kind = row.get("type")
        if kind not in ("dispatch_group", "host_dispatch_group"):
            continue
        stats.append(
            DispatchStat(
                name=row.get("key") or f"executable {row.get('executable_id')}",
                count=int(row.get("count", 0)),
                total_ns=int(row.get("total_ns", 0)),
                avg_ns=float(row.get("avg_ns", 0.0)),
                max_ns=int(row.get("max_ns", 0)),
                timing="device" if kind == "dispatch_group" else "host",
            )
        )
    return sorted(stats, key=lambda s: s.total_ns, reverse=True)


def memory_high_water(profile: Path) -> int | None:
    """Peak bytes of the queue-ordered allocations (transients and results) in the capture:
    the memory IREE's allocator statistics do not count."""
    peaks = [
        int(row["pool_bytes_reserved_high_water"])
        for row in _profile_jsonl("memory", profile)
        if row.get("type") == "memory_pool" and row.get("pool_stats_available")
    ]
    return max(peaks) if peaks else None


def export_records(profile: Path, path: Path) -> list[dict]:
    """The capture's decoded records (`iree-profile export --format=ireeperf-jsonl`)."""
    done = subprocess.run(
        [
            str(tool("iree-profile")),
            "export",
            "--format=ireeperf-jsonl",
            f"--output={path}",
            str(profile),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ProfilingUnavailable(f"iree-profile export failed: {done.stderr.strip()}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Where each record type goes in the trace: (thread id offset, thread name).
_LANES = {
    "host_execution_event": (0, "queue {q}: execution"),
    "dispatch_event": (100, "queue {q}: device dispatches"),
    "command_region_event": (200, "queue {q}: command regions"),
    "queue_event": (300, "queue {q}: submissions"),
    "memory_event": (400, "memory"),
}
_SPANS = (
    ("start_host_time_ns", "end_host_time_ns"),
    ("start_time_ns", "end_time_ns"),
    ("start_driver_host_cpu_timestamp_ns", "end_driver_host_cpu_timestamp_ns"),
)


def chrome_trace(records: Sequence[dict], *, title: str = "") -> dict:
    """Chrome trace-event JSON (the "JSON Object Format") from ireeperf-jsonl records.

    Timed records become complete events (`ph: X`, microseconds), queue operations instant
    events, pool occupancy a counter track; one process per physical device.
    """
    events: list[dict] = []
    starts = [r[s] for r in records for s, _ in _SPANS if isinstance(r.get(s), int)]
    starts += [r["host_time_ns"] for r in records if isinstance(r.get("host_time_ns"), int)]
    origin = min(starts) if starts else 0
    lanes: set[tuple[int, int, str]] = set()
    for r in records:
        kind = r.get("record_type")
        if kind not in _LANES:
            continue
        pid = int(r.get("physical_device_ordinal", 0))
        queue = int(r.get("queue_ordinal", 0))
        offset, lane = _LANES[kind]
        tid = offset + queue
        lanes.add((pid, tid, lane.format(q=queue)))
        span = next(
            (
                (r[a], r[b])
                for a, b in _SPANS
                if isinstance(r.get(a), int) and isinstance(r.get(b), int)
            ),
            None,
        )
        if kind == "memory_event":
            if r.get("pool_stats_available") and "host_time_ns" in r:
                events.append(
                    {
                        "name": "pool bytes reserved",
                        "ph": "C",
                        "pid": pid,
                        "tid": tid,
                        "ts": (r["host_time_ns"] - origin) / 1e3,
                        "args": {"reserved": r.get("pool_bytes_reserved", 0)},
                    }
                )
            continue
        name = r.get("key") or r.get("op") or kind
        if kind == "command_region_event":
            name = f"region {r.get('region_index')} ({r.get('region_dispatch_count')} dispatch)"
        args = {
            k: r[k]
            for k in (
                "submission_id",
                "command_buffer_id",
                "command_index",
                "workgroup_count",
                "tile_count",
                "payload_length",
                "op",
            )
            if k in r
        }
        if span is not None and span[1] >= span[0]:
            events.append(
                {
                    "name": name,
                    "cat": kind,
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "ts": (span[0] - origin) / 1e3,
                    "dur": (span[1] - span[0]) / 1e3,
                    "args": args,
                }
            )
        elif isinstance(r.get("host_time_ns"), int):
            events.append(
                {
                    "name": name,
                    "cat": kind,
                    "ph": "i",
                    "s": "t",
                    "pid": pid,
                    "tid": tid,
                    "ts": (r["host_time_ns"] - origin) / 1e3,
                    "args": args,
                }
            )
    for pid in sorted({p for p, _, _ in lanes}):
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"device {pid}"},
            }
        )
    for pid, tid, lane in sorted(lanes):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "source": "iree-profile export (ireeperf-jsonl)"},
    }
