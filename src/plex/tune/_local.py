"""`plex tune` on this machine (the local flow, docs/tuning.md): the reference build, the hot
dispatches by measured time, the weight-layout trials and an external backend as candidates,
then per hot dispatch the shared search loop (plex.tune._search) measured here, and the
tuning package."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

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

if TYPE_CHECKING:
    from myelin.compiler.targets import HostChoice
    from myelin.tuning.cpu import ConfiguredContraction, CpuTarget
    from plex.tune._database import Database
    from plex.tune._headroom import Headroom


@dataclass
class TuneResult:
    package: Path
    spec: Path
    dispatches: list[DispatchResult]
    untuned_s: float
    tuned_s: float
    untuned_spread: float
    tuned_spread: float
    outputs_equal: bool
    layouts: list = field(default_factory=list)  # plex.tune._layouts.LayoutTrial, in order
    backend: object | None = None  # plex.tune._backend.BackendTrial, with --backend
    backend_dir: Path | None = None
    # the final measurement and whether the package applies anything (plex.tune._headroom)
    headroom: Headroom | None = None

    @property
    def speedup(self) -> float:
        return self.untuned_s / self.tuned_s

    @property
    def applied(self) -> bool:
        """Whether the package's table applies the tuned spec and layouts."""
        return self.headroom is not None and self.headroom.applies


def tune(
    app_path: Path,
    device: str,
    out_dir: Path,
    *,
    trials: int = 16,
    batch: int = 4,
    resume: bool = False,
    function: str | None = None,
    dims: Sequence[str] = (),
    max_dispatches: int = 3,
    rounds: int = 5,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
    executor: str = "local",
    backend: Path | None = None,
    required_gain: float | None = None,
) -> TuneResult:
    """Tune `device` of the app; the package applies the result only if the tuned build beats
    the untuned one by more than the untuned build's measured noise (or `required_gain`, a
    fraction: 0.1 asks for 10% faster), else it applies nothing and its summary says why."""
    from myelin.mln import MlnReader
    from myelin.runtime.profiling import capture
    from myelin.tuning.cpu import configured_contractions, cpu_target_of
    from myelin.tuning.timing import outputs_of, same_outputs
    from plex.builder import build, default_cache_dir
    from plex.builder.plan import data_tiling_of
    from plex.builder.versions import versions
    from plex.manifest import load_app
    from plex.tensor_args import parse_dims, synthetic_inputs
    from plex.tune._candidates import candidate_app
    from plex.tune._database import Database, entry_key
    from plex.tune._layouts import layout_trials

    app = load_app(app_path)
    spec_device = next((d for d in app.devices if d.name == device), None)
    if spec_device is None:
        names = ", ".join(d.name for d in app.devices)
        raise TuneError(f"{app_path}: no device named {device!r}; it has: {names}")
    if spec_device.target != "llvm-cpu":
        raise TuneError(
            f"device {device!r} has target {spec_device.target!r}: plex tune times candidates "
            "here on llvm-cpu devices only; for a device on another machine use --bundle "
            "BUNDLE, then --collect (docs/tuning.md, 'Split tuning')"
        )
    out_dir = out_dir.resolve()
    work = out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)
    cache = (cache_dir or default_cache_dir(app)).resolve()
    derived = work / "app.toml"
    derived.write_text(_device_app(app_path, device))
    fingerprints = tuple(p.fingerprint for p in app.packages)

    log(f"plex tune: {app.name} on device {device} (llvm-cpu); reference build")
    build(derived, work / "ir", compile_to="executable-configurations", cache_dir=cache)
    ir_text = "\n".join(p.read_text() for p in sorted((work / "ir").rglob("*.mlir")))
    found = configured_contractions(ir_text)
    target = cpu_target_of(ir_text)
    arch = _cpu_arch(ir_text)
    iree = versions()["iree-base-compiler"]
    # executor "ray": candidates build as CPU tasks, batches are timed by GPU-claiming tasks
    candidates = _Candidates(derived.read_text(), fingerprints, cache, work, jobs, executor, log)
    [reference] = candidates.build([None])
    if reference is None:
        raise TuneError(f"the untuned build of {app_path} failed: see {work / 'reference.log'}")

    with MlnReader(reference) as reader:
        variant = reader.artifact_manifest.variants[0]
    names = [e.name for e in variant.entrypoints]
    function = function or ("forward" if "forward" in names else names[0])
    entry = next((e for e in variant.entrypoints if e.name == function), None)
    if entry is None:
        raise TuneError(f"no entrypoint {function!r}; the app has: {', '.join(names)}")
    inputs = synthetic_inputs(entry.signature, parse_dims(list(dims)), function, seed=seed)
    want = outputs_of(reference, function, inputs)

    profile = capture(reference, function, inputs, work / "profile", repeat=max(3, rounds))
    total = sum(d.total_ns for d in profile.dispatches) or 1
    measured = {d.name: d.total_ns for d in profile.dispatches}

    def share_of(dispatch: str) -> float:
        ns = sum(v for k, v in measured.items() if dispatch in k or k in dispatch)
        return ns / total

    ranked = sorted(found, key=lambda c: share_of(c.dispatch), reverse=True)[:max_dispatches]
    if not ranked:
        raise TuneError(
            f"{app.name}: no contraction dispatch to tune on device {device!r}"
            + _data_tiling_hint(*data_tiling_of(app, spec_device), device)
        )
    for c in ranked:
        log(f"  hot: {c.dispatch} {share_of(c.dispatch):.0%} of the call ({c.match.describe()})")

    database = Database.open(out_dir)
    with MlnReader(reference) as reader:
        weights = [
            (f"{p.scope}::{p.key}", tuple(p.shape))
            for p in reader.artifact_manifest.parameters
            if len(p.shape) == 2
        ]
    setup = TrialSetup(
        candidates,
        reference,
        function,
        inputs,
        want,
        rounds,
        database,
        f"llvm-cpu:{arch}",
        iree,
        log,
    )
    layout_results = _search_layouts(layout_trials(ranked, weights, _dim_sizes(dims)), setup)
    backend_trial = (
        _try_backend(backend, device, derived.read_text(), setup) if backend is not None else None
    )
    if candidates.layouts:  # the tile search runs on the kept layouts: new maps, new dispatches
        [reference] = candidates.build([None])
        if reference is None:
            raise TuneError(f"the build with the kept weight layouts failed: see {work}")
        setup = replace(setup, reference=reference)
        ir_dir, folder = work / "ir-layouts", work / "layouts"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        build_app = folder / "app.toml"
        layouts = candidates.layouts
        build_app.write_text(candidate_app(derived.read_text(), folder, None, layouts, "llvm-cpu"))
        build(build_app, ir_dir, compile_to="executable-configurations", cache_dir=cache)
        ir_text = "\n".join(p.read_text() for p in sorted(ir_dir.rglob("*.mlir")))
        found = {c.dispatch: c for c in configured_contractions(ir_text)}
        profile = capture(reference, function, inputs, work / "profile-layouts", repeat=rounds)
        total = sum(d.total_ns for d in profile.dispatches) or 1
        measured = {d.name: d.total_ns for d in profile.dispatches}
        ranked = sorted(found.values(), key=lambda c: share_of(c.dispatch), reverse=True)
        ranked = ranked[:max_dispatches]
    results: list[DispatchResult] = []
    for index, c in enumerate(ranked):
        key = entry_key(c.match.fingerprint(), f"llvm-cpu:{arch}", iree)
        result = DispatchResult(
            c.dispatch, c.match.describe(), key, share_of(c.dispatch), c.default_config
        )
        stored = database.entries.get(key)
        if stored is not None:
            result.trials = list(stored["trials"])
        if stored is not None and not resume and stored.get("best") is not None:
            result.best, result.reused = stored["best"], True
            log(f"  {c.dispatch}: reusing tuning.json ({len(result.trials)} trials)")
        else:
            # each dispatch its own stream of proposals
            _search(c, target, result, trials, batch, seed + index, setup)
        results.append(result)

    kept = [r for r in results if r.best is not None and r.best["relative"] < 1.0]
    if not kept:  # a valid package all the same: the best config found, flagged as no gain
        best = [r for r in results if r.best is not None]
        kept = sorted(best, key=lambda r: r.best["relative"])[:1]
    if not kept:
        raise TuneError("no candidate built and computed the reference's outputs")
    spec_text = _spec_for(kept, {c.dispatch: c for c in ranked}, app.name, device, iree, arch)
    [tuned] = candidates.build([spec_text])
    if tuned is None:
        raise TuneError(f"the tuned build failed: see {work}")
    candidates.layouts = ()
    [untuned] = candidates.build([None])  # the app as it is: no spec, no layouts
    assert untuned is not None
    equal = same_outputs(outputs_of(tuned, function, inputs), want)
    # the untuned build on both sides of the tuned one: its two medians measure the noise
    before, final_tuned, after = candidates.timer(
        [untuned, tuned, untuned], function, inputs, max(rounds, 7)
    )
    from plex.tune._headroom import Headroom

    headroom = Headroom((before, after), final_tuned, equal, required_gain)
    kept_layouts = tuple(rule for t in layout_results if t.kept for rule in t.rules)
    if headroom.applies:
        package = _write_package(out_dir, app.name, device, spec_text, kept_layouts)
    else:
        package = _write_empty_package(out_dir, app.name, device, headroom.reason())
    log(f"plex tune: {headroom.reason()}")
    from plex.tune._report import plot, summary

    result = TuneResult(
        package=package,
        spec=package.parent / f"{device}.mlir",
        dispatches=results,
        untuned_s=headroom.untuned_s,
        tuned_s=final_tuned.median_s,
        untuned_spread=max(before.spread, after.spread),
        tuned_spread=final_tuned.spread,
        outputs_equal=equal,
        layouts=layout_results,
        backend=backend_trial,
        backend_dir=backend,
        headroom=headroom,
    )
    plot(result, out_dir / "tuning.png")
    (out_dir / "summary.md").write_text(summary(result, app.name, device, function, dims))
    log(summary(result, app.name, device, function, dims))
    return result


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a tune run is built with, checked against and timed beside: the
    tile search, the layout trials and the backend candidate share it."""

    candidates: _Candidates
    reference: Path  # the untuned build (with the kept layouts, once the layout trials ran)
    function: str
    inputs: list
    want: list[np.ndarray]  # the reference's outputs on `inputs`
    rounds: int
    database: Database
    target: str  # "llvm-cpu:<arch>": part of every tuning.json key
    iree: str
    log: Callable[[str], None]

    def time(self, artifacts: Sequence[Path]) -> list:
        """The reference and `artifacts`, interleaved: the reference's timing first."""
        return self.candidates.timer(
            [self.reference, *artifacts], self.function, self.inputs, self.rounds
        )

    def computes_the_reference(self, artifact: Path) -> bool:
        from myelin.tuning.timing import outputs_of, same_outputs

        return same_outputs(outputs_of(artifact, self.function, self.inputs), self.want)


def _search(
    c: ConfiguredContraction,
    target: CpuTarget,
    result: DispatchResult,
    trials: int,
    batch: int,
    seed: int,
    setup: TrialSetup,
) -> None:
    """The shared search loop (`next_batch`), each round measured here: its candidates built
    concurrently, timed interleaved with the reference and checked against its outputs."""
    from myelin.tuning.cpu import space
    from myelin.tuning.spec import SpecEntry, render_spec

    def propose(choice: dict) -> Proposal:
        return cpu_proposal(c, choice, target)

    knobs = space()
    start, first_done = time.perf_counter(), completed(result)
    for round_ in itertools.count():
        proposals = next_batch(result, knobs, propose, trials, batch, round_seed(seed, round_))
        if not proposals:
            break
        specs = [render_spec([SpecEntry(_symbol(c.dispatch), c.match, p.info)]) for p in proposals]
        built = setup.candidates.build(specs)
        ok = [(p, a) for p, a in zip(proposals, built, strict=True) if a is not None]
        timings = setup.time([a for _, a in ok])
        base = timings[0].median_s
        measured = {id(p): (t, a) for (p, a), t in zip(ok, timings[1:], strict=True)}
        for p in proposals:
            if id(p) not in measured:
                trial = trial_of(p, "failed")
            else:
                timing, artifact = measured[id(p)]
                if not setup.computes_the_reference(artifact):
                    trial = trial_of(p, "mismatch")
                else:
                    trial = trial_of(
                        p,
                        "ok",
                        relative=timing.median_s / base,
                        median_s=timing.median_s,
                        spread=timing.spread,
                        default_s=base,
                    )
            record(result, trial)
        setup.database.entries[result.key] = entry_of(result, c, setup.target, setup.iree)
        setup.database.save()
        done = completed(result)
        rate = (time.perf_counter() - start) / max(1, done - first_done)
        best = f"{result.best['relative']:.3f}x of default" if result.best else "none yet"
        setup.log(
            f"  {c.dispatch}: trials {done}/{trials}, best {best}, "
            f"ETA {rate * (trials - done):.0f}s"
        )


class _Candidates:
    """Builds candidate specs through SYNaPSe: one node each, run concurrently."""

    def __init__(
        self,
        app_toml: str,
        fingerprints: tuple[str, ...],
        cache: Path,
        work: Path,
        jobs: int | None,
        executor: str = "local",
        log: Callable[[str], None] = print,
        target: str = "llvm-cpu",
    ) -> None:
        from plex.tune._cluster import make_timer

        self.target = target
        self.app_toml, self.fingerprints, self.cache = app_toml, fingerprints, cache
        self.work, self.jobs, self.executor = work, jobs, executor
        self.timer = make_timer(executor, log)
        self.placements: dict = {}  # node id -> where the last batch's candidates built
        # weight layouts every candidate is built with (those the layout search kept)
        self.layouts: tuple[tuple[str, str], ...] = ()

    def build_layouts(self, layouts: Sequence[tuple[tuple[str, str], ...]]) -> list[Path | None]:
        """Candidates with these weight layouts each (on top of the kept ones), no spec."""
        saved = self.layouts
        try:
            return self._build([(None, saved + extra) for extra in layouts])
        finally:
            self.layouts = saved

    def build(self, specs: Sequence[str | None]) -> list[Path | None]:
        return self._build([(spec, self.layouts) for spec in specs])

    def build_kernels(self, databases: Sequence[str]) -> list[Path | None]:
        """Candidates with these kernel-config databases (tuning.json texts), no spec."""
        return self._build([(None, self.layouts) for _ in databases], databases)

    def build_app(self, app_toml: str) -> Path | None:
        """One candidate of another app text (a backend placement), no spec, no layouts."""
        saved = self.app_toml
        try:
            self.app_toml = app_toml
            return self._build([(None, ())])[0]
        finally:
            self.app_toml = saved

    def _build(
        self,
        wanted: Sequence[tuple[str | None, tuple[tuple[str, str], ...]]],
        kernels: Sequence[str | None] = (),
    ) -> list[Path | None]:
        from plex.builder import make_executor
        from plex.builder.versions import fingerprint_salt
        from plex.tune._candidates import CANDIDATE_MLN, FAILED, TIMED_OUT, CandidateJob
        from synapse import Cache, Node, Plan

        nodes = [
            Node(
                f"candidate:{i}",
                CandidateJob(
                    self.app_toml,
                    spec,
                    self.target,
                    self.fingerprints,
                    self.cache,
                    layouts=layouts,
                    kernels=kernels[i] if kernels else None,
                ),
                label=f"candidate {i}",
                heavy=True,
            )
            for i, (spec, layouts) in enumerate(wanted)
        ]
        cache = Cache(self.cache / "tune")
        executor = make_executor(
            self.executor,
            cache,
            jobs=self.jobs or os.cpu_count() or 1,
            salt=fingerprint_salt(),
            on_event=None,
            memory_budget=None,
        )
        results = executor.run(Plan(nodes))
        self.placements = dict(getattr(executor, "placements", {}))
        built: list[Path | None] = []
        for node in nodes:
            result = results[node.id]
            out = result.out_dir
            built.append(None if (out / FAILED).exists() else out / CANDIDATE_MLN)
            if (out / TIMED_OUT).exists():  # transient: build it again next run
                cache.discard(result.key)
        return built


def _data_tiling_hint(tiled: bool, choice: HostChoice | None, device: str) -> str:
    """Why a data-tiled device has nothing to tune, and what pinning it off costs: the untuned
    build of an untiled device is the slower one (docs/tuning.md, measured)."""
    if not tiled:
        return ""
    why = f"this host's choice: {choice.reason}" if choice is not None else "pinned in the app"
    return (
        f": data tiling is on ({why}), and IREE 3.13's packed matmuls (its mmt4d microkernels) "
        "take no tile config from a tuning spec (their workgroup tiles are the device's "
        "`matmul_tiles`, docs/platforms.md). `data_tiling = false` in "
        f"[devices.{device}] makes the device tunable, but its untuned build runs slower than "
        "this one (docs/tuning.md, 'Measured'): time a tuned build against this one before "
        "selecting it"
    )


def _device_app(app_path: Path, device: str) -> str:
    """The app for one device: its packages by absolute path, that device alone, one variant,
    no tuning (the reference) and no build cache of its own (the tuner passes one)."""
    import tomli_w

    data = tomllib.loads(app_path.read_text())
    folder = app_path.resolve().parent
    data["app"]["packages"] = [str((folder / p).resolve()) for p in data["app"].get("packages", [])]
    data["devices"] = {device: data.get("devices", {}).get(device, {})}
    data["variant"] = [{"name": "tune", "devices": [device]}]
    for table in ("myelin", "placement"):
        data.pop(table, None)
    data.get("build", {}).pop("cache", None)
    return tomli_w.dumps(data)


def _cpu_arch(ir_text: str) -> str:
    cpu = re.search(r'cpu = "([^"]*)"', ir_text)
    features = re.search(r'cpu_features = "([^"]*)"', ir_text)
    import hashlib

    digest = hashlib.sha256((features.group(1) if features else "").encode()).hexdigest()[:8]
    return f"{cpu.group(1) if cpu else 'unknown'}+{digest}"


def _symbol(dispatch: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", dispatch)


def _spec_for(
    kept: list[DispatchResult], by_dispatch: dict, app: str, device: str, iree: str, arch: str
) -> str:
    from myelin.tuning.cpu import CpuTiles
    from myelin.tuning.spec import SpecEntry, render_spec

    entries = []
    for r in kept:
        c = by_dispatch[r.dispatch]
        tiles = CpuTiles.from_json(r.best["config"])
        entries.append(
            SpecEntry(
                _symbol(r.dispatch),
                c.match,
                tiles.compilation_info(c.match),
                comment=f"{r.dispatch}: {c.match.describe()}; {tiles.describe()}; "
                f"{r.best['relative']:.3f}x the default's time",
            )
        )
    header = f"Written by plex tune for app {app}, device {device} ({arch}), IREE {iree}."
    return render_spec(entries, header=header)


def package_name(app: str) -> str:
    """The tuning package's name stem for an app (`<stem>_tuning`)."""
    return re.sub(r"[^a-z0-9_]", "_", app.lower()).lstrip("_0123456789") or "app"


def _write_package(
    out_dir: Path,
    app: str,
    device: str,
    spec_text: str,
    layouts: tuple[tuple[str, str], ...] = (),
    target: str = "llvm-cpu",
) -> Path:
    import tomli_w

    name = package_name(app)
    (out_dir / f"{device}.mlir").write_text(spec_text)
    table: dict = {"path": f"{device}.mlir", "target": target}
    if layouts:
        table["layouts"] = dict(layouts)
    package = out_dir / "plex.toml"
    package.write_text(
        "# Written by plex tune. Select it in the app:\n"
        f'# [myelin] tuning = "{name}_tuning:{device}"\n'
        + tomli_w.dumps({"package": {"name": f"{name}_tuning"}, "tuning": {device: table}})
    )
    return package


def _write_empty_package(out_dir: Path, app: str, device: str, reason: str) -> Path:
    """A package that applies nothing: no `[tuning]` table (an app that selects it is told
    there is none) and no spec beside it; why is in its header and in summary.md."""
    import tomli_w

    name = package_name(app)
    (out_dir / f"{device}.mlir").unlink(missing_ok=True)  # a spec an earlier run applied
    package = out_dir / "plex.toml"
    package.write_text(
        f"# Written by plex tune for device {device}: it {reason}.\n"
        "# No [tuning] table: there is nothing to select (summary.md).\n"
        + tomli_w.dumps({"package": {"name": f"{name}_tuning"}})
    )
    return package


def _try_backend(package_dir: Path, device: str, app_toml: str, setup: TrialSetup):
    """The app's matmuls (and what else the backend implements) on an external backend
    (plex.tune._backend): one candidate, checked and timed against the reference; recorded in
    tuning.json, never written into the package."""
    from plex.tune._backend import (
        BackendTrial,
        backend_app,
        backend_ops,
        backend_ref,
        check_and_time,
    )
    from plex.tune._database import entry_key

    try:
        ref, ops = backend_ref(package_dir), backend_ops(package_dir)
    except ValueError as e:
        raise TuneError(str(e)) from None
    trial = BackendTrial(ref, ops)
    setup.log(f"  backend {ref}: every {', '.join(ops)} on it, one candidate")
    artifact = setup.candidates.build_app(backend_app(app_toml, device, package_dir))
    if artifact is None:
        trial.status = "failed"
    else:
        equal, trial.relative, trial.spread = check_and_time(
            setup.reference, artifact, setup.function, list(setup.inputs), setup.want, setup.rounds
        )
        trial.status = "ok" if equal else "mismatch"
    setup.database.entries[entry_key(f"backend:{ref}", setup.target, setup.iree)] = {
        "target": setup.target,
        "iree": setup.iree,
        **trial.to_json(),
    }
    setup.database.save()
    rel = f"{trial.relative:.3f}x the reference's time" if trial.relative else trial.status
    setup.log(f"  backend {ref}: {rel}")
    return trial


def _dim_sizes(dims: Sequence[str]) -> list[int]:
    """The sizes `--dim NAME=SIZE` gives (what a dynamic M is at the tuned inputs)."""
    sizes = []
    for d in dims:
        value = d.rpartition("=")[2]
        if value.isdigit():
            sizes.append(int(value))
    return sizes


def _search_layouts(trials: list, setup: TrialSetup) -> list:
    """Build, check and time each layout trial against the reference (one batch); keep those
    faster than it, and set them on `candidates` for every later build. tuning.json keeps each
    result under the dispatch's parameters, target and IREE version; a later run reuses it."""
    from plex.tune import _layouts
    from plex.tune._database import entry_key

    if not trials:
        return []
    database = setup.database
    keys = {
        id(t): entry_key(f"layout:{','.join(t.keys)}:{t.layout}", setup.target, setup.iree)
        for t in trials
    }
    todo = []
    for t in trials:
        stored = database.entries.get(keys[id(t)])
        if stored is not None:
            t.status, t.relative, t.spread = stored["status"], stored["relative"], stored["spread"]
            setup.log(f"  layout {t.layout} for {', '.join(t.keys)}: reusing tuning.json")
        else:
            todo.append(t)
    built = setup.candidates.build_layouts([t.rules for t in todo])
    ok = [(t, a) for t, a in zip(todo, built, strict=True) if a is not None]
    for t, a in zip(todo, built, strict=True):
        if a is None:
            t.status = "failed"
    if ok:
        timings = setup.time([a for _, a in ok])
        base = timings[0].median_s
        for (t, artifact), timing in zip(ok, timings[1:], strict=True):
            if not setup.computes_the_reference(artifact):
                t.status = "mismatch"
                continue
            t.status, t.relative, t.spread = "ok", timing.median_s / base, timing.spread
    for t in todo:
        database.entries[keys[id(t)]] = {
            "kind": "weight-layout",
            "target": setup.target,
            "iree": setup.iree,
            **t.to_json(),
        }
    database.save()
    for t in trials:
        t.kept = t.status == "ok" and t.relative is not None and t.relative < _layouts.KEEP_BELOW
        rel = f"{t.relative:.3f}x the default layout's time" if t.relative else t.status
        setup.log(f"  layout {t.layout} for {', '.join(t.keys)} ({t.dispatch}): {rel}")
    setup.candidates.layouts = tuple(rule for t in trials if t.kept for rule in t.rules)
    return trials
