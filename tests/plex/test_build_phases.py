"""--dump-phases, --compile-to and --resume-from: IR saved with its phase, and checked on resume."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.compiler.phases import RESUMABLE_PHASES, phase_file_name, read_phase_file
from plex.builder import build
from plex.errors import BuildError
from tests.models import mlp_reference
from tests.plex.build_helpers import copy_example


@pytest.fixture(scope="module")
def mlp_app(tmp_path_factory) -> Path:
    return copy_example("mlp", tmp_path_factory.mktemp("phases") / "pkg")


@pytest.fixture(scope="module")
def dumped(mlp_app, tmp_path_factory) -> tuple[Path, Path]:
    """(a normal build's .mln, the folder a --dump-phases build wrote)."""
    root = tmp_path_factory.mktemp("dump")
    build(mlp_app, root / "plain.mln")
    build(mlp_app, root / "dumped.mln", dump_phases=root / "phases")
    return root / "plain.mln", root / "phases"


def outputs(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    with myelin.Instance().load(path) as model, model.session() as session:
        return {name: session.call(name, x) for name in ("hidden", "forward")}


X = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


def test_dump_writes_every_phase_with_the_phase_recorded_in_the_file(dumped):
    plain, phases = dumped
    files = sorted((phases / "mlp" / "default").iterdir())
    assert [f.name for f in files] == [phase_file_name(p) for p in RESUMABLE_PHASES]
    for path, phase in zip(files, RESUMABLE_PHASES, strict=True):
        saved = read_phase_file(path)
        assert (saved.phase, saved.fields["module"], saved.fields["variant"]) == (
            phase,
            "mlp",
            "default",
        )
        assert path.read_text().startswith(f"// plex-phase: {phase}\n")
        assert f'plex.phase = "{phase}"' in saved.text
    # Dumping steps the pipeline phase by phase; the artifact is the same bytes.
    assert plain.with_name("dumped.mln").read_bytes() == plain.read_bytes()


@pytest.mark.parametrize("phase", RESUMABLE_PHASES)
def test_resuming_from_any_dumped_phase_gives_identical_results(dumped, mlp_app, tmp_path, phase):
    plain, phases = dumped
    resumed = tmp_path / "resumed.mln"
    result = build(
        mlp_app, resumed, resume_from=[phases / "mlp" / "default" / phase_file_name(phase)]
    )
    assert result.results["compile:mlp:mlp:default"].status in ("built", "hit")
    want = outputs(plain, X)
    got = outputs(resumed, X)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_compile_to_writes_the_ir_and_an_edit_of_it_takes_effect(mlp_app, tmp_path, mlp_weights):
    flow = tmp_path / "mlp.flow.mlir"
    build(mlp_app, flow, compile_to="flow")
    assert read_phase_file(flow).phase == "flow"
    assert not list(tmp_path.glob("*.mln"))  # --compile-to writes IR, not an artifact
    # The edit: relu(x) = max(x, 0) in the hidden layer's dispatch becomes min(x, 0).
    text = flow.read_text()
    assert text.count("arith.maximumf") == 1
    flow.write_text(text.replace("arith.maximumf", "arith.minimumf"))
    edited = tmp_path / "edited.mln"
    build(mlp_app, edited, resume_from=[flow])
    w = mlp_weights
    np.testing.assert_allclose(
        outputs(edited, X)["hidden"], np.minimum(X @ w["w1"] + w["b1"], 0.0), atol=1e-5
    )
    np.testing.assert_allclose(outputs(edited, X)["forward"].shape, (5, 8))
    # Without the edit, the same file resumes to the model itself.
    flow.write_text(text)
    build(mlp_app, edited, resume_from=[flow])
    np.testing.assert_allclose(outputs(edited, X)["forward"], mlp_reference(w, X)[1], atol=1e-5)


@pytest.fixture()
def flow_file(mlp_app, tmp_path) -> Path:
    path = tmp_path / "mlp.flow.mlir"
    build(mlp_app, path, compile_to="flow")
    return path


def refused(mlp_app: Path, phase_file: Path, tmp_path: Path) -> str:
    with pytest.raises(BuildError) as caught:
        build(mlp_app, tmp_path / "out.mln", resume_from=[phase_file])
    assert not (tmp_path / "out.mln").exists()
    return str(caught.value)


def test_a_file_without_a_recorded_phase_is_refused(mlp_app, flow_file, tmp_path):
    lines = flow_file.read_text().splitlines(keepends=True)
    flow_file.write_text("".join(line for line in lines if not line.startswith("// plex-")))
    assert "records no compile phase" in refused(mlp_app, flow_file, tmp_path)


def test_a_header_that_disagrees_with_the_ir_is_refused(mlp_app, flow_file, tmp_path):
    # IR of the flow phase labelled as stream: IREE would compile it "from stream" and return
    # zeros without an error (myelin/compiler/phases.py).
    text = flow_file.read_text().replace("// plex-phase: flow", "// plex-phase: stream", 1)
    flow_file.write_text(text)
    message = refused(mlp_app, flow_file, tmp_path)
    assert "header says phase 'stream' but its module attribute plex.phase says 'flow'" in message


def test_an_unknown_phase_is_refused(mlp_app, flow_file, tmp_path):
    flow_file.write_text(flow_file.read_text().replace("// plex-phase: flow", "// plex-phase: x"))
    assert "records phase 'x', which is not a phase one can resume from" in refused(
        mlp_app, flow_file, tmp_path
    )


def test_a_file_from_another_source_or_module_is_refused(mlp_app, flow_file, tmp_path):
    text = flow_file.read_text()
    flow_file.write_text(text.replace("// plex-module: mlp", "// plex-module: other"))
    assert "written for module 'other', variant 'default'" in refused(mlp_app, flow_file, tmp_path)
    flow_file.write_text(text)
    source = mlp_app.parent / "mlp.mlir"
    original = source.read_text()
    try:
        source.write_text(original + "// changed since the phase file was written\n")
        assert "with another graph source than module 'mlp' has now" in refused(
            mlp_app, flow_file, tmp_path
        )
    finally:
        source.write_text(original)


def test_a_phase_file_given_as_a_graph_source_is_refused(mlp_app, flow_file, tmp_path):
    copy = tmp_path / "pkg"
    shutil.copytree(mlp_app.parent, copy)
    shutil.copyfile(flow_file, copy / "mlp.mlir")
    with pytest.raises(
        BuildError, match=r"resume from it with `plex build --resume-from mlp\.mlir`"
    ):
        build(copy / "app.toml", tmp_path / "out.mln")


def test_cli_rejects_an_unknown_phase_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "plex", "build", str(tmp_path / "app.toml"), "--compile-to", "x"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: unknown compile phase 'x'; phases: " + ", ".join(RESUMABLE_PHASES)
    ]


def test_max_concurrency_modules_resume_too(mlp_app, tmp_path):
    """IREE prints the max-concurrency partitioning attribute in a form its parser rejects;
    phase files carry the parseable spelling."""
    folder = tmp_path / "pkg"
    shutil.copytree(mlp_app.parent, folder)
    app = folder / "app.toml"
    app.write_text(app.read_text() + '\n[scheduling]\nfavor = "max-concurrency"\n')
    plain, flow = tmp_path / "plain.mln", tmp_path / "mlp.flow.mlir"
    build(app, plain)
    build(app, flow, compile_to="flow")
    assert '#stream.partitioning_config<"max-concurrency">' in flow.read_text()
    build(app, tmp_path / "resumed.mln", resume_from=[flow])
    want, got = outputs(plain, X), outputs(tmp_path / "resumed.mln", X)
    np.testing.assert_array_equal(got["forward"], want["forward"])
    # A phase file of the min-memory build does not fit this app's flags.
    build(mlp_app, tmp_path / "other.flow.mlir", compile_to="flow")
    with pytest.raises(BuildError, match="written with another compile flags or scheduling"):
        build(app, tmp_path / "x.mln", resume_from=[tmp_path / "other.flow.mlir"])
