"""Result files: one JSON per run under benchmarks/results/, and what every suite records in it.

Schema (version 1), documented for readers in docs/benchmarks.md:

    {"schema": 1, "suite": "cpu", "date": "2026-12-03T07:40:00Z",
     "machine": {"name": "amd-epyc-7b13-2c", "cpu": "...", "cores": 2, "gpu": null,
                 "load_before": [1.2, 0.9, 0.5], "load_after": [...]},
     "versions": {"plex": "9b5d748", "iree": "3.13.0", "torch": "2.13.0", ...},
     "settings": {"rounds": 7, "calls": 10, "warmup": 3, "threads": 0},
                 # and where set: "config" (e.g. "full"), "cases" (the --case patterns of a
                 # partial run), "label" (what sets a kept earlier run apart)
     "source": null,            # or where imported numbers were measured (a doc, a script)
     "cases": [{"id": "minilm-b1", "title": "...", "unit": "ms", "baseline": "PLeX",
                "options": {...}, "rows": [
                  {"runner": "PLeX", "samples": [...], "check": {"metric": "max abs error",
                   "value": 1e-6, "limit": 1e-4, "passed": true}},
                  {"runner": "ONNX Runtime", "skipped": "onnxruntime is not installed"}]}]}

`samples` holds one value per round (the median of that round's calls); rounds interleave the
runners, so sample i of every row was taken under the same machine conditions and the ratio
table divides them round by round.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from myelin import hostinfo

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SCHEMA = 1


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


def spread(values: list[float]) -> Spread:
    """Median, extremes and quartiles (inclusive method: defined for two samples too)."""
    if len(values) == 1:
        v = values[0]
        return Spread(v, v, v, v, v)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Spread(statistics.median(values), min(values), max(values), q1, q3)


def ratios(baseline: list[float], other: list[float]) -> list[float]:
    """other / baseline round by round (> 1: the baseline is faster), for time-like units."""
    return [o / b for b, o in zip(baseline, other, strict=True) if b > 0]


def _gpu_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None


def slug(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|cpu @.*|processor|\d+-core", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def _cpu_generation() -> str | None:
    """x86's family and model numbers: a VM's model name can be a bare "AMD EPYC", and the
    same name has covered Zen 4 (family 25) and Zen 5 (family 26) hosts, whose AVX-512 units
    differ (Zen 4 runs 512-bit operations in two halves)."""
    fields = hostinfo.cpuinfo()
    if "cpu family" not in fields or "model" not in fields:
        return None
    named = hostinfo.llvm_cpu()
    generation = f"family {fields['cpu family']}, model {fields['model']}"
    return f"{generation} ({named})" if named else generation


def machine(gpu: bool = False) -> dict:
    """What the numbers depend on: the CPU (or GPU) model, the cores, the load when it ran."""
    cpu = hostinfo.cpu_name()
    cores = os.cpu_count() or 1
    gpu_name = _gpu_name() if gpu else None
    name = slug(gpu_name) if gpu_name else f"{slug(cpu)}-{cores}c"
    return {
        "name": name,
        "cpu": cpu,
        "cpu_generation": _cpu_generation(),
        "cores": cores,
        "gpu": gpu_name,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def plex_revision() -> str | None:
    """The commit measured: `PLEX_REVISION` where the caller knows it better than git (the GPU
    machine's copy of the tree carries a stale .git), else the checkout's HEAD (+dirty)."""
    if os.environ.get("PLEX_REVISION"):
        return os.environ["PLEX_REVISION"]
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{rev}+dirty" if dirty else rev


def versions() -> dict:
    found = {
        "plex": plex_revision(),
        "python": platform.python_version(),
        "iree": _version("iree-base-runtime"),
        "iree-compiler": _version("iree-base-compiler"),
        "torch": _version("torch"),
        "onnxruntime": _version("onnxruntime"),
        "transformers": _version("transformers"),
        "openvino": _version("openvino"),
        "llama-cpp-python": _version("llama_cpp_python"),
        "onnxruntime-genai": _version("onnxruntime-genai"),
    }
    return {k: v for k, v in found.items() if v is not None}


def new_run(suite: str, settings: dict, gpu: bool = False) -> dict:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {
        "schema": SCHEMA,
        "suite": suite,
        "date": now.isoformat().replace("+00:00", "Z"),
        "machine": machine(gpu),
        "versions": versions(),
        "settings": settings,
        "source": None,
        "cases": [],
    }


def write(run: dict, folder: Path = RESULTS, path: Path | None = None) -> Path:
    """benchmarks/results/<suite>/<date>_<machine>.json; a second run the same minute adds -2.
    With `path` (what an earlier write of the same run returned), that file is written again:
    a suite that writes after every case keeps what it measured if it is stopped."""
    run["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if path is None:
        stamp = run["date"].replace(":", "").replace("-", "")[:13]
        target = folder / run["suite"]
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{stamp}_{run['machine']['name']}.json"
        n = 2
        while path.exists():
            path = target / f"{stamp}_{run['machine']['name']}-{n}.json"
            n += 1
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def load_all(folder: Path = RESULTS) -> list[dict]:
    runs = []
    for path in sorted(folder.glob("*/*.json")):
        run = json.loads(path.read_text())
        if run.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {run.get('schema')}, this reader knows {SCHEMA}")
        run["_path"] = str(path.relative_to(REPO))
        runs.append(run)
    return runs


def table_name(run: dict) -> str:
    """The machine's name, plus what makes a run a table of its own: another configuration
    (`settings.config`, e.g. the full CPU table, once per thread count), the cases a partial
    run of it measured, a label that keeps a run beside later ones of the same settings."""
    name = run["machine"]["name"]
    settings = run.get("settings", {})
    if settings.get("config"):
        name += f" {settings['config']}, threads {settings.get('threads', 0)}"
        if settings.get("cases"):
            name += f", cases {' '.join(settings['cases'])}"
    if settings.get("label"):
        name += f", {settings['label']}"
    return name


# Suites whose case id names everything measured (the case file holds its options): a run of
# some of their cases replaces only those cases' tables.
BY_CASE = ("cpu", "gpu")


def latest_per_case(runs: list[dict]) -> list[dict]:
    """What the manual shows, per suite and table (`table_name`), newest first. A BY_CASE
    suite: each case's newest result; the newest run is shown whole, an older run keeps only the
    cases no newer run measured (so `--case ID` leaves the suite's other tables as they were)
    and goes once it has none. Other suites (whose ids leave out settings such as prompt
    length): the newest run."""
    seen: set[tuple[str, str, str]] = set()
    whole: set[tuple[str, str]] = set()
    shown = []
    for run in sorted(runs, key=lambda r: r["date"], reverse=True):
        key = (run["suite"], table_name(run))
        if run["suite"] not in BY_CASE:
            if key not in whole:
                whole.add(key)
                shown.append(run)
            continue
        cases = [c for c in run["cases"] if (*key, c["id"]) not in seen]
        seen |= {(*key, c["id"]) for c in cases}
        if cases:
            shown.append({**run, "cases": cases})
    return shown
