"""Kernel-library configs as `plex tune` candidates (a CUDA device with `kernels = "triton"`),
through the split flow: compiled here, timed on the GPU machine, collected here.

1. `plex tune APP --device NAME -o DIR --bundle BUNDLE`: the app's reference build reports every
   matmul its kernels took (the `.mln`'s kernel sites); each distinct shape (op, M, N, K,
   dtypes) becomes one function of a generated app of plain matmuls, so that each shape is
   timed alone, as IREE's dispatch benchmarks time one dispatch. Per shape, `--trials` configs
   of its space (`myelin.kernels._space`: every constraint checked before compiling) are drawn;
   candidate i is that app built with the i-th config of every shape (one build serves all
   shapes). The inputs are made on the GPU machine from their shapes (a GEMV weight is 470 MB).
2. `python -m myelin.tuning.time_bundle BUNDLE -o RESULTS` there: per shape, the candidates
   against the library's own config, inputs resident on the GPU, outputs checked.
3. `plex tune ... --collect RESULTS` here: per shape the fastest config that computed the
   reference's outputs, recorded in DIR/tuning.json (kind `kernel-config`: op, shapes, dtypes,
   layout, arch, IREE and Triton versions) and selected by DIR/plex.toml's
   `[tuning.<device>] kernels = "tuning.json"`; the app's kernels node then builds with it.

One round: the space is sampled, not searched (nevergrad has nothing to learn from one round).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from myelin.kernels import (
    config_from_json,
    config_to_json,
    kernel_entry,
    matmul_space,
    site_key,
    spread_sample,
)
from plex.tune._local import package_name
from plex.tune._search import TuneError

BUNDLE_KIND = "kernel-configs"
REFERENCE = "reference.mln"
# M used to time a shape whose M is dynamic in the app (prefill-sized), unless --dim says one.
DYNAMIC_M = 2048
ARCH = "sm_90a"
# Outputs of a config against the library's: the same f32 sums in another K order, rounded to
# the output type (one f16 ulp is 9.8e-4 relative, one bf16 ulp 7.8e-3).
RTOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 1e-4}
# A config replaces the library's only when at least this much faster: below it, one timing
# session's difference is noise (same binary, kernel times over 5 calls).
MIN_GAIN = 0.02


@dataclass(frozen=True)
class Shape:
    """One matmul shape the app's kernels take (`m` None: dynamic in the app)."""

    op: str  # "matmul" | "matmul_transpose_b"
    dtype: str
    out_dtype: str
    m: int | None
    n: int
    k: int

    @property
    def key(self) -> str:
        return site_key(self.op, self.dtype, self.out_dtype, self.m, self.n, self.k)

    @property
    def b_transposed(self) -> bool:
        return self.op == "matmul_transpose_b"

    def timed_m(self, dynamic_m: int) -> int:
        return dynamic_m if self.m is None else self.m


def shapes_of(sites: Sequence[dict]) -> list[Shape]:
    """The distinct shapes of the sites a kernel took, in first-seen order."""
    found: dict[str, Shape] = {}
    for s in sites:
        if s.get("kernel") is None or not str(s["kernel"]).startswith("plex_matmul"):
            continue
        # a convolution's site names the matmul it runs as (myelin.kernels._conv)
        shape = Shape(s.get("as", s["op"]), s["dtype"], s["out_dtype"], s["m"], s["n"], s["k"])
        found.setdefault(shape.key, shape)
    return list(found.values())


_MLIR_TYPES = {"f16": "f16", "bf16": "bf16", "f32": "f32"}


def shape_function(name: str, shape: Shape, m: int) -> str:
    """One function doing this shape's matmul as the app's IR has it (f32 accumulation, then a
    truncf to a narrower output): what the kernel library matches."""
    t = _MLIR_TYPES[shape.dtype]
    a = f"tensor<{m}x{shape.k}x{t}>"
    b = (
        f"tensor<{shape.n}x{shape.k}x{t}>"
        if shape.b_transposed
        else f"tensor<{shape.k}x{shape.n}x{t}>"
    )
    acc = f"tensor<{m}x{shape.n}xf32>"
    maps = (
        " indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, "
        "affine_map<(m, n, k) -> (m, n)>]"
        if shape.b_transposed
        else ""
    )
    body = f"""func.func @{name}(%a: {a}, %b: {b}) -> RESULT {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {acc}
  %f = linalg.fill ins(%z : f32) outs(%e : {acc}) -> {acc}
  %r = linalg.matmul{maps} ins(%a, %b : {a}, {b}) outs(%f : {acc}) -> {acc}
"""
    if shape.out_dtype == "f32":
        return body.replace("RESULT", acc) + f"  return %r : {acc}\n}}\n"
    out = f"tensor<{m}x{shape.n}x{_MLIR_TYPES[shape.out_dtype]}>"
    identity = "affine_map<(i, j) -> (i, j)>"
    return body.replace("RESULT", out) + (
        f"  %e2 = tensor.empty() : {out}\n"
        f"  %t = linalg.generic {{indexing_maps = [{identity}, {identity}], "
        f'iterator_types = ["parallel", "parallel"]}} ins(%r : {acc}) outs(%e2 : {out}) {{\n'
        f"  ^bb0(%x: f32, %y: {_MLIR_TYPES[shape.out_dtype]}):\n"
        f"    %q = arith.truncf %x : f32 to {_MLIR_TYPES[shape.out_dtype]}\n"
        f"    linalg.yield %q : {_MLIR_TYPES[shape.out_dtype]}\n"
        f"  }} -> {out}\n  return %t : {out}\n}}\n"
    )


def shapes_app(folder: Path, device_table: dict, shapes: Sequence[Shape], dynamic_m: int) -> str:
    """The generated app (one function per shape, `s0`, `s1`, ...) for the tuned device: its
    package is written into `folder`; the app's text is returned."""
    import tomli_w

    package = folder / "shapes"
    package.mkdir(parents=True, exist_ok=True)
    names = [f"s{i}" for i in range(len(shapes))]
    (package / "shapes.mlir").write_text(
        "// Written by plex tune: one function per matmul shape the app's kernels take.\n"
        + "\n".join(
            shape_function(n, s, s.timed_m(dynamic_m)) for n, s in zip(names, shapes, strict=True)
        )
    )
    (package / "plex.toml").write_text(
        tomli_w.dumps(
            {
                "package": {"name": "plex_tune_shapes"},
                "graph": {"shapes": {"source": "shapes.mlir", "entrypoints": names}},
            }
        )
    )
    return tomli_w.dumps(
        {
            "app": {"name": "plex-tune-shapes", "packages": [str(package.resolve())]},
            "devices": {"tune": device_table},
            "variant": [{"name": "tune", "devices": ["tune"]}],
        }
    )


def _database_text(entries: dict[str, dict]) -> str:
    from plex.tune._database import SCHEMA

    return json.dumps({"schema": SCHEMA, "entries": entries}, indent=1, sort_keys=True)


def _versions() -> tuple[str, str]:
    from importlib import metadata

    from plex.builder.versions import versions

    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = "not installed"
    return versions()["iree-base-compiler"], triton


def _entry_key(shape: Shape, iree: str, triton: str) -> str:
    from plex.tune._database import entry_key

    return entry_key(f"triton-matmul|{shape.key}", f"cuda:{ARCH}", f"{iree}|triton {triton}")


def make_kernel_bundle(
    app_path: Path,
    device: str,
    out_dir: Path,
    bundle_dir: Path,
    *,
    trials: int = 8,
    dynamic_m: int = DYNAMIC_M,
    rounds: int = 5,
    jobs: int | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    """Step 1: the shapes' reference build and `trials` candidate builds into `bundle_dir`."""
    import tomllib

    from myelin.kernels import choose_matmul_config
    from myelin.mln import MlnReader
    from plex.builder import default_cache_dir
    from plex.manifest import load_app
    from plex.tune._local import _Candidates, _device_app

    app = load_app(app_path)
    spec = next((d for d in app.devices if d.name == device), None)
    if spec is None or spec.target != "cuda" or not spec.kernels:
        raise TuneError(
            f"device {device!r}: kernel configs are tuned for a cuda device with kernels"
        )
    out_dir = out_dir.resolve()
    work = out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)
    cache = (cache_dir or default_cache_dir(app)).resolve()
    fingerprints = tuple(p.fingerprint for p in app.packages)
    derived = _device_app(app_path, device)
    [app_build] = _Candidates(
        derived, fingerprints, cache, work, jobs, log=log, target="cuda"
    ).build([None])
    if app_build is None:
        raise TuneError(f"the untuned build of {app_path} failed (candidate build logs: {cache})")
    with MlnReader(app_build) as reader:
        sites = [s for d in reader.artifact_manifest.variants[0].devices for s in d.kernels]
    shapes = shapes_of(sites)
    if not shapes:
        raise TuneError(f"{app.name}: no matmul went to a kernel on device {device!r}")
    device_table = tomllib.loads(derived)["devices"][device]
    shutil.rmtree(work / "shapes", ignore_errors=True)
    shapes_toml = shapes_app(work, device_table, shapes, dynamic_m)
    iree, triton = _versions()
    per_shape = []
    for i, s in enumerate(shapes):
        m = s.timed_m(dynamic_m)
        default = choose_matmul_config(s.dtype, s.out_dtype, s.b_transposed, m, s.n, s.k)
        space = matmul_space(s.dtype, s.out_dtype, s.b_transposed, m, s.n, s.k)
        space = [c for c in space if c != default]
        per_shape.append(spread_sample(space, trials, seed + i))
        log(
            f"  {s.key}: {len(space)} valid configs besides the library's, "
            f"{len(per_shape[-1])} drawn"
        )
    databases = []
    for i in range(max(len(p) for p in per_shape)):
        entries = {}
        for s, drawn in zip(shapes, per_shape, strict=True):
            if i < len(drawn):
                timed = Shape(s.op, s.dtype, s.out_dtype, s.timed_m(dynamic_m), s.n, s.k)
                entry = kernel_entry(
                    s.op, s.dtype, s.out_dtype, timed.m, s.n, s.k, drawn[i],
                    arch=ARCH, triton=triton, iree=iree,
                )  # fmt: skip
                entries[_entry_key(timed, iree, triton)] = entry
        databases.append(_database_text(entries))
    candidates = _Candidates(shapes_toml, fingerprints, cache, work, jobs, log=log, target="cuda")
    [reference] = candidates.build([None])
    if reference is None:
        raise TuneError(f"the generated shapes app did not build (logs: {cache / 'tune'})")
    built = candidates.build_kernels(databases)
    shutil.rmtree(bundle_dir, ignore_errors=True)
    bundle_dir.mkdir(parents=True)
    shutil.copyfile(reference, bundle_dir / REFERENCE)
    cases = []
    for index, (s, drawn) in enumerate(zip(shapes, per_shape, strict=True)):
        m = s.timed_m(dynamic_m)
        b_shape = [s.n, s.k] if s.b_transposed else [s.k, s.n]
        dtype = "float16" if s.dtype == "f16" else "bfloat16"
        case = {
            "dispatch": s.key,
            "shape": {
                "op": s.op,
                "dtype": s.dtype,
                "out_dtype": s.out_dtype,
                "m": s.m,
                "n": s.n,
                "k": s.k,
            },
            "function": f"s{index}",
            "inputs": [{"shape": [m, s.k], "dtype": dtype}, {"shape": b_shape, "dtype": dtype}],
            "rtol": RTOL[s.out_dtype],
            "default": config_to_json(
                choose_matmul_config(s.dtype, s.out_dtype, s.b_transposed, m, s.n, s.k)
            ),
            "candidates": [],
        }
        for i, config in enumerate(drawn):
            if built[i] is None:
                case.setdefault("failed", []).append(config.name)
                continue
            name = f"c{i:03d}"
            if not (bundle_dir / f"{name}.mln").exists():
                shutil.copyfile(built[i], bundle_dir / f"{name}.mln")
            case["candidates"].append(
                {
                    "name": f"s{index}_{name}",
                    "file": f"{name}.mln",
                    "choice": config_to_json(config),
                    "config": config.name,
                }
            )
        cases.append(case)
    state = {
        "kind": BUNDLE_KIND,
        "schema": 1,
        "app": app.name,
        "device": device,
        "target": "cuda",
        "arch": ARCH,
        "iree": iree,
        "triton": triton,
        "function": cases[0]["function"],
        "seed": seed,
        "rounds": rounds,
        "resident": True,
        "reference": REFERENCE,
        "bundle": str(bundle_dir.resolve()),
        "cases": cases,
    }
    (bundle_dir / "bundle.json").write_text(json.dumps(state, indent=1))
    count = sum(len(c["candidates"]) for c in cases)
    log(f"plex tune: {count} kernel-config trials of {len(shapes)} shapes in {bundle_dir}")
    return bundle_dir


def read_results(results_path: Path) -> dict:
    """time_bundle's results.json (its -o folder or the file itself)."""
    from myelin.tuning.time_bundle import RESULTS_JSON

    path = results_path / RESULTS_JSON if results_path.is_dir() else results_path
    if not path.is_file():
        raise TuneError(f"{results_path}: no {RESULTS_JSON}; pass what time_bundle's -o wrote")
    return json.loads(path.read_text())


def ranking(reference: dict | None, ok: list[dict]) -> str:
    """What the trials are ranked by: kernel time relative to the library's config when the
    timing half measured it (a CUPTI-capable one, e.g. benchmarks/probes/gpu/tunekern_h200.py), else
    the wall time of the call. On the H200 a decode projection's kernel takes 0.01-0.03 ms of a
    0.4 ms call whose spread is 30-100%: wall time cannot rank those kernels."""
    if reference and reference.get("kernel_s") and any(t.get("kernel_relative") for t in ok):
        return "kernel_relative"
    return "relative"


def collect_kernel_results(
    results: dict, device: str, out_dir: Path, log: Callable[[str], None] = print
) -> Path:
    """Step 3: per shape the fastest config that computed right into tuning.json (the library's
    own config when none beat it), and the package that selects them."""
    import tomli_w

    from plex.tune._database import Database

    state = results["bundle"]
    if state.get("device") != device:
        raise TuneError(f"results of device {state.get('device')!r}, not {device!r}")
    out_dir = out_dir.resolve()
    database = Database.open(out_dir)
    for case in state["cases"]:
        shape = Shape(**case["shape"])
        base = results["references"].get(case["dispatch"])
        trials = []
        for cand in case["candidates"]:
            row = results["candidates"].get(cand["name"], {"status": "not timed"})
            trials.append({"config": cand["choice"], "name": cand["config"], **row})
        ok = [t for t in trials if t.get("status") == "ok"]
        by = ranking(base, ok)
        ranked = [t for t in ok if t.get(by) is not None]
        best = min(ranked, key=lambda t: t[by], default=None)
        kept = best is not None and best[by] < 1.0 - MIN_GAIN
        chosen = best["config"] if kept else case["default"]
        config = config_from_json(chosen, shape.dtype, shape.out_dtype, shape.b_transposed)
        measured = {
            "trials": trials,
            "default": case["default"],
            "default_s": None if base is None else base["median_s"],
            "default_kernel_s": None if base is None else base.get("kernel_s"),
            "ranked_by": by,
            "relative": best[by] if kept else 1.0,
            "kept": kept,
        }
        key = _entry_key(shape, state["iree"], state["triton"])
        database.entries[key] = kernel_entry(
            shape.op, shape.dtype, shape.out_dtype, shape.m, shape.n, shape.k, config,
            arch=state["arch"], triton=state["triton"], iree=state["iree"], **measured,
        )  # fmt: skip
        what = (
            f"{config.name}, {measured['relative']:.3f}x the library's "
            + ("kernel time" if by == "kernel_relative" else "time")
            if kept
            else "the library's own"
        )
        log(f"  {shape.key}: {len(ok)}/{len(trials)} ran right; kept {what}")
    database.save()
    name = package_name(state["app"])
    package = out_dir / "plex.toml"
    package.write_text(
        "# Written by plex tune (kernel configs). Select it in the app:\n"
        f'# [myelin] tuning = "{name}_tuning:{device}"\n'
        + tomli_w.dumps(
            {
                "package": {"name": f"{name}_tuning"},
                "tuning": {device: {"target": "cuda", "kernels": "tuning.json"}},
            }
        )
    )
    log(f"plex tune: wrote {package}")
    return package
