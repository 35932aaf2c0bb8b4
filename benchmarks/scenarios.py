"""The `build` and `runtime` suites: scenarios rather than models next to anchors. Each case's
rows are the scenario's steps (a cold build, a no-op rebuild; MyeLiN's call next to raw
iree.runtime) timed in interleaved rounds, recorded in the same result schema as the model
suites (benchmarks/results.py)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "benchmarks" / "cases"


def load_cases(suite: str) -> tuple[dict, list[dict]]:
    data = tomllib.loads((CASES / f"{suite}.toml").read_text())
    defaults = data.get("defaults", {})
    return data.get("suite", {}), [{**defaults, **c} for c in data.get("case", [])]


def _case_result(case: dict, unit: str, baseline: str, samples: dict[str, list[float]]) -> dict:
    return {
        "id": case["id"],
        "title": case["title"],
        "unit": unit,
        "baseline": baseline,
        "options": {k: v for k, v in case.items() if k not in ("id", "title")},
        "rows": [
            {"runner": name, "samples": [round(v, 4) for v in values]}
            for name, values in samples.items()
        ],
    }


# ---- build -----------------------------------------------------------------------------------


def _plex_build(app: Path, out: Path, cache: Path) -> float:
    """Seconds of one `plex build` in a new process, as a user runs it (start-up included)."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(app), "-o", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PLEX_CACHE_DIR": str(cache)},
    )
    took = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"plex build {app} failed: {result.stderr.strip()[-500:]}")
    return took


def build_case(case: dict) -> dict:
    """Per round, in a fresh copy of the example with an empty cache: `cold` (empty cache),
    `warm` (a new output from the full cache), `no-op` (the same output, nothing changed) and,
    where the case names a source file, `one source edited` (a comment appended to it: a cache
    miss for what reads that file only)."""
    samples: dict[str, list[float]] = {"cold": [], "warm": [], "no-op": []}
    if case.get("edit"):
        samples["one source edited"] = []
    with tempfile.TemporaryDirectory(prefix="plex-bench-build-") as tmp:
        for index in range(case["rounds"]):
            folder = Path(tmp) / f"round{index}"
            shutil.copytree(
                REPO / "examples" / case["example"],
                folder,
                ignore=shutil.ignore_patterns("*.lock", "__pycache__"),
            )
            app, cache = folder / case.get("app", "app.toml"), folder / "cache"
            samples["cold"].append(_plex_build(app, folder / "a.mln", cache))
            samples["warm"].append(_plex_build(app, folder / "b.mln", cache))
            samples["no-op"].append(_plex_build(app, folder / "b.mln", cache))
            if case.get("edit"):
                with (folder / case["edit"]).open("a") as f:
                    f.write(f"\n// edit {index}\n" if case["edit"].endswith(".mlir") else "\n")
                samples["one source edited"].append(_plex_build(app, folder / "b.mln", cache))
    return _case_result(case, "s", "cold", samples)


# ---- runtime ---------------------------------------------------------------------------------


def build_mlp(folder: Path, cancellable: bool) -> Path:
    """examples/mlp; `cancellable = false` gives the synchronous ABI that a plain
    FunctionInvoker calls, so raw iree.runtime and MyeLiN run the very same module."""
    from plex.builder import build

    app = folder / f"app-{cancellable}.toml"
    app.write_text(
        f'[app]\nname = "mlp"\npackages = ["{REPO / "examples" / "mlp"}"]\n\n'
        f"[runtime]\ncancellable = {str(cancellable).lower()}\n"
    )
    out = folder / f"mlp-{cancellable}.mln"
    build(app, out)
    return out


def raw_invoker(path: Path, function: str) -> Callable[[np.ndarray], np.ndarray]:
    """iree.runtime by hand, reading the module and parameters from the same .mln: what a user
    of iree.runtime writes without MyeLiN."""
    import iree.runtime as rt

    from myelin.mln import MlnReader

    reader = MlnReader(path)
    variant = reader.manifest["variants"][0]
    instance = rt.VmInstance()
    device = rt.get_device("local-task")
    section = variant["modules"][0]["section"]
    module = rt.VmModule.copy_buffer(instance, bytes(reader.section_view(section)))
    handle = rt.FileHandle.wrap_memory(reader.mmap, readable=True, writable=False)
    index = rt.ParameterIndex()
    for p in reader.manifest["parameters"]:
        index.add_from_file_handle(
            p["key"], handle, p["length"], offset=reader.sections[p["section"]].offset + p["offset"]
        )
    params = rt.create_io_parameters_module(instance, index.create_provider(scope="mlp"))
    context = rt.VmContext(instance, [rt.create_hal_module(instance, device), params, module])
    invoker = rt.FunctionInvoker(context, device, module.lookup_function(function))
    keep = (reader, handle, index, params, context, module)

    def call(x: np.ndarray) -> np.ndarray:
        return invoker(x).to_host()

    call.keep = keep  # type: ignore[attr-defined]
    return call


def _interleaved_us(fns: dict[str, Callable], x: np.ndarray, rounds: int, calls: int) -> dict:
    """Per path, one sample per round: the median µs per call, the paths taking turns call by
    call (A B C A B C ...) so drift in the machine's speed hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    items = list(fns.items())
    for _ in range(rounds):
        times: dict[str, list[float]] = {name: [] for name in fns}
        for i in range(calls):
            for name, fn in items if i % 2 == 0 else reversed(items):
                start = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - start)
        for name, values in times.items():
            samples[name].append(statistics.median(values) * 1e6)
    return samples


def overhead_case(case: dict, folder: Path) -> dict:
    """MyeLiN's call paths vs raw iree.runtime on the same compiled module and parameters."""
    import myelin

    path = build_mlp(folder, cancellable=False)
    model = myelin.Instance().load(path)
    session = model.session()
    resolved = session.resolve("forward")
    fenced_model = myelin.Instance().load(build_mlp(folder, cancellable=True))
    fenced_session = fenced_model.session()
    fenced = fenced_session.resolve("forward")
    raw = raw_invoker(path, "forward")
    paths = {
        "raw iree.runtime": raw,
        "MyeLiN resolved call": lambda x: resolved(x),
        "MyeLiN session.call": lambda x: session.call("forward", x),
        "MyeLiN resolved call, cancellable build": lambda x: fenced(x),
    }
    x = np.random.default_rng(0).standard_normal((case["batch"], 16)).astype(np.float32)
    want = raw(x)
    for fn in paths.values():
        np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=1e-6)
    _interleaved_us(paths, x, 1, case["warmup"])
    samples = _interleaved_us(paths, x, case["rounds"], case["calls"])
    for obj in (fenced_session, fenced_model, session, model):
        obj.close()
    return _case_result(case, "µs", "raw iree.runtime", samples)


def concurrency_case(case: dict, folder: Path) -> dict:
    """Time per call when N threads each call their own session of one model at once (sessions
    share the model's modules, parameters and devices): wall time of the burst / all calls."""
    import myelin
    from benchmarks import runner, zoo

    spec = runner.Case(
        id=case["id"],
        title=case["title"],
        model=case["model"],
        batch=1,
        seq=case.get("seq", 128),
        build=case.get("build", {}),
    )
    mln = runner.build_case(spec, folder)
    _, inputs = zoo.source(spec.model, spec.batch, spec.seq)
    model = myelin.Instance().load(mln)
    counts = case["threads"]
    sessions = [model.session() for _ in range(max(counts))]
    calls = [s.resolve("forward") for s in sessions]
    for call in calls:
        call(*inputs)

    def burst(n: int) -> float:
        barrier = threading.Barrier(n + 1)

        def work(call: Callable) -> None:
            barrier.wait()
            for _ in range(case["calls"]):
                call(*inputs)

        workers = [threading.Thread(target=work, args=(c,)) for c in calls[:n]]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        return (time.perf_counter() - start) / (n * case["calls"]) * 1e3

    samples: dict[str, list[float]] = {f"{n} thread{'s' * (n > 1)}": [] for n in counts}
    for r in range(case["rounds"]):
        order = counts[r % len(counts) :] + counts[: r % len(counts)]
        for n in order:
            samples[f"{n} thread{'s' * (n > 1)}"].append(burst(n))
    for s in sessions:
        s.close()
    model.close()
    return _case_result(case, "ms", next(iter(samples)), samples)


RUNTIME_KINDS = {"overhead": overhead_case, "concurrency": concurrency_case}


def run_runtime_case(case: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="plex-bench-runtime-") as tmp:
        return RUNTIME_KINDS[case["kind"]](case, Path(tmp))
