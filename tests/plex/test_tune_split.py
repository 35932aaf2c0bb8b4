"""The split tuner (`plex tune --bundle` here, `python -m myelin.tuning.time_bundle` on the
device's machine, `plex tune --collect` here), exercised for real on this CPU with an llvm-cpu
device; the timing half runs in a process where the compiler and plex cannot be imported. For
CUDA, compile only: the bundle of an sm_80 device is produced and its specs matched."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import numpy as np
import pytest

import myelin
from myelin.mln import MlnReader
from plex.builder import build
from plex.tune import _split
from plex.tune._database import entry_key
from tests.plex.build_helpers import copy_example

pytest.importorskip("nevergrad")

X = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)
# The timing half as it runs on a machine with only iree-base-runtime + numpy + src/.
RUNTIME_ONLY = """
import runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("plex", "synapse") or name.startswith(
            ("iree.compiler", "myelin.compiler")
        ):
            raise ImportError(f"not on the device's machine: {name}")
sys.meta_path.insert(0, Refuse())
sys.argv = ["time_bundle", *sys.argv[1:]]
runpy.run_module("myelin.tuning.time_bundle", run_name="__main__")
"""


def forward(path):
    with myelin.Instance().load(path) as model, model.session() as session:
        return session.call("forward", X)


def time_there(bundle, results):
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(bundle), "-o", str(results), "--rounds", "2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((results / "results.json").read_text())


def test_the_timing_half_imports_nothing_of_the_compiler_or_of_plex():
    code = (
        "import sys, myelin.tuning.time_bundle\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('plex', 'synapse') "
        "or m.startswith(('iree.compiler', 'myelin.compiler'))]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_bundle_time_collect_on_cpu_writes_a_package_that_builds_the_same(tmp_path):
    app = copy_example("mlp", tmp_path / "mlp")
    out, cache, bundle = tmp_path / "tuned", tmp_path / "cache", tmp_path / "bundle"
    _split.make_bundle(
        app,
        "cpu",
        out,
        bundle,
        trials=3,
        batch=2,
        max_dispatches=1,
        rounds=2,
        dims=["*=32"],
        cache_dir=cache,
        log=lambda line: None,
    )
    state = json.loads((bundle / "bundle.json").read_text())
    assert state["target"] == "llvm-cpu" and state["inputs"][0]["dtype"] == "float32"
    [case] = state["cases"]
    assert 1 <= len(case["candidates"]) <= 2

    results = time_there(bundle, tmp_path / "results")
    assert set(results["candidates"]) == {c["name"] for c in case["candidates"]}
    # 3 trials at 2 a round: collecting round 0 writes round 1's bundle in BUNDLE's place
    again = _split.collect(app, "cpu", out, tmp_path / "results", cache_dir=cache, log=print)
    assert again == bundle.resolve()
    assert json.loads((bundle / "bundle.json").read_text())["round"] == 1
    time_there(bundle, tmp_path / "results")
    assert _split.collect(app, "cpu", out, tmp_path / "results", cache_dir=cache) is None

    # tuning.json is keyed as the local flow keys it; every trial of both rounds is in it
    database = json.loads((out / "tuning.json").read_text())
    [(key, entry)] = database["entries"].items()
    assert entry["target"].startswith("llvm-cpu:") and entry["iree"] == "3.13.0"
    from myelin.tuning.spec import ContractionMatch

    fingerprint = ContractionMatch.from_json(entry["op"]).fingerprint()
    assert key == entry_key(fingerprint, entry["target"], entry["iree"])
    assert sum(t["status"] != "rejected" for t in entry["trials"]) == 3

    package = tomllib.loads((out / "plex.toml").read_text())
    name = package["package"]["name"]
    assert package["tuning"]["cpu"] == {"path": "cpu.mlir", "target": "llvm-cpu"}
    text = app.read_text().replace('packages = ["."]', f'packages = [".", "{out}"]')
    app.write_text(text + f'\n[myelin]\ntuning = "{name}:cpu"\n')
    build(app, tmp_path / "tuned.mln", cache_dir=cache)
    with MlnReader(tmp_path / "tuned.mln") as reader:
        assert reader.artifact_manifest.tuning["applied"][0]["matched_ops"] == 1
    build(copy_example("mlp", tmp_path / "plain"), tmp_path / "plain.mln", cache_dir=cache)
    np.testing.assert_allclose(
        forward(tmp_path / "tuned.mln"), forward(tmp_path / "plain.mln"), rtol=1e-5, atol=1e-6
    )


def test_the_bundle_of_a_cuda_device_compiles_here_with_its_specs_applied(tmp_path):
    """Through the CLI: `plex tune --bundle` for an sm_80 device builds its candidates here
    (no GPU needed), each with its spec matched, and prints the exact next two commands."""
    app = copy_example("mlp", tmp_path / "mlp")
    app.write_text(app.read_text() + '\n[devices.gpu]\ntarget = "cuda"\narch = "sm_80"\n')
    bundle, out = tmp_path / "bundle", tmp_path / "tuned"
    command = [sys.executable, "-m", "plex", "tune", str(app), "--device", "gpu", "-o", str(out)]
    command += ["--bundle", str(bundle), "--trials", "1", "--batch", "1", "--dispatches", "1"]
    done = subprocess.run([*command, "--dim", "*=32"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads((bundle / "bundle.json").read_text())
    assert state["target"] == "cuda" and state["target_key"] == "cuda:sm_80"
    [case] = state["cases"]
    [candidate] = case["candidates"]
    assert "TileAndFuse" in candidate["info"]
    with MlnReader(bundle / candidate["file"]) as reader:
        [applied] = reader.artifact_manifest.tuning["applied"]
    assert applied["matched_ops"] == 1
    for line in _split.next_commands(app, "gpu", out, bundle):
        assert f"  {line}\n" in done.stdout


def test_a_process_that_set_a_cuda_spec_library_refuses_a_compile_without_it():
    """IREE 3.13 takes the CUDA spec flag only process-wide: once set, it would tune every later
    compile of the process, so another spec (or none) is refused, and the hold is released."""
    code = """
from myelin.errors import CompileError
from myelin.tuning.gate import LIBRARY_FLAG, process_wide_spec
with process_wide_spec([f"{LIBRARY_FLAG}=/x/spec.mlir", "--a"]) as (flags, applies_a_spec):
    assert flags == ["--a", "--iree-codegen-tuning-spec-path="], flags
    assert applies_a_spec  # so the compile runs single-threaded (myelin.tuning.gate)
try:
    with process_wide_spec(["--a"]):
        raise SystemExit("not refused")
except CompileError as e:
    assert "another process" in str(e), e
with process_wide_spec([f"{LIBRARY_FLAG}=/x/spec.mlir"]):
    pass
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_compile_that_applies_a_spec_is_told_to_run_single_threaded():
    """IREE 3.13 can deadlock parsing a spec with its thread pool on (myelin.tuning.gate): the
    gate says which compiles apply one, and compile_module opens those sessions unthreaded."""
    from myelin.tuning.gate import SPEC_PATH_FLAG, process_wide_spec

    with process_wide_spec([f"{SPEC_PATH_FLAG}=/x/spec.mlir", "--a"]) as (flags, applies):
        assert applies and flags == ["--a", f"{SPEC_PATH_FLAG}=/x/spec.mlir"]
    with process_wide_spec(["--a"]) as (flags, applies):
        assert not applies and flags == ["--a", f"{SPEC_PATH_FLAG}="]
