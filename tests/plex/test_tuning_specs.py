"""`[myelin] tuning`: a spec really changes the compiled configuration, its matches are counted
and recorded in the .mln, a spec that matches nothing warns, and editing it recompiles only the
compile nodes of its target. Real compiles of examples/mlp on llvm-cpu."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.mln import MlnReader
from myelin.tuning.spec import ContractionMatch, SpecEntry, render_spec
from plex.builder import build
from plex.errors import BuildWarning, ManifestError
from plex.manifest import load_app
from tests.plex.build_helpers import copy_example

MATMUL_MAPS = (
    "affine_map<(d0, d1, d2) -> (d0, d2)>",
    "affine_map<(d0, d1, d2) -> (d2, d1)>",
    "affine_map<(d0, d1, d2) -> (d0, d1)>",
)
# An unusual config, so that seeing it in the configured IR proves the spec applied.
TUNED = (
    "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
    "distribution = [24, 32, 0], vector_common_parallel = [4, 16, 0], vector_reduction = [0, 0, 2]>, "
    "translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>, "
    "{enable_loop_peeling}>>"
)
TUNED_IN_IR = (
    "distribution = [24, 32, 0], vector_common_parallel = [4, 16, 0], vector_reduction = [0, 0, 2]"
)


def spec_text(k: int) -> str:
    """A spec for the MLP's first matmul (dynamic batch x 16 -> 32); `k` other than 16 matches
    nothing."""
    match = ContractionMatch("f32", "f32", "f32", MATMUL_MAPS, (), (None,), (32,), (k,))
    return render_spec([SpecEntry("hidden", match, TUNED)])


def tuned_app(folder: Path, *, k: int = 16, vmvx_variant: bool = False) -> Path:
    app = copy_example("mlp", folder)
    (folder / "cpu_spec.mlir").write_text(spec_text(k))
    with (folder / "plex.toml").open("a") as f:
        f.write('\n[tuning.cpu]\npath = "cpu_spec.mlir"\ntarget = "llvm-cpu"\n')
    text = app.read_text() + '\n[myelin]\ntuning = "mlp:cpu"\n'
    if vmvx_variant:
        text += (
            '\n[devices.vm]\ntarget = "vmvx"\n\n[[variant]]\nname = "cpu"\ndevices = ["cpu"]\n'
            '\n[[variant]]\nname = "vm"\ndevices = ["vm"]\n'
        )
    app.write_text(text)
    return app


X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


def forward(path: Path) -> np.ndarray:
    with myelin.Instance().load(path) as model, model.session() as session:
        return session.call("forward", X)


def test_spec_changes_the_compiled_configuration_and_is_recorded(tmp_path):
    plain_app = copy_example("mlp", tmp_path / "plain")
    app = tuned_app(tmp_path / "tuned")
    cache = tmp_path / "cache"
    for which, path in (("plain", plain_app), ("tuned", app)):
        build(
            path, tmp_path / which / "ir", compile_to="executable-configurations", cache_dir=cache
        )
    configured = {
        which: next((tmp_path / which / "ir").rglob("*.mlir")).read_text()
        for which in ("plain", "tuned")
    }
    assert TUNED_IN_IR in configured["tuned"]
    assert TUNED_IN_IR not in configured["plain"]

    with warnings.catch_warnings():
        warnings.simplefilter("error", BuildWarning)  # a spec that matched is no warning
        build(app, tmp_path / "tuned.mln", cache_dir=cache)
    build(plain_app, tmp_path / "plain.mln", cache_dir=cache)
    manifest = MlnReader(tmp_path / "tuned.mln").artifact_manifest
    assert manifest.tuning is not None
    [applied] = manifest.tuning["applied"]
    assert (applied["spec"], applied["matched_ops"]) == ("mlp:cpu", 1)
    assert list(applied["dispatches"]) == ["mlp_hidden_dispatch_0"]
    spec = manifest.provenance.extras["tuning_specs"]["mlp:cpu"]
    assert spec["target"] == "llvm-cpu" and len(spec["sha256"]) == 64
    # Another config, the same arithmetic.
    np.testing.assert_allclose(
        forward(tmp_path / "tuned.mln"), forward(tmp_path / "plain.mln"), rtol=1e-5, atol=1e-5
    )


def test_spec_that_matches_nothing_warns_naming_it(tmp_path):
    app = tuned_app(tmp_path / "app", k=999)
    with pytest.warns(BuildWarning, match=r"tuning spec mlp:cpu matched no op of mlp:mlp"):
        build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache")
    manifest = MlnReader(tmp_path / "a.mln").artifact_manifest
    assert manifest.tuning["applied"][0]["matched_ops"] == 0


def test_editing_the_spec_recompiles_only_its_targets_compile_nodes(tmp_path):
    app = tuned_app(tmp_path / "app", vmvx_variant=True)
    cache = tmp_path / "cache"
    build(app, tmp_path / "a.mln", cache_dir=cache)
    (tmp_path / "app" / "cpu_spec.mlir").write_text(spec_text(16) + "// edited\n")
    results = build(app, tmp_path / "b.mln", cache_dir=cache).results
    built = {node for node, r in results.items() if r.status == "built"}
    assert built == {"compile:mlp:mlp:cpu", "link", "compose"}  # compose is never cached
    assert results["compile:mlp:mlp:vm"].status == "hit"
    assert results["import:mlp:mlp"].status == "hit"


def test_two_specs_for_one_target_are_refused(tmp_path):
    app = tuned_app(tmp_path / "app")
    with (tmp_path / "app" / "plex.toml").open("a") as f:
        f.write('\n[tuning.other]\npath = "cpu_spec.mlir"\ntarget = "llvm-cpu"\n')
    app.write_text(
        app.read_text().replace('tuning = "mlp:cpu"', 'tuning = ["mlp:cpu", "mlp:other"]')
    )
    with pytest.raises(ManifestError, match="two tuning specs for target 'llvm-cpu'"):
        load_app(app)


def test_compile_record_names_the_spec_by_content(tmp_path):
    app = tuned_app(tmp_path / "app")
    result = build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache")
    meta = json.loads(
        (result.results["compile:mlp:mlp:default"].out_dir / "compile.json").read_text()
    )
    assert meta["tuning"]["matched_ops"] == 1
    assert any(f.startswith("--iree-codegen-tuning-spec-path=") for f in meta["flags"])


def test_a_process_wide_spec_builds_next_to_an_untuned_llvm_cpu_variant(tmp_path):
    """IREE 3.13 takes vmvx's (and CUDA's) spec flag only on its once-per-process command line,
    which an llvm-cpu compile also sets (its loop alignment): in one worker either compile
    would refuse the other. Each such compile gets a worker process of its own, so both
    variants build, in one worker slot, in either order."""
    app = copy_example("mlp", tmp_path / "app")
    (app.parent / "vm_spec.mlir").write_text(spec_text(999))  # applied, matches nothing
    with (app.parent / "plex.toml").open("a") as f:
        f.write('\n[tuning.vm]\npath = "vm_spec.mlir"\ntarget = "vmvx"\n')
    app.write_text(
        app.read_text()
        + '\n[devices.vm]\ntarget = "vmvx"\n\n[[variant]]\nname = "cpu"\ndevices = ["cpu"]\n'
        + '\n[[variant]]\nname = "vm"\ndevices = ["vm"]\n\n[myelin]\ntuning = "mlp:vm"\n'
    )
    with pytest.warns(BuildWarning, match=r"tuning spec mlp:vm matched no op"):
        build(app, tmp_path / "a.mln", cache_dir=tmp_path / "cache", jobs=1)
    for variant in ("cpu", "vm"):
        with (
            myelin.Instance().load(tmp_path / "a.mln", variant=variant) as model,
            model.session() as session,
        ):
            want = forward(tmp_path / "a.mln")
            np.testing.assert_allclose(session.call("forward", X), want, rtol=1e-5, atol=1e-6)
