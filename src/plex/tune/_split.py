"""`plex tune --bundle` / `--collect`: the tuner split across two machines, for a device this
machine does not have (a remote GPU box that has only iree-base-runtime, no compiler).

1. `plex tune APP --device NAME -o DIR --bundle BUNDLE`: here, build the reference and one round
   of candidates (nevergrad asks a batch per hot contraction) into BUNDLE: the artifacts, the
   inputs (inputs.npz) and bundle.json (cases, configs, the trials so far: the search's state).
2. `python -m myelin.tuning.time_bundle BUNDLE -o RESULTS`: there, runtime only.
3. `plex tune APP --device NAME -o DIR --collect RESULTS`: here, tell the results to the search,
   write the tuning package and tuning.json (keyed as the local flow keys them) and, while
   trials remain, the next round's bundle in BUNDLE's place.

The optimizer's state is its history: every round rebuilds nevergrad's optimizer from the seed
and tells it every trial so far (what `--resume` does locally), so nothing unpicklable travels.
No profile ranks the dispatches (the device is elsewhere): they are ranked by static work, the
product of their known loop sizes.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from myelin.tuning.time_bundle import BUNDLE_JSON, INPUTS_NPZ, RESULTS_JSON
from plex.tune._local import _Candidates, _device_app, _symbol, _write_package
from plex.tune._search import (
    DispatchResult,
    Proposal,
    TuneError,
    completed,
    cpu_proposal,
    entry_of,
    next_batch,
    record,
    round_seed,
    trial_of,
)

SCHEMA = 1
REFERENCE = "reference.mln"


@dataclass
class _Setup:
    """What both halves here need: the app for that device, its reference build, its
    contractions, the search space and the database key of the target."""

    app_name: str
    target: str  # "llvm-cpu" | "cuda"
    target_key: str  # tuning.json's target: arch (and CPU features)
    iree: str
    candidates: _Candidates
    reference: Path
    contractions: dict  # dispatch -> ConfiguredContraction
    knobs: dict
    propose: Callable  # (ConfiguredContraction, choice) -> Proposal
    entrypoints: dict  # name -> signature


def _setup(app_path: Path, device: str, out_dir: Path, cache_dir: Path | None, jobs, log) -> _Setup:
    from myelin.mln import MlnReader
    from myelin.tuning.cpu import configured_contractions
    from plex.builder import build, default_cache_dir
    from plex.builder.versions import versions
    from plex.manifest import load_app
    from plex.tune._local import _cpu_arch

    app = load_app(app_path)
    spec_device = next((d for d in app.devices if d.name == device), None)
    if spec_device is None:
        names = ", ".join(d.name for d in app.devices)
        raise TuneError(f"{app_path}: no device named {device!r}; it has: {names}")
    if spec_device.target not in ("llvm-cpu", "cuda"):
        raise TuneError(
            f"device {device!r} has target {spec_device.target!r}: the split tuner has search "
            "spaces for llvm-cpu and cuda devices only"
        )
    work = out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)
    cache = (cache_dir or default_cache_dir(app)).resolve()
    derived = _device_app(app_path, device)
    fingerprints = tuple(p.fingerprint for p in app.packages)
    (work / "app.toml").write_text(derived)
    build(work / "app.toml", work / "ir", compile_to="executable-configurations", cache_dir=cache)
    ir_text = "\n".join(p.read_text() for p in sorted((work / "ir").rglob("*.mlir")))
    gpu = spec_device.target == "cuda"
    found = {c.dispatch: c for c in configured_contractions(ir_text, gpu=gpu)}
    candidates = _Candidates(
        derived, fingerprints, cache, work, jobs, log=log, target=spec_device.target
    )
    [reference] = candidates.build([None])
    if reference is None:
        raise TuneError(f"the untuned build of {app_path} failed (candidate build logs: {cache})")
    with MlnReader(reference) as reader:
        entrypoints = {
            e.name: e.signature for e in reader.artifact_manifest.variants[0].entrypoints
        }
    if gpu:
        knobs, propose = _cuda_space()
        target_key = f"cuda:{spec_device.arch or 'default'}"
    else:
        knobs, propose = _cpu_space(ir_text)
        target_key = f"llvm-cpu:{_cpu_arch(ir_text)}"
    return _Setup(
        app.name,
        spec_device.target,
        target_key,
        versions()["iree-base-compiler"],
        candidates,
        reference,
        found,
        knobs,
        propose,
        entrypoints,
    )


def _cpu_space(ir_text: str):
    from myelin.tuning.cpu import cpu_target_of, space

    target = cpu_target_of(ir_text)
    return space(), lambda c, choice: cpu_proposal(c, choice, target)


def _cuda_space():
    from myelin.tuning.cpu import element_bytes
    from myelin.tuning.cuda import SIMT_KNOBS, SimtTiles

    def propose(c, choice: dict) -> Proposal:
        tiles = SimtTiles(**choice)
        m = c.match
        if m.batch or len(m.m) != 1 or len(m.n) != 1 or len(m.k) != 1:
            return Proposal(choice, tiles.to_json(), ["only plain (M, N, K) matmuls so far"], "")
        why = tiles.violations(m.m[0], m.n[0], m.k[0], element_bytes(m.lhs_type))
        return Proposal(choice, tiles.to_json(), why, "" if why else tiles.compilation_info())

    return SIMT_KNOBS, propose


def _work(c) -> float:
    m = c.match
    return float(math.prod(x for x in (*m.batch, *m.m, *m.n, *m.k) if x))


def make_bundle(
    app_path: Path,
    device: str,
    out_dir: Path,
    bundle_dir: Path,
    *,
    trials: int = 16,
    batch: int = 4,
    function: str | None = None,
    dims: Sequence[str] = (),
    max_dispatches: int = 3,
    rounds: int = 5,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    """Step 1: the reference and the first round of candidates into `bundle_dir`."""
    from plex.tune._database import Database, entry_key

    out_dir = out_dir.resolve()
    setup = _setup(app_path, device, out_dir, cache_dir, jobs, log)
    names = list(setup.entrypoints)
    function = function or ("forward" if "forward" in names else names[0])
    if function not in setup.entrypoints:
        raise TuneError(f"no entrypoint {function!r}; the app has: {', '.join(names)}")
    ranked = sorted(setup.contractions.values(), key=_work, reverse=True)[:max_dispatches]
    if not ranked:
        raise TuneError(f"{setup.app_name}: no contraction dispatch to tune on device {device!r}")
    database = Database.open(out_dir)
    state = {
        "schema": SCHEMA,
        "app": setup.app_name,
        "device": device,
        "target": setup.target,
        "target_key": setup.target_key,
        "iree": setup.iree,
        "function": function,
        "dims": list(dims),
        "trials": trials,
        "batch": batch,
        "seed": seed,
        "rounds": rounds,
        "round": 0,
        "cases": [],
    }
    for c in ranked:
        key = entry_key(c.match.fingerprint(), setup.target_key, setup.iree)
        stored = database.entries.get(key, {})
        state["cases"].append(
            {"dispatch": c.dispatch, "key": key, "trials": list(stored.get("trials", []))}
        )
    return _write_round(setup, state, _inputs(setup, state), bundle_dir, log)


def _write_round(
    setup: _Setup, state: dict, inputs: list[np.ndarray], bundle_dir: Path, log
) -> Path:
    """Ask each unfinished case's next batch, build them, and write the bundle."""
    from myelin.tuning.spec import SpecEntry, render_spec

    pending: list[tuple[dict, object]] = []  # (case, proposal)
    for index, case in enumerate(state["cases"]):
        c = setup.contractions[case["dispatch"]]
        result = DispatchResult(c.dispatch, c.match.describe(), case["key"], 0.0, c.default_config)
        result.trials = case["trials"]
        case["candidates"] = []
        proposals = next_batch(
            result,
            setup.knobs,
            lambda ch, c=c: setup.propose(c, ch),
            state["trials"],
            state["batch"],
            round_seed(state["seed"] + index, state["round"]),
        )
        pending += [(case, proposal) for proposal in proposals]
    specs = [
        render_spec(
            [
                SpecEntry(
                    _symbol(case["dispatch"]), setup.contractions[case["dispatch"]].match, p.info
                )
            ]
        )
        for case, p in pending
    ]
    built = setup.candidates.build(specs)
    shutil.rmtree(bundle_dir, ignore_errors=True)
    bundle_dir.mkdir(parents=True)
    shutil.copyfile(setup.reference, bundle_dir / REFERENCE)
    np.savez(bundle_dir / INPUTS_NPZ, *inputs)
    count = 0
    for (case, p), artifact in zip(pending, built, strict=True):
        if artifact is None:  # told as failed at collect time, with the others
            case["trials"].append(trial_of(p, "failed", info=True))
            continue
        name = f"r{state['round']}_c{count:03d}"
        count += 1
        shutil.copyfile(artifact, bundle_dir / f"{name}.mln")
        trial = {"choice": p.choice, "config": p.config, "info": p.info}
        case["candidates"].append({"name": name, "file": f"{name}.mln", **trial})
    state["reference"] = REFERENCE
    state["bundle"] = str(bundle_dir.resolve())  # where --collect writes the next round
    state["inputs"] = [{"shape": list(x.shape), "dtype": str(x.dtype)} for x in inputs]
    (bundle_dir / BUNDLE_JSON).write_text(json.dumps(state, indent=1))
    log(
        f"plex tune: round {state['round']}: {count} candidates for "
        f"{sum(1 for c in state['cases'] if c['candidates'])} dispatches in {bundle_dir}"
    )
    return bundle_dir


def collect(
    app_path: Path,
    device: str,
    out_dir: Path,
    results_path: Path,
    bundle_dir: Path | None = None,
    *,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> Path | None:
    """Step 3: tell the results, write the package; the next round's bundle (None: done)."""
    from plex.tune._database import Database

    path = results_path / RESULTS_JSON if results_path.is_dir() else results_path
    if not path.is_file():
        raise TuneError(f"{results_path}: no {RESULTS_JSON}; pass what time_bundle's -o wrote")
    results = json.loads(path.read_text())
    state = results["bundle"]
    if state.get("schema") != SCHEMA or state["device"] != device:
        raise TuneError(f"{path}: results of device {state.get('device')!r}, not {device!r}")
    out_dir = out_dir.resolve()
    setup = _setup(app_path, device, out_dir, cache_dir, jobs, log)
    missing = [c["dispatch"] for c in state["cases"] if c["dispatch"] not in setup.contractions]
    if missing:
        raise TuneError(
            f"{app_path} changed since the bundle (no dispatch {missing[0]}): "
            "start again with --bundle"
        )
    base = results["reference"]["median_s"]
    database = Database.open(out_dir)
    finished: list[DispatchResult] = []
    for case in state["cases"]:
        c = setup.contractions[case["dispatch"]]
        result = DispatchResult(c.dispatch, c.match.describe(), case["key"], 0.0, c.default_config)
        for old in case["trials"]:
            record(result, old)
        for cand in case.pop("candidates"):
            row = results["candidates"].get(cand["name"], {"status": "not timed"})
            asked = Proposal(cand["choice"], cand["config"], [], cand["info"])
            if row["status"] == "ok":
                trial = trial_of(
                    asked,
                    "ok",
                    relative=row["relative"],
                    median_s=row["median_s"],
                    spread=row["spread"],
                    default_s=base,
                    info=True,
                )
            else:
                trial = trial_of(asked, row["status"].split(":")[0], info=True)
            record(result, trial)
        case["trials"] = result.trials
        database.entries[result.key] = entry_of(result, c, setup.target_key, setup.iree)
        finished.append(result)
        best = f"{result.best['relative']:.3f}x the default's time" if result.best else "none"
        log(f"  {c.dispatch}: trials {completed(result)}/{state['trials']}, best {best}")
    database.save()
    package = _package(setup, out_dir, device, finished)
    log(f"plex tune: wrote {package}")
    remaining = any(completed(r) < state["trials"] for r in finished)
    if not remaining:
        return None
    state["round"] += 1
    return _write_round(
        setup, state, _inputs(setup, state), bundle_dir or Path(state["bundle"]), log
    )


def _inputs(setup: _Setup, state: dict) -> list[np.ndarray]:
    """The random inputs of the tuned entrypoint: the same every round (seeded)."""
    from plex.tensor_args import parse_dims, synthetic_inputs

    function = state["function"]
    signature = setup.entrypoints[function]
    inputs = synthetic_inputs(signature, parse_dims(state["dims"]), function, state["seed"])
    return [np.asarray(x) for x in inputs]


def _package(setup: _Setup, out_dir: Path, device: str, results: list[DispatchResult]) -> Path:
    """plex.toml + the spec: every dispatch's best config faster than IREE's default; none
    faster: the best one all the same (a valid package, its gain recorded in tuning.json)."""
    from myelin.tuning.spec import SpecEntry, render_spec

    found = [r for r in results if r.best is not None and r.best.get("info")]
    kept = [r for r in found if r.best["relative"] < 1.0]
    if not kept:
        kept = sorted(found, key=lambda r: r.best["relative"])
        kept = kept[:1]
    if not kept:
        raise TuneError("no candidate ran and computed the reference's outputs yet")
    entries = [
        SpecEntry(
            _symbol(r.dispatch),
            setup.contractions[r.dispatch].match,
            r.best["info"],
            comment=f"{r.dispatch}: {r.describe}; {r.best['relative']:.3f}x the default's time",
        )
        for r in kept
    ]
    header = (
        f"Written by plex tune (split) for app {setup.app_name}, device {device} "
        f"({setup.target_key}), IREE {setup.iree}."
    )
    spec = render_spec(entries, header=header)
    return _write_package(out_dir, setup.app_name, device, spec, (), setup.target)


def next_commands(app: Path, device: str, out_dir: Path, bundle_dir: Path) -> list[str]:
    """The two commands that continue a round (printed after --bundle and --collect): the
    first runs on the device's machine from a copy of this repository, the second here."""
    q = shlex.quote
    results = bundle_dir.parent / f"{bundle_dir.name}-results"
    return [
        f"PYTHONPATH=src python -m myelin.tuning.time_bundle {q(str(bundle_dir))} "
        f"-o {q(str(results))}",
        f"plex tune {q(str(app))} --device {q(device)} -o {q(str(out_dir))} "
        f"--collect {q(str(results))}",
    ]
