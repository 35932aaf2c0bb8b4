"""Paths and names from a file are data: `plex profile` writes only inside its `-o` folder,
whatever the artifact's manifest names (parameter scopes, modules, backends, the capture's
`[runtime.profile] output`), and a package reads only files inside its own folder.

Crafted artifacts carry recomputed hashes (what an attacker would write); every refusal is one
`error:` line from the installed CLI (`plex.cli:app`), and nothing appears outside the folder."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import myelin
from myelin.errors import ArtifactError, UnsafePath
from myelin.untrusted import path_inside, printable
from plex.cli import app
from tests.conftest import EXAMPLES
from tests.models import mlp_reference
from tests.myelin.test_mln_format import manifest_of, replace_manifest


def plex(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output + (getattr(result, "stderr", "") or "")


def crafted(source: Path, target: Path, mutate: Callable[[dict], None]) -> Path:
    shutil.copy(source, target)
    manifest = manifest_of(target)
    mutate(manifest)
    replace_manifest(target, manifest)
    return target


def rename_scope(new: str) -> Callable[[dict], None]:
    def mutate(m: dict) -> None:
        for p in m["parameters"]:
            p["scope"] = new
        for v in m["variants"]:
            v["parameter_scopes"] = [new]
            for e in v["entrypoints"]:
                e["memory"]["parameters"] = [[new, key] for _, key in e["memory"]["parameters"]]

    return mutate


def rename_module(new: str) -> Callable[[dict], None]:
    def mutate(m: dict) -> None:
        for v in m["variants"]:
            v["modules"][0]["name"] = new
            for e in v["entrypoints"]:
                e["module"] = new

    return mutate


def add_backend(name: str) -> Callable[[dict], None]:
    def mutate(m: dict) -> None:
        section = m["variants"][0]["modules"][0]["section"]
        backend = {"name": name, "abi": 1, "ops": ["matmul"], "plugin": section, "libraries": []}
        m["variants"][0]["devices"][0]["backend"] = backend

    return mutate


def profile_output(template: str) -> Callable[[dict], None]:
    def mutate(m: dict) -> None:
        m["policies"]["profile"] = {"output": template, "device_timing": False}

    return mutate


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


# Each would write one level above `-o` (or at an absolute path) on a runtime that trusts names:
# the work folder is `-o/.work-<id>/`, so `../../x` lands beside `-o`.
CRAFTED = {
    "scope": (rename_scope("../../escape"), "parameters[0].scope"),
    "module": (rename_module("../../escape"), "variants[0].modules[0].name"),
    "backend": (add_backend("../../escape"), "variants[0].devices[0].backend.name"),
    "output-up": (profile_output("../escape-{capture}.ireeprof"), "policies.profile.output"),
    "output-absolute": (profile_output("{outside}/escape-{capture}"), "policies.profile.output"),
}


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
def test_profile_refuses_names_that_lead_out_of_its_folder(mlp_mln, tmp_path, case):
    mutate, field = CRAFTED[case]
    if case == "output-absolute":
        mutate = profile_output(f"{tmp_path}/escape-{{capture}}")
    artifact = crafted(mlp_mln, tmp_path / "crafted.mln", mutate)
    before = files_under(tmp_path)
    code, text = plex("profile", artifact, "-f", "forward", "--dim", "*=2", "-o", tmp_path / "out")
    assert code == 1, text
    assert text.startswith("error: ") and f"manifest field {field}" in text, text
    assert files_under(tmp_path) == before  # nothing written, inside or out
    with pytest.raises(ArtifactError, match=re.escape(f"manifest field {field}")):
        myelin.Instance().load(artifact)


def test_profile_refuses_a_symbolic_link_out_of_its_folder(mlp_mln, tmp_path):
    """A name that is a plain relative path but meets a link inside `-o` pointing elsewhere."""
    artifact = crafted(
        mlp_mln, tmp_path / "linked.mln", profile_output("captures/run-{capture}.ireeprof")
    )
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "captures").symlink_to(outside)
    code, text = plex("profile", artifact, "-f", "forward", "--dim", "*=2", "-o", out)
    assert code == 1, text
    assert "error: [runtime.profile] output 'captures/run-" in text
    assert "leads outside it (through a symbolic link)" in text, text
    assert files_under(outside) == set()


def test_profile_with_a_plain_relative_output_writes_inside(mlp_mln, tmp_path):
    artifact = crafted(
        mlp_mln, tmp_path / "plain.mln", profile_output("captures/run-{capture}.ireeprof")
    )
    code, text = plex("profile", artifact, "-f", "forward", "--dim", "*=2", "-o", tmp_path / "out")
    assert code == 0, text
    [capture] = (tmp_path / "out" / "captures").glob("run-*.ireeprof")
    assert files_under(tmp_path) == {artifact, capture, tmp_path / "out" / "trace.json"}


@pytest.mark.parametrize(
    ("relative", "problem"),
    [
        ("/etc/x", "is an absolute path"),
        ("a/../../x", "steps out of its folder with '..'"),
        ("..", "steps out of its folder"),
        ("", "is empty"),
        ("a\x1b[2Jb", "contains control characters"),
    ],
)
def test_path_inside_refuses_every_way_out(tmp_path, relative, problem):
    with pytest.raises(UnsafePath, match=problem) as caught:
        path_inside(tmp_path, relative, what="parameter scope")
    assert "\x1b" not in str(caught.value)  # the name is shown escaped: `a\x1b[2Jb`
    assert path_inside(tmp_path, "a/b.irpa", what="x") == tmp_path.resolve() / "a" / "b.irpa"


def test_printable_escapes_control_characters_and_lone_surrogates():
    assert printable("model") == "model"
    assert printable("a\x1b[31mred\x07") == "a\\x1b[31mred\\x07"
    assert printable("x\ud800y") == "x\\ud800y"
    printable("x\ud800y").encode("utf-8")  # a terminal's encoder takes it


# --- plex.toml / app.toml: names and the profile output are checked on load ----------------------


def write_app(root: Path, *, scope: str = "mlp", profile_output: str | None = None) -> Path:
    """A copy of the example MLP with another weights scope or `[runtime.profile] output`."""
    shutil.copytree(EXAMPLES / "mlp", root / "mlp", ignore=shutil.ignore_patterns("*.mln"))
    package = root / "mlp" / "plex.toml"
    package.write_text(package.read_text().replace('scope = "mlp"', f'scope = "{scope}"'))
    app_toml = root / "mlp" / "app.toml"
    if profile_output is not None:
        app_toml.write_text(
            app_toml.read_text() + f'\n[runtime.profile]\noutput = "{profile_output}"\n'
        )
    return app_toml


@pytest.mark.parametrize(
    ("profile_output", "message"),
    [
        (
            "/tmp/x-{capture}.ireeprof",
            "app.toml:{line}: [runtime.profile] output: '/tmp/x-{capture}",
        ),
        ("../x-{capture}.ireeprof", "steps out of its folder with '..'"),
    ],
)
def test_app_manifest_refuses_a_profile_output_outside_the_folder(
    tmp_path, profile_output, message
):
    app_toml = write_app(tmp_path, profile_output=profile_output)
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    # the line of `output = ...`: the last of the app
    message = message.replace("{line}", str(len(app_toml.read_text().splitlines())))
    assert message in text and text.startswith("error: "), text
    assert not (tmp_path / "app.mln").exists()


@pytest.mark.parametrize("scope", ["..", "../x", ".hidden", "s" * 65])
def test_package_manifest_refuses_a_scope_that_is_no_file_name(tmp_path, scope):
    app_toml = write_app(tmp_path, scope=scope)
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    assert "plex.toml:14: [weights.params] scope: invalid value" in text, text


def test_a_symlinked_output_folder_is_the_users_choice(mlp_mln, tmp_path):
    """`-o` itself may be a link: the user named it; only names from the file are confined."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    code, text = plex("profile", mlp_mln, "-f", "forward", "--dim", "*=2", "-o", tmp_path / "link")
    assert code == 0, text
    assert list(real.glob("capture-*.ireeprof"))


# --- a package reads only its own files ----------------------------------------------------------


def package_with_source(root: Path, source: str) -> Path:
    """examples/mlp copied, its graph's `source` replaced; returns app.toml."""
    app_toml = write_app(root)
    package = root / "mlp" / "plex.toml"
    package.write_text(package.read_text().replace('source = "mlp.mlir"', f'source = "{source}"'))
    return app_toml


@pytest.mark.parametrize("source", ["/etc/passwd", "../../../../../../../../etc/passwd"])
def test_a_source_outside_the_package_is_refused(tmp_path, source):
    app_toml = package_with_source(tmp_path, source)
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    assert "plex.toml:8: [graph.mlp] source: /etc/passwd is outside the folder" in text, text
    assert "allow_outside_sources = true" in text
    assert "custom op" not in text  # the file was never parsed
    assert not (tmp_path / "app.mln").exists()


def test_a_symbolic_link_out_of_the_package_is_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(EXAMPLES / "mlp" / "params.safetensors", outside / "w.safetensors")
    app_toml = write_app(tmp_path / "app")
    (app_toml.parent / "linked.safetensors").symlink_to(outside / "w.safetensors")
    package = app_toml.parent / "plex.toml"
    package.write_text(package.read_text().replace('"params.safetensors"', '"linked.safetensors"'))
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    assert "plex.toml:13: [weights.params] source:" in text, text
    assert f"{outside / 'w.safetensors'} is outside the folder" in text


def test_an_app_may_allow_sources_outside_its_packages(tmp_path, mlp_weights):
    """The opt-in: the weights live in a shared folder beside the package."""
    elsewhere = tmp_path / "weights-elsewhere"
    elsewhere.mkdir()
    shutil.copy(EXAMPLES / "mlp" / "params.safetensors", elsewhere / "params.safetensors")
    app_toml = write_app(tmp_path / "app")
    (app_toml.parent / "params.safetensors").unlink()
    package = app_toml.parent / "plex.toml"
    package.write_text(
        package.read_text().replace(
            '"params.safetensors"', '"../../weights-elsewhere/params.safetensors"'
        )
    )
    code, text = plex("build", app_toml, "-o", tmp_path / "refused.mln")
    assert code == 1 and "is outside the folder" in text, text
    app_toml.write_text(
        app_toml.read_text().replace("[app]\n", "[app]\nallow_outside_sources = true\n")
    )
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 0, text
    model = myelin.Instance().load(tmp_path / "app.mln")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    with model.session() as session:
        y = session.call("forward", x)
    model.close()
    np.testing.assert_allclose(y, mlp_reference(mlp_weights, x)[1], rtol=1e-5, atol=1e-5)


# --- odd names and crafted fields: typed errors, escaped output ------------------------------------

ODD = "evil\ud800\x1b[2J\x07"  # a lone surrogate, a clear-screen sequence, a bell


def test_inspect_and_errors_escape_odd_names(mlp_mln, tmp_path):
    def mutate(m: dict) -> None:
        m["app"]["name"] = ODD
        m["variants"][0]["entrypoints"][0]["name"] = ODD

    artifact = crafted(mlp_mln, tmp_path / "odd.mln", mutate)
    code, text = plex("inspect", artifact)
    assert code == 0, text
    assert "\x1b" not in text and "\x07" not in text and "\ud800" not in text
    assert "evil\\ud800\\x1b[2J\\x07" in text
    code, text = plex("run", artifact, "-f", "nope", "--input", "1x16xf32=1")
    assert code == 1 and text.startswith("error: "), text
    assert "evil\\ud800\\x1b[2J\\x07" in text and "\x1b" not in text


@pytest.mark.parametrize(
    ("host_functions", "field"),
    [
        ("not a list", "host_functions: must be a list"),
        ([{"function": "f"}], "host_functions[0].node: is missing"),
        ([{"function": 1, "node": "n", "section": "s", "inputs": [], "outputs": []}], "function"),
        (
            [{"function": "f", "node": "n", "section": "s", "inputs": ["float99"], "outputs": []}],
            "host_functions[0].inputs[0]: unknown dtype",
        ),
        (
            [{"function": "f", "node": "n", "section": "nope", "inputs": [], "outputs": []}],
            "host_functions[0].section: names no section of the file",
        ),
    ],
    ids=["not-a-list", "missing-keys", "wrong-type", "bad-dtype", "no-section"],
)
def test_crafted_host_functions_are_refused_naming_the_field(
    mlp_mln, tmp_path, host_functions, field
):
    def mutate(m: dict) -> None:
        m["variants"][0]["modules"][0]["host_functions"] = host_functions

    artifact = crafted(mlp_mln, tmp_path / "host.mln", mutate)
    with pytest.raises(ArtifactError, match="manifest field variants\\[0\\]\\.modules\\[0\\]\\."):
        myelin.Instance().load(artifact)
    code, text = plex("run", artifact, "-f", "forward", "--input", "1x16xf32=1")
    assert code == 1 and field in text, text


def test_a_deeply_nested_toml_value_is_a_manifest_error(tmp_path):
    app_toml = write_app(tmp_path)
    package = app_toml.parent / "plex.toml"
    package.write_text(package.read_text() + "\n[package.x]\ny = " + "[" * 500 + "]" * 500 + "\n")
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    assert "plex.toml: values nest more than 32 levels deep" in text, text


def test_a_graph_name_too_long_for_a_file_name_is_refused_on_load(tmp_path):
    app_toml = write_app(tmp_path)
    package = app_toml.parent / "plex.toml"
    package.write_text(package.read_text().replace("[graph.mlp]", f"[graph.{'g' * 240}]"))
    code, text = plex("build", app_toml, "-o", tmp_path / "app.mln")
    assert code == 1, text
    assert "invalid name 'ggg" in text and "(240 characters); must match" in text, text
    assert "{0,63}" in text
