"""The cache never serves a stale build: every input of every step is in its node's key.

Two halves. A property test perturbs each field of every job type in turn (the fields are
introspected, so a field added later is covered) and checks that the key changes. End-to-end
builds then change one thing a user changes (the model's symbol, a module it imports, the
entrypoints, dynamic dims, a codec glob, a tensor's values, a target option, the scheduling
favor, the tool versions) and check that exactly the nodes that read it rebuild, with the
reason `--explain` prints, and that the artifact computes the new result.
"""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.codecs import CodecPolicy, CodecRule
from myelin.compiler.phases import PhaseFile
from myelin.compiler.targets import TargetDevice
from plex.builder import build, jobs, versions
from plex.builder.jobs import (
    BackendJob,
    CompileJob,
    ComposeJob,
    DeviceLink,
    EncodeJob,
    ImportedGraph,
    ImportJob,
    KernelsJob,
    LinkJob,
    ModuleLink,
    PhasesJob,
    VariantLink,
    WeightsJob,
    WeightsSource,
)
from synapse import InputFile, InputTree, Job, Output, explain, job_inputs, keyed_fields
from tests.plex.build_helpers import copy_example

# --- every field of every job is in the key -------------------------------------------------


def _sample_jobs(tmp: Path) -> list[Job]:
    """One job of every type, with every optional field set (so that each can be perturbed)."""
    source = tmp / "model.py"
    source.write_text("def build(): ...\n")
    weights = tmp / "w.safetensors"
    weights.write_bytes(b"weights")
    spec = tmp / "spec.mlir"
    spec.write_text("module {}\n")
    cpu = TargetDevice("cpu", cpu="host", cpu_features="+avx2", data_tiling=True)
    gpu = TargetDevice("gpu", target="cuda", arch="sm_80")
    policy = CodecPolicy("int8", "weights p:w", (CodecRule("*.weight", "q4"),))
    resume = PhaseFile(None, {"phase": "flow", "module": "m"}, "module {}")
    return [
        WeightsJob(InputFile(weights), "safetensors", "p:w"),
        BackendJob(
            name="blas",
            sources=(InputFile(source),),
            library=InputFile(weights),
            abi=(InputFile(spec),),
            include_dirs=(InputTree(tmp, ".py"),),
            libraries=(InputFile(weights),),
            library_names=("libblas.so",),
            static_libraries=(InputFile(source),),
            cflags=("-O2",),
            compiler="gcc 13",
            ops=("matmul",),
            what="backend p:blas",
        ),
        ImportJob(
            source=InputFile(source),
            frontend="torch",
            symbol="build",
            module_name="m",
            scope="p.m",
            entrypoints=("forward",),
            dynamic={"x": {0: "batch"}},
            min_parameter_bytes=256,
            python_sources=InputTree(tmp, ".py"),
            what="p:m",
        ),
        EncodeJob(
            Output("import:p:m"),
            Output("weights:p:w"),
            "w",
            policy,
            5,
            "p:m",
            layouts=(("*.weight", "nk"),),
        ),
        KernelsJob(
            Output("encode:p:m"),
            "triton",
            "sm_90a",
            "triton 3.9.0",
            "p:m",
            tuned=InputFile(spec),
            tuned_ref="p:gpu",
        ),
        CompileJob(
            source=Output("encode:p:m"),
            devices=(cpu, gpu),
            requirements=({"cpu_flags": ["avx2"]}, {}),
            cancellable=True,
            favor="max-concurrency",
            entrypoints=("forward",),
            arg_names={"forward": ["x"]},
            module_name="m_a",
            export_only=("forward",),
            placement=(("forward", "gpu"),),
            dump_phases=True,
            stop_at="stream",
            resume=resume,
            phase_fields={"module": "m"},
            what="p:m (default)",
            backend_ops=(("blas", "blas", "matmul", 0),),
            tuning_spec=InputFile(spec),
            tuning_ref="p:cpu",
            tuning_target="llvm-cpu",
        ),
        LinkJob(
            app={"name": "a", "version": "1"},
            policies={"residency": "resident"},
            graphs=(
                ImportedGraph(
                    "p:m",
                    "m",
                    Output("import:p:m"),
                    Output("encode:p:m"),
                    WeightsSource(Output("weights:p:w"), "p:w", "w", "w", "w.safetensors"),
                    InputFile(source),
                ),
            ),
            modules=(
                ModuleLink("m", "p:m", "p:m", Output("import:p:m"), (Output("c"),), {"x": {}}),
            ),
            variants=(
                VariantLink(
                    "default",
                    (
                        DeviceLink(
                            "cpu",
                            "llvm-cpu",
                            "local-task",
                            {"cpu": "host"},
                            {"m": 1},
                            backend=Output("backend:p:blas"),
                        ),
                    ),
                    ("--flag",),
                    {"stream.partitioning": "x"},
                ),
            ),
            packages={"p": {"version": "1", "fingerprint": "f"}},
            favor="min-memory",
            versions={"plex": "0.1.0"},
            compile_records=(Output("c"),),
        ),
        ComposeJob(Output("link"), (Output("c"),), strict=True, output=tmp / "a.mln"),
        PhasesJob((("m", "default", Output("c")),), single_file=True, target=tmp / "ir"),
    ]


def _perturbations(value: object, tmp: Path) -> list[object]:
    """Values that differ from `value` in one place each: every nested field, element and key."""
    if isinstance(value, bool):
        return [not value]
    if value is None:
        return ["set"]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, str):
        return [value + "x"]
    if isinstance(value, InputFile):
        other = tmp / f"other-{len(list(tmp.iterdir()))}"
        other.write_bytes(value.path.read_bytes() + b"!")
        return [InputFile(other)]
    if isinstance(value, InputTree):
        root = tmp / f"tree-{len(list(tmp.iterdir()))}"
        shutil.copytree(value.root, root, ignore=shutil.ignore_patterns("tree-*", "other-*"))
        (root / "helper.py").write_text("# an edited helper\n")
        return [InputTree(root, value.suffix)]
    if isinstance(value, Output):
        return [Output(value.node_id + "x")]
    if isinstance(value, tuple):
        changed = [
            (*value[:i], p, *value[i + 1 :])
            for i, v in enumerate(value)
            for p in _perturbations(v, tmp)
        ]
        longer = (*value, value[0] if value else "extra")[: len(value) + 1]
        return [*changed, longer, *([value[:-1]] if value else [])]  # () has no shorter form
    if isinstance(value, list):
        return [list(p) for p in _perturbations(tuple(value), tmp)]
    if isinstance(value, dict):
        changed = [{**value, k: p} for k, v in value.items() for p in _perturbations(v, tmp)]
        return [*changed, {**value, "extra-key": 1}]
    if dataclasses.is_dataclass(value):
        return [
            dataclasses.replace(value, **{f.name: p})
            for f in keyed_fields(type(value))
            for p in _perturbations(getattr(value, f.name), tmp)
        ]
    raise AssertionError(f"no perturbation for a {type(value).__name__}; extend the test")


def test_every_job_type_has_a_sample(tmp_path):
    job_types = {
        cls
        for cls in vars(jobs).values()
        if isinstance(cls, type) and issubclass(cls, Job) and cls is not Job
    }
    assert {type(j) for j in _sample_jobs(tmp_path)} == job_types


def test_every_field_of_every_job_changes_its_key(tmp_path):
    checked = 0
    for job in _sample_jobs(tmp_path):
        base = job_inputs(job)
        for f in keyed_fields(type(job)):
            for value in _perturbations(getattr(job, f.name), tmp_path):
                changed = job_inputs(dataclasses.replace(job, **{f.name: value}))
                assert changed[f.name] != base[f.name], f"{type(job).__name__}.{f.name}: {value!r}"
                checked += 1
    assert checked > 100  # nested fields (devices, policy, phase file, link records) included


def test_fields_outside_the_key_are_only_destinations(tmp_path):
    for job in _sample_jobs(tmp_path):
        outside = {f.name for f in dataclasses.fields(job)} - {
            f.name for f in keyed_fields(type(job))
        }
        assert outside <= {"output", "target"}, type(job).__name__
        for name in outside:  # where an uncached node writes: it changes no node's output
            moved = dataclasses.replace(job, **{name: tmp_path / "elsewhere"})
            assert job_inputs(moved) == job_inputs(job)


# --- end to end: a user's change rebuilds what reads it, and the result follows -------------

MODEL_PY = """
import torch
from layers import Scale


class Affine(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(8, 4)
        self.scale = Scale()

    def forward(self, x):
        return self.scale(self.fc(x))


def a():
    return Affine(0).eval(), (torch.randn(3, 8),)


def b():
    return Affine(1).eval(), (torch.randn(3, 8),)
"""

LAYERS_PY = """
import torch


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
"""

APP_TOML = '[app]\nname = "truth"\npackages = ["pkg"]\n'


def _torch_package(root: Path, graph: str) -> Path:
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "model.py").write_text(MODEL_PY)
    (pkg / "layers.py").write_text(LAYERS_PY)
    (pkg / "plex.toml").write_text(
        textwrap.dedent(
            f"""\
            [package]
            name = "pkg"

            [graph.affine]
            frontend = "torch"
            {graph}
            """
        )
    )
    (root / "app.toml").write_text(APP_TOML)
    return root / "app.toml"


def _set_graph(app_toml: Path, graph: str) -> None:
    toml = app_toml.parent / "pkg" / "plex.toml"
    head = toml.read_text().split("[graph.affine]")[0]
    toml.write_text(f'{head}[graph.affine]\nfrontend = "torch"\n{graph}\n')


def _torch_reference(seed: int, x: np.ndarray, factor: float = 2.0) -> np.ndarray:
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    fc = torch.nn.Linear(8, 4)
    with torch.no_grad():
        return (fc(torch.from_numpy(x)) * factor).numpy()


def _rebuilt(result) -> dict[str, str]:
    """Node id -> reason, for the nodes that ran (compose always runs)."""
    return {i: r.reason for i, r in result.results.items() if r.status == "built"}


def _run(path: Path, x: np.ndarray, entrypoint: str = "forward") -> np.ndarray:
    with myelin.Instance().load(path) as model, model.session() as s:
        return s.call(entrypoint, x)


X = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
TORCH_NODES = {"import:pkg:affine", "compile:pkg:affine:default", "link", "compose"}


@pytest.mark.slow
def test_torch_changes_rebuild_the_import_and_compute_the_new_model(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("iree.turbine")
    cache = tmp_path / "cache"
    app = _torch_package(tmp_path / "app", 'source = "model.py:a"')

    first = build(app, tmp_path / "a.mln", cache_dir=cache)
    np.testing.assert_allclose(_run(first.output, X), _torch_reference(0, X), rtol=1e-5)

    # The defect: another function of the same file served the old model from the cache.
    _set_graph(app, 'source = "model.py:b"')
    second = build(app, tmp_path / "b.mln", cache_dir=cache)
    assert set(_rebuilt(second)) == TORCH_NODES
    assert _rebuilt(second)["import:pkg:affine"] == "input 'symbol' changed"
    np.testing.assert_allclose(_run(second.output, X), _torch_reference(1, X), rtol=1e-5)
    [line] = [line for line in explain(second.results) if line.startswith("import:")]
    assert line.split() == ["import:pkg:affine", "rebuilt:", "input", "'symbol'", "changed"]

    # A module the model file imports.
    layers = app.parent / "pkg" / "layers.py"
    layers.write_text(LAYERS_PY.replace("x * 2.0", "x * 3.0"))
    third = build(app, tmp_path / "c.mln", cache_dir=cache)
    assert set(_rebuilt(third)) == TORCH_NODES
    assert _rebuilt(third)["import:pkg:affine"] == "input 'python_sources' changed"
    np.testing.assert_allclose(_run(third.output, X), _torch_reference(1, X, 3.0), rtol=1e-5)

    # Entrypoints: the one function takes the manifest's name.
    _set_graph(app, 'source = "model.py:b"\nentrypoints = ["project"]')
    fourth = build(app, tmp_path / "d.mln", cache_dir=cache)
    assert _rebuilt(fourth)["import:pkg:affine"] == "input 'entrypoints' changed"
    want = _torch_reference(1, X, 3.0)
    np.testing.assert_allclose(_run(fourth.output, X, "project"), want, rtol=1e-5)

    # Dynamic dims: the batch becomes dynamic, so another batch size runs.
    _set_graph(
        app, 'source = "model.py:b"\nentrypoints = ["project"]\ndynamic = { x = { 0 = "n" } }'
    )
    fifth = build(app, tmp_path / "e.mln", cache_dir=cache)
    assert _rebuilt(fifth)["import:pkg:affine"] == "input 'dynamic' changed"
    x5 = np.ones((5, 8), np.float32)
    np.testing.assert_allclose(
        _run(fifth.output, x5, "project"), _torch_reference(1, x5, 3.0), rtol=1e-5
    )

    # Nothing changed: nothing but compose runs.
    again = build(app, tmp_path / "f.mln", cache_dir=cache)
    assert set(_rebuilt(again)) == {"compose"}
    assert again.output.read_bytes() == fifth.output.read_bytes()


def test_mlir_changes_rebuild_exactly_the_nodes_that_read_them(tmp_path, monkeypatch):
    from safetensors.numpy import load_file, save_file

    cache = tmp_path / "cache"
    app = copy_example("mlp", tmp_path / "mlp")
    params = app.parent / "params.safetensors"
    x = np.full((2, 16), 0.5, np.float32)
    first = build(app, tmp_path / "1.mln", cache_dir=cache)
    base = _run(first.output, x)

    # A tensor's value: the weights node re-splits, link re-points, compile stays cached.
    weights = load_file(str(params))
    key = "b1"
    weights[key] = weights[key] + 1.0
    save_file(weights, str(params))
    changed = build(app, tmp_path / "2.mln", cache_dir=cache)
    assert set(_rebuilt(changed)) == {"weights:mlp:params", "link", "compose"}
    assert _rebuilt(changed)["weights:mlp:params"] == "input 'source' changed"
    assert not np.allclose(_run(changed.output, x), base)

    # A codec glob: an encode node appears, compile and link follow; int8 stays close.
    text = app.read_text()
    app.write_text(text + '\n[weights.codec]\n"*" = "int8"\n')
    coded = build(app, tmp_path / "3.mln", cache_dir=cache)
    assert set(_rebuilt(coded)) == {"encode:mlp:mlp", "compile:mlp:mlp:default", "link", "compose"}
    fp32 = _run(changed.output, x)
    np.testing.assert_allclose(_run(coded.output, x), fp32, rtol=0.05, atol=0.05)
    app.write_text(text + '\n[weights.codec]\n"*.weight" = "int8"\n')
    glob = build(app, tmp_path / "4.mln", cache_dir=cache)
    assert _rebuilt(glob)["encode:mlp:mlp"] == "input 'policy' changed"
    app.write_text(text)
    back = build(app, tmp_path / "4b.mln", cache_dir=cache)  # the earlier nodes, all cached
    assert set(_rebuilt(back)) == {"compose"}

    # A target option and the scheduling favor: only compile (and link) rebuild.
    for edited, why in (
        (
            text.replace('cpu = "host"', 'cpu = "generic"'),
            # and 'codecs_kernels' first where the host's CPU has matvec kernels (generic: none)
            "'devices', 'requirements' changed",
        ),
        (text + '\n[scheduling]\nfavor = "max-concurrency"\n', "input 'favor' changed"),
    ):
        app.write_text(edited)
        result = build(app, tmp_path / "5.mln", cache_dir=cache)
        app.write_text(text)
        build(app, tmp_path / "5b.mln", cache_dir=cache)  # back, so each edit is explained alone
        assert set(_rebuilt(result)) == {"compile:mlp:mlp:default", "link", "compose"}, why
        assert why in _rebuilt(result)["compile:mlp:mlp:default"], why
        np.testing.assert_allclose(_run(result.output, x), fp32, rtol=1e-5)
    app.write_text(text)

    # Another IREE or PLeX release: every cached node rebuilds, and says why.
    patched = {**versions.versions(), "iree-base-compiler": "9.9.9"}
    monkeypatch.setattr(versions, "versions", lambda: patched)
    released = build(app, tmp_path / "6.mln", cache_dir=cache)
    reasons = _rebuilt(released)
    assert set(reasons) == {n for n in released.results}
    assert all("tool versions changed (salt)" in r for i, r in reasons.items() if i != "compose")
