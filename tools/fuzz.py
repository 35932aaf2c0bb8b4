#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris/libFuzzer) of what PLeX reads from outside: .mln files and
manifests.

    nice -n 19 .venv/bin/python tools/fuzz.py --minutes 30                  # every harness
    nice -n 19 .venv/bin/python tools/fuzz.py --harness mln --runs 1000000
    python tools/fuzz.py --runs 1000000 --parallel 15       # a many-core host: 15 processes

The .mln harnesses need only the runtime (numpy, iree-base-runtime, src/ on PYTHONPATH) and
atheris; `manifest` also needs pydantic and tomli-w.

Harnesses (each input is one test case; seeds are committed under tools/fuzz_corpus/<harness>/):

- `mln`: the bytes of a whole .mln file. The first byte picks whether the header's manifest hash
  is recomputed first (so mutations reach the manifest parser and the typed records, not just
  the hash check). The file is opened by `MlnReader` (verify on) and by
  `Instance().load(..., verify=False)`, which wraps the modules in IREE and registers parameters.
- `mln-manifest`: the manifest JSON of a real artifact (examples/mlp), put back into that file
  with a correct hash: every mutation reaches the typed records and the loader.
- `manifest`: a `plex.toml` or an `app.toml` (the first byte picks which) in a folder that holds
  the files examples/mlp refers to, read through `plex.manifest`.
- `mln-backend`: a backend section and its record (`backend_input`: a flag byte, the record's
  JSON, the plugin's bytes) in examples/mlp's artifact, as the device of a variant listed first.
  Flag bit 0 set: a crafted file (the record and plugin as given, every hash recomputed), loaded
  without `allow_native_code`; clear: a damaged one (the seed file, its plugin section's bytes
  replaced, hashes as built), loaded with `allow_native_code=True` and `verify=False`. Either
  way no native code may load: the process's dynamic loading is watched, and a plugin handed to
  it is a finding (`NativeCodeLoaded`), as is any error but the documented ones.

A harness may raise only the project's documented errors (ArtifactError and the other
MyelinErrors for artifacts, ManifestError for manifests); anything else, a crash or a hang
(`-timeout`, 10 s) is a defect: libFuzzer writes the input as `crash-*`/`timeout-*` into
`--artifacts` and stops. The same checks run under hypothesis in
tests/myelin/test_fuzz_properties.py within CI's time.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tools" / "fuzz_corpus"
HARNESSES = ("mln", "mln-manifest", "manifest", "mln-backend")
# The seed of `mln-backend`: a benign plugin (a gcc-built shared object with one function).
BACKEND_SEED = CORPUS / "mln-backend" / "plugin-as-is"
BACKEND_SECTION = "backend/fuzz/plugin"

# The header layout (myelin.mln._layout): the manifest's sha256 is its last 32 bytes, after the
# magic, versions, flags, offset and length.
_HEADER = struct.Struct("<8sHHIQQ32s")


def repair_manifest_hash(data: bytes) -> bytes:
    """The file with its header's manifest hash recomputed, where the header places the manifest
    inside the file; other bytes are left alone."""
    if len(data) < _HEADER.size:
        return data
    magic, major, minor, flags, offset, length, _ = _HEADER.unpack_from(data)
    if offset + length > len(data):
        return data
    digest = hashlib.sha256(data[offset : offset + length]).digest()
    header = _HEADER.pack(magic, major, minor, flags, offset, length, digest)
    return header + data[_HEADER.size :]


def split_manifest(artifact: bytes) -> bytes:
    """The manifest JSON of an artifact, where its header places it."""
    _, _, _, _, offset, length, _ = _HEADER.unpack_from(artifact)
    return artifact[offset : offset + length]


def with_manifest(artifact: bytes, manifest: bytes) -> bytes:
    """A copy of an unsigned artifact whose manifest is `manifest`, header fixed up to match."""
    magic, major, minor, flags, offset, _, _ = _HEADER.unpack_from(artifact)
    digest = hashlib.sha256(manifest).digest()
    header = _HEADER.pack(magic, major, minor, flags, offset, len(manifest), digest)
    return header + artifact[_HEADER.size : offset] + manifest


def backend_input(flags: int, record: object, plugin: bytes) -> bytes:
    """An `mln-backend` input: the flag byte, the record's JSON (u16 length first), the plugin."""
    text = json.dumps(record).encode()
    return bytes([flags]) + struct.pack("<H", len(text)) + text + plugin


def split_backend_input(data: bytes) -> tuple[int, bytes, bytes] | None:
    if len(data) < 3:
        return None
    (length,) = struct.unpack_from("<H", data, 1)
    return data[0], data[3 : 3 + length], data[3 + length :]


class NativeCodeLoaded(AssertionError):
    """A plugin from a fuzzed file reached the dynamic loader: the finding `mln-backend` hunts."""


def watch_native_loads(patch: Callable[[object, str, object], None] = setattr) -> None:
    """Make every dynamic load of a memfd (how the runtime loads a file's plugins) raise
    NativeCodeLoaded: `mln-backend` never opts in to bytes that were not checked. `patch` sets
    the attribute (a test passes pytest's monkeypatch.setattr, to undo it afterwards)."""
    import ctypes

    real = ctypes.CDLL

    def guarded(name, *args, **kwargs):
        if isinstance(name, str) and name.startswith("/proc/self/fd/"):
            raise NativeCodeLoaded(f"a fuzzed file's native code reached dlopen ({name})")
        return real(name, *args, **kwargs)

    patch(ctypes, "CDLL", guarded)


class Targets:
    """The checks, shared by the atheris harnesses and the hypothesis property tests: each takes
    one input and returns normally or raises only a documented error (the caller decides what an
    undocumented one means)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mln_path = workdir / "case.mln"
        self._instance = None
        self._package = workdir / "package"
        if not self._package.exists():
            self._package.mkdir()
            for name in ("mlp.mlir", "params.safetensors"):
                shutil.copy(REPO / "examples" / "mlp" / name, self._package / name)
            shutil.copy(REPO / "examples" / "mlp" / "plex.toml", self._package / "plex.toml")
        self._seed_artifact: bytes | None = None
        self._native_instance = None
        self._backend_seed: tuple[bytes, int, bytes] | None = None
        self._backend_base: tuple[bytes, dict, tuple] | None = None

    @property
    def instance(self):
        if self._instance is None:
            import myelin

            self._instance = myelin.Instance()
        return self._instance

    @property
    def native_instance(self):
        """An instance that opted in to native code: what a damaged plugin must still not pass."""
        if self._native_instance is None:
            import myelin

            self._native_instance = myelin.Instance(allow_native_code=True)
        return self._native_instance

    def seed_artifact(self) -> bytes:
        if self._seed_artifact is None:
            # the seed without its flag byte (a *.mln name would be ignored by git)
            self._seed_artifact = (CORPUS / "mln" / "mlp-as-is").read_bytes()[1:]
        return self._seed_artifact

    def mln(self, data: bytes) -> bool:
        """One .mln file: the reader with every check, then the loader without hash checks.
        True when the loader accepted it."""
        if data[:1] and data[0] & 1:
            data = data[:1] + repair_manifest_hash(data[1:])
        return self._load(data[1:])

    def mln_manifest(self, data: bytes) -> bool:
        return self._load(with_manifest(self.seed_artifact(), data))

    def _load(self, artifact: bytes) -> bool:
        from myelin.errors import ArtifactError, DeviceUnavailable, MemoryBudgetExceeded
        from myelin.mln import MlnReader

        self.mln_path.write_bytes(artifact)
        with contextlib.suppress(ArtifactError):
            MlnReader(self.mln_path, verify=True).close()
        try:
            model = self.instance.load(self.mln_path, verify=False)
        except (ArtifactError, DeviceUnavailable, MemoryBudgetExceeded):
            return False
        model.close()
        return True

    def backend_artifact(self, record: object, plugin: bytes) -> bytes:
        """examples/mlp's artifact with a variant "native" first, whose device hosts the backend
        `record` with `plugin` as the section BACKEND_SECTION, every hash recomputed (laid out
        here rather than by MlnWriter, which would run the reader's checks twice more)."""
        from myelin.mln._manifest import encode_manifest

        if self._backend_base is None:
            seed = self.seed_artifact()
            magic, major, minor, _, offset, length, _ = _HEADER.unpack_from(seed)
            manifest = json.loads(seed[offset : offset + length])
            self._backend_base = (seed[:offset], manifest, (magic, major, minor))
        base, manifest, (magic, major, minor) = self._backend_base
        plugin_offset = -(-len(base) // 4096) * 4096
        section = {
            "name": BACKEND_SECTION, "kind": "backend", "offset": plugin_offset,
            "length": len(plugin), "alignment": 4096,
            "sha256": hashlib.sha256(plugin).hexdigest(),
        }  # fmt: skip
        default = manifest["variants"][0]
        device = {**default["devices"][0], "backend": record}
        native = {**default, "name": "native", "devices": [device, *default["devices"][1:]]}
        text = encode_manifest(
            {
                **manifest,
                "sections": [*manifest["sections"], section],
                "variants": [native, *manifest["variants"]],
            }
        )
        manifest_offset = -(-(plugin_offset + len(plugin)) // 64) * 64
        header = _HEADER.pack(
            magic, major, minor, 0, manifest_offset, len(text), hashlib.sha256(text).digest()
        )
        return b"".join(
            (
                header,
                base[len(header) :],
                bytes(plugin_offset - len(base)),
                plugin,
                bytes(manifest_offset - plugin_offset - len(plugin)),
                text,
            )
        )

    def backend_seed(self) -> tuple[bytes, int, bytes]:
        """The seed's artifact as built, where its plugin section starts, and the plugin."""
        if self._backend_seed is None:
            from myelin.mln import MlnReader

            _, record, plugin = split_backend_input(BACKEND_SEED.read_bytes())
            artifact = self.backend_artifact(json.loads(record), plugin)
            path = self.workdir / "backend-seed.mln"
            path.write_bytes(artifact)
            with MlnReader(path) as reader:  # checked once: a seed the reader refuses is a bug
                offset = reader.sections[BACKEND_SECTION].offset
            self._backend_seed = (artifact, offset, plugin)
        return self._backend_seed

    def mln_backend(self, data: bytes) -> bool:
        """A backend section and its record (`backend_input`): crafted (flag bit 0, hashes
        recomputed, no opt-in) or damaged (hashes as built, opted in, verify=False); no native
        code may load either way. True when the loader accepted the file."""
        from myelin.errors import ArtifactError, DeviceUnavailable, MemoryBudgetExceeded

        parts = split_backend_input(data)
        if parts is None:
            return False
        flags, record_text, plugin = parts
        if flags & 1:
            try:
                record = json.loads(record_text)
            except (ValueError, RecursionError):
                return False
            try:
                artifact = self.backend_artifact(record, plugin)
            except (TypeError, ValueError):
                return False  # a record JSON cannot hold (json.loads gave it, so: none so far)
            self.mln_path.write_bytes(artifact)
            instance = self.instance
        else:
            artifact, offset, seed_plugin = self.backend_seed()
            changed = plugin[: len(seed_plugin)].ljust(len(seed_plugin), b"\0")
            if changed == seed_plugin:
                return False  # the benign seed plugin itself: nothing to find
            end = offset + len(seed_plugin)
            self.mln_path.write_bytes(artifact[:offset] + changed + artifact[end:])
            instance = self.native_instance
        try:
            model = instance.load(self.mln_path, verify=False)
        except (ArtifactError, DeviceUnavailable, MemoryBudgetExceeded):
            return False
        model.close()
        return True

    def manifest(self, data: bytes) -> bool:
        """A plex.toml (even first byte) or an app.toml (odd) beside examples/mlp's files; True
        when it was read without error."""
        from plex.errors import ManifestError
        from plex.manifest import load_app, load_package

        if not data:
            return False
        kind, text = data[0], data[1:]
        try:
            if kind & 1:
                app = self.workdir / "app" / "app.toml"
                app.parent.mkdir(exist_ok=True)
                app.write_bytes(text.replace(b"@PACKAGE@", str(self._package).encode()))
                load_app(app)
            else:
                folder = self.workdir / "fuzzed-package"
                if not folder.exists():
                    shutil.copytree(self._package, folder)
                (folder / "plex.toml").write_bytes(text)
                load_package(folder)
        except ManifestError:
            return False
        return True


def _run_harness(name: str, args: list[str]) -> None:
    """Inside the child process: instrument the project's code and hand over to libFuzzer."""
    import atheris

    with atheris.instrument_imports(include=["myelin", "plex", "synapse"]):
        import myelin.mln
        import myelin.runtime  # noqa: F401

        if name == "manifest":  # the .mln harnesses run where only the runtime is installed
            import plex.manifest  # noqa: F401
    if name == "mln-backend":
        watch_native_loads()
    targets = Targets(Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-", dir=_scratch())))
    target: Callable[[bytes], bool] = {
        "mln": targets.mln,
        "mln-manifest": targets.mln_manifest,
        "manifest": targets.manifest,
        "mln-backend": targets.mln_backend,
    }[name]
    atheris.Setup([sys.argv[0], *args], target)
    atheris.Fuzz()


def _scratch() -> str:
    """Test files go to memory where there is a tmpfs: a case is written per execution."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--harness", choices=[*HARNESSES, "all"], default="all")
    parser.add_argument("--minutes", type=float, default=None, help="time per harness")
    parser.add_argument("--runs", type=int, default=None, help="executions per harness")
    parser.add_argument("--artifacts", type=Path, default=Path("fuzz-findings"))
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="fuzzer processes per harness (seeds 1..N, --runs split among them)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        _run_harness(args.child, rest)
        return 0
    if args.minutes is None and args.runs is None:
        parser.error("give --minutes or --runs")
    names = HARNESSES if args.harness == "all" else (args.harness,)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        started = time.monotonic()
        processes = []
        for i in range(args.parallel):
            work = Path(tempfile.mkdtemp(prefix=f"fuzz-corpus-{name}-"))
            command = [
                sys.executable, __file__, "--child", name,
                str(work), str(CORPUS / name),  # first folder: written; second: committed seeds
                f"-artifact_prefix={args.artifacts.resolve()}/{name}-",
                "-timeout=10", "-rss_limit_mb=4096", "-print_final_stats=1", f"-seed={i + 1}",
            ]  # fmt: skip
            if args.minutes is not None:
                command.append(f"-max_total_time={int(args.minutes * 60)}")
            if args.runs is not None:
                command.append(f"-atheris_runs={-(-args.runs // args.parallel)}")
            log = args.artifacts / f"{name}-{i}.log" if args.parallel > 1 else None
            out = open(log, "w") if log is not None else None  # noqa: SIM115
            processes.append((subprocess.Popen(command, stdout=out, stderr=out), work, log, out))
        executed, codes = 0, []
        for process, work, log, out in processes:
            codes.append(process.wait())
            shutil.rmtree(work, ignore_errors=True)
            if out is not None:
                out.close()
                text = log.read_text()  # atheris ends a -atheris_runs run with "Done N in"
                found = re.findall(
                    r"stat::number_of_executed_units: (\d+)|^Done (\d+) in", text, re.M
                )
                found = [a or b for a, b in found]
                executed += int(found[-1]) if found else 0
        rc = max(codes, key=abs)
        seconds = time.monotonic() - started
        total = f", {executed} executions in all" if args.parallel > 1 else ""
        print(f"fuzz {name}: exit {rc} after {seconds:.0f} s{total}", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"findings in {args.artifacts}: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
