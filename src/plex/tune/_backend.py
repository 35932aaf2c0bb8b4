"""An external backend as one more `plex tune` candidate (docs/backends.md): the app's
contractions placed on a backend device (e.g. examples/backends/blas, OpenBLAS sgemm), built,
checked against the reference's outputs and timed interleaved with it.

The granularity is the app's, not the dispatch's: `[placement] "<graph>:<op>"` sends every
covered op of that kind of the graphs it names to the backend (the backend's `min_flops` keeps
small matmuls on IREE's codegen), so the candidate is "every op the backend implements (matmul,
attention, ...) on the backend". A tuning package cannot
place ops (placement is the app's decision), so a faster result is reported with the lines to
add to the app, not written into the package.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

BACKEND_DEVICE = "plex_tune_backend"  # the backend device the candidate app adds


@dataclass
class BackendTrial:
    backend: str  # "package:name"
    ops: tuple[str, ...] = ("matmul",)  # the ops the candidate placed on it
    status: str = "pending"  # ok | failed | mismatch
    relative: float | None = None  # its time / the reference's, same batch
    spread: float | None = None

    @property
    def faster(self) -> bool:
        return self.status == "ok" and self.relative is not None and self.relative < 1.0

    def app_lines(self, package_dir: Path) -> str:
        """What to add to the app to use the backend as timed (a device named after it)."""
        device = self.backend.rpartition(":")[2]
        rules = "; ".join(f'"*:{op}" = "{device}"' for op in self.ops)
        return (
            f'packages += ["{package_dir}"]; [devices.{device}] backend = "{self.backend}"; '
            f"[placement] {rules}; and the device in the variant"
        )

    def to_json(self) -> dict:
        return {
            "kind": "backend",
            "backend": self.backend,
            "status": self.status,
            "relative": self.relative,
            "spread": self.spread,
        }


def _first_backend(package_dir: Path) -> tuple[str, dict]:
    manifest = package_dir / "plex.toml"
    if not manifest.is_file():
        raise ValueError(f"--backend {package_dir}: no plex.toml there; give a backend package")
    data = tomllib.loads(manifest.read_text())
    names = list(data.get("backend", {}))
    if not names:
        raise ValueError(f"--backend {package_dir}: its plex.toml declares no [backend.<name>]")
    return f"{data['package']['name']}:{names[0]}", data["backend"][names[0]]


def backend_ref(package_dir: Path) -> str:
    """`package:name` of the (first) backend a package folder declares, or ValueError."""
    return _first_backend(package_dir)[0]


def backend_ops(package_dir: Path) -> tuple[str, ...]:
    """The ops that backend implements (its `ops`), in its order: the candidate places all."""
    return tuple(_first_backend(package_dir)[1].get("ops", ["matmul"]))


def backend_app(app_toml: str, device: str, package_dir: Path) -> str:
    """The derived (one-device) app with the backend's package, a device of it in the variant,
    and every graph's ops of the kinds the backend implements placed on it."""
    import tomli_w

    data = tomllib.loads(app_toml)
    data["app"]["packages"] = [*data["app"].get("packages", []), str(package_dir.resolve())]
    data.setdefault("devices", {})[BACKEND_DEVICE] = {"backend": backend_ref(package_dir)}
    data["variant"] = [{"name": "tune", "devices": [device, BACKEND_DEVICE]}]
    data["placement"] = {f"*:{op}": BACKEND_DEVICE for op in backend_ops(package_dir)}
    return tomli_w.dumps(data)


def check_and_time(
    reference: Path,
    candidate: Path,
    function: str,
    inputs: list,
    want: list,
    rounds: int,
) -> tuple[bool, float | None, float | None]:
    """(outputs equal, candidate time / reference time, candidate spread), measured in a
    process of its own: a backend's plugin must be registered before the process creates its
    first local-task device, and the tuner's process has long made one."""
    import json
    import subprocess
    import sys
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="plex-tune-backend-") as work:
        folder = Path(work)
        np.savez(folder / "inputs.npz", *inputs)
        np.savez(folder / "want.npz", *want)
        command = [sys.executable, "-m", "plex.tune._backend", str(reference), str(candidate),
                   function, str(folder), str(rounds)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"timing the backend candidate failed: {done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["equal"], result.get("relative"), result.get("spread")


def _main(argv: list[str]) -> int:
    """`python -m plex.tune._backend REFERENCE CANDIDATE FUNCTION FOLDER ROUNDS`: the candidate
    is loaded first (its plugin registered before any local-task device), then both are timed
    interleaved; prints one JSON line."""
    import json

    import numpy as np

    from myelin.tuning.timing import outputs_of, same_outputs, time_interleaved

    reference, candidate, function, folder, rounds = argv
    with np.load(Path(folder) / "inputs.npz") as f:
        inputs = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    with np.load(Path(folder) / "want.npz") as f:
        want = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    got = outputs_of(Path(candidate), function, inputs)
    result: dict = {"equal": same_outputs(got, want)}
    if result["equal"]:
        timed, base = time_interleaved(
            [Path(candidate), Path(reference)], function, inputs, rounds=int(rounds)
        )
        result.update(relative=timed.median_s / base.median_s, spread=timed.spread)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
