"""plex.manifest: plex.toml and app.toml in, frozen specs or one-line ManifestErrors out."""

from __future__ import annotations

import os
import pickle
import textwrap
import tomllib
from pathlib import Path

import pytest

from plex.errors import ManifestError
from plex.manifest import (
    PLEX_PATH,
    AppSpec,
    BuildOptions,
    DeviceSpec,
    VariantSpec,
    fingerprint_package,
    load_app,
    load_package,
    parse_size,
    write_lock,
)

MLP_TOML = """\
[package]
name = "mlp"
version = "0.1.0"
description = "a tiny MLP"

[graph.mlp]
source = "mlp.mlir"
weights = "params"
entrypoints = ["forward"]
arg_names = { forward = ["x"] }

[weights.params]
source = "params.safetensors"
scope = "mlp"
"""

APP_TOML = """\
[app]
name = "demo"
packages = ["../mlp"]
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    """Write `files` (name -> text, dedented) under `folder`; return the folder."""
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


def make_package(folder: Path, toml: str = MLP_TOML, **files: str) -> Path:
    sources = {"mlp.mlir": "module {}\n", "params.safetensors": "not really safetensors\n"}
    return write(folder, {"plex.toml": toml, **sources, **files})


def make_app(root: Path, app_toml: str = APP_TOML, package_toml: str = MLP_TOML) -> Path:
    """root/mlp (a package) and root/app/app.toml; returns the app.toml path."""
    make_package(root / "mlp", package_toml)
    return write(root / "app", {"app.toml": app_toml}) / "app.toml"


def line_of(path: Path, text: str) -> int:
    """1-based number of the first line of `path` that contains `text`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def error_of(load, path: Path) -> str:
    """The message `load(path)` fails with; it must be a single line."""
    with pytest.raises(ManifestError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture(autouse=True)
def no_plex_path(monkeypatch):
    monkeypatch.delenv(PLEX_PATH, raising=False)


# -- valid manifests ------------------------------------------------------------------------------


def test_minimal_app_resolves_with_defaults(tmp_path):
    app = load_app(make_app(tmp_path))

    assert isinstance(app, AppSpec)
    assert (app.name, app.version, app.path) == ("demo", "0.0.0", tmp_path / "app" / "app.toml")
    cpu = DeviceSpec("cpu", "llvm-cpu", "local-task", cpu="host", cpu_features="", arch=None)
    assert app.devices == (cpu,)
    assert app.variants == (VariantSpec("default", (cpu,)),)
    assert (app.favor, app.residency) == ("min-memory", "resident")
    assert app.build == BuildOptions(jobs=os.cpu_count() or 1, temp_memory=2**30, cache=None)

    (package,) = app.packages
    assert (package.name, package.version, package.description) == ("mlp", "0.1.0", "a tiny MLP")
    assert package.path == tmp_path / "mlp"
    assert len(package.fingerprint) == 64

    (graph,) = app.graphs
    assert (graph.ref, graph.frontend, graph.source_symbol) == ("mlp:mlp", "mlir", None)
    assert graph.source == tmp_path / "mlp" / "mlp.mlir"
    assert graph.entrypoints == ("forward",)
    assert dict(graph.arg_names) == {"forward": ("x",)}
    assert graph.weights is not None
    assert graph.weights.ref == "mlp:params"
    assert graph.weights.source == tmp_path / "mlp" / "params.safetensors"
    assert (graph.weights.format, graph.weights.scope, graph.weights.codec) == (
        "safetensors",
        "mlp",
        "fp32",
    )


def test_devices_variants_and_build_options(tmp_path):
    app = load_app(
        make_app(
            tmp_path,
            """\
            [app]
            name = "demo"
            version = "1.2.0"
            packages = ["../mlp"]
            graphs = ["mlp:mlp"]

            [devices.cpu]
            cpu = "generic"
            driver = "local-sync"

            [devices.gpu]
            target = "cuda"

            [devices.amd]
            target = "rocm"
            arch = "gfx942"

            [[variant]]
            name = "gpu"
            devices = ["gpu", "cpu"]

            [[variant]]
            name = "cpu"
            devices = ["cpu"]

            [scheduling]
            favor = "max-concurrency"

            [build]
            jobs = 2
            temp_memory = "512MiB"
            cache = "build-cache"
            """,
        )
    )
    cpu, gpu, amd = app.devices
    assert cpu == DeviceSpec(
        "cpu", "llvm-cpu", "local-sync", "generic", "", None, driver_pinned=True
    )
    assert gpu == DeviceSpec("gpu", "cuda", "cuda", None, None, "sm_80", result_storage=True)
    assert amd == DeviceSpec("amd", "rocm", "hip", None, None, "gfx942")
    assert app.variants == (VariantSpec("gpu", (gpu, cpu)), VariantSpec("cpu", (cpu,)))
    assert app.favor == "max-concurrency"
    assert app.build == BuildOptions(2, 512 * 2**20, tmp_path / "app" / "build-cache")


def test_python_sources_keep_their_function(tmp_path):
    folder = make_package(
        tmp_path / "nets",
        """\
        [package]
        name = "nets"

        [graph.torch_mlp]
        source = "model.py:build"
        frontend = "torch"

        [graph.jax_mlp]
        source = "zoo.jax_mlp:make"
        frontend = "jax"
        """,
        **{"model.py": "def build(): ...\n", "zoo/jax_mlp.py": "def make(): ...\n"},
    )
    package = load_package(folder / "plex.toml")

    assert package.spec.version == "0.0.0"
    torch_mlp, jax_mlp = package.graphs.values()
    assert (torch_mlp.source, torch_mlp.source_symbol) == (folder / "model.py", "build")
    assert (jax_mlp.source, jax_mlp.source_symbol, jax_mlp.frontend) == (
        folder / "zoo" / "jax_mlp.py",
        "make",
        "jax",
    )
    assert torch_mlp.entrypoints is None  # every public function


def test_load_package_leaves_references_unresolved(tmp_path):
    package = load_package(make_package(tmp_path / "mlp"))
    assert package.graphs["mlp"].weights_ref == "mlp:params"
    assert package.graphs["mlp"].weights is None  # load_app resolves it
    assert package.weights["params"].source == tmp_path / "mlp" / "params.safetensors"
    assert [f.name for f in package.files] == ["mlp.mlir", "params.safetensors", "plex.toml"]


def test_inline_weights_and_tuning_specs_are_accepted(tmp_path):
    folder = make_package(
        tmp_path / "mlp",
        """\
        [package]
        name = "mlp"

        [graph.mlp]
        source = "mlp.mlir"
        weights = "inline"

        [weights.inline]

        [tuning.cpu]
        path = "spec.mlir"
        target = "llvm-cpu"
        """,
        **{"spec.mlir": "module {}\n"},
    )
    package = load_package(folder)
    assert (package.weights["inline"].source, package.weights["inline"].format) == (None, None)
    assert package.tuning["cpu"].path == folder / "spec.mlir"
    assert folder / "spec.mlir" in package.files


# -- errors: file, line, key, and what to do -------------------------------------------------------


def test_unknown_key_names_file_line_key_and_a_close_match(tmp_path):
    app_toml = make_app(
        tmp_path,
        APP_TOML
        + """
        [devices.cpu]
        targt = "llvm-cpu"
        """,
    )
    message = error_of(load_app, app_toml)
    assert message.startswith(f"{app_toml}:{line_of(app_toml, 'targt')}: [devices.cpu] targt: ")
    assert "unknown key; did you mean 'target'?" in message
    assert (
        "(accepted: arch, backend, compute, conv_batch, cpu, cpu_features, data_tiling, driver, "
        "kernels, matmul_tiles, reductions, relayout_tiles, result_storage, target)" in message
    )


def test_unknown_table_and_unknown_key_in_an_array_of_tables(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + "[devcies.cpu]\ntarget = 'cuda'\n")
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, '[devcies.cpu]')}: devcies: unknown key" in message
    assert "did you mean 'devices'?" in message

    app_toml.write_text(
        APP_TOML + "[[variant]]\nname = 'a'\ndevices = ['cpu']\n\n"
        "[[variant]]\nname = 'b'\ndevice = ['cpu']\n"
    )
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'device = ')}: [[variant]] device: unknown key" in message
    assert "did you mean 'devices'?" in message


def test_unknown_dotted_key_points_at_its_line(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[devices]\ncpu.target = "vmvx"\ncpu.cpus = 2\n')
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'cpu.cpus')}: [devices] cpu.cpus: unknown key" in message
    assert "did you mean 'cpu'?" in message


def test_unknown_key_in_an_inline_table_points_at_its_line(tmp_path):
    toml = MLP_TOML.replace('arg_names = { forward = ["x"] }', 'arg_names = { froward = ["x"] }')
    folder = make_package(tmp_path / "mlp", toml)
    message = error_of(load_package, folder)
    line = line_of(folder / "plex.toml", "froward")
    assert (
        f"plex.toml:{line}: [graph.mlp] arg_names.froward: unknown entrypoint 'froward'" in message
    )
    assert "did you mean 'forward'?" in message


def test_wrong_type_names_the_expected_type(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[build]\njobs = "two"\n')
    message = error_of(load_app, app_toml)
    assert (
        f":{line_of(app_toml, 'jobs')}: [build] jobs: expected an integer, got a string 'two'"
        in (message)
    )

    app_toml.write_text(APP_TOML + "\n[build]\njobs = 0\n")
    assert "[build] jobs: must be >= 1, got 0" in error_of(load_app, app_toml)

    app_toml.write_text(APP_TOML.replace('["../mlp"]', '"../mlp"'))
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'packages')}: [app] packages: expected an array" in message


def test_bad_enum_value_lists_the_accepted_values(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[devices.gpu]\ntarget = "cuda2"\n')
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'cuda2')}: [devices.gpu] target: unknown value 'cuda2'" in message
    assert "did you mean 'cuda'?" in message
    assert "(accepted: llvm-cpu, vmvx, cuda, vulkan-spirv, rocm, metal-spirv)" in message

    app_toml.write_text(APP_TOML + '\n[scheduling]\nfavor = "speed"\n')
    assert "(accepted: min-memory, max-concurrency, debug)" in error_of(load_app, app_toml)


def test_bad_size_string(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[build]\ntemp_memory = "2 gigs"\n')
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'temp_memory')}: [build] temp_memory: invalid size '2 gigs'" in (
        message
    )


def test_missing_required_key_and_table(tmp_path):
    folder = make_package(tmp_path / "mlp", MLP_TOML.replace('source = "mlp.mlir"\n', ""))
    message = error_of(load_package, folder)
    assert f":{line_of(folder / 'plex.toml', '[graph.mlp]')}: [graph.mlp] source: missing" in (
        message
    )

    (folder / "plex.toml").write_text('[graph.mlp]\nsource = "mlp.mlir"\n')
    assert "plex.toml:1: package: missing required table (add [package])" in error_of(
        load_package, folder
    )


def test_invalid_names(tmp_path):
    folder = make_package(tmp_path / "mlp", MLP_TOML.replace('name = "mlp"', 'name = "MLP"'))
    assert "[package] name: invalid value 'MLP'; must match ^[a-z][a-z0-9_-]{0,63}$" in error_of(
        load_package, folder
    )
    (folder / "plex.toml").write_text(MLP_TOML.replace("[graph.mlp]", '[graph."my-mlp"]'))
    assert "invalid name 'my-mlp'" in error_of(load_package, folder)


def test_missing_source_file_names_the_resolved_path(tmp_path):
    folder = make_package(tmp_path / "mlp", MLP_TOML.replace("mlp.mlir", "missing.mlir"))
    message = error_of(load_package, folder)
    line = line_of(folder / "plex.toml", "missing.mlir")
    assert f":{line}: [graph.mlp] source: file not found: {folder / 'missing.mlir'}" in message

    (folder / "plex.toml").write_text(MLP_TOML.replace("params.safetensors", "p.safetensors"))
    assert f"[weights.params] source: file not found: {folder / 'p.safetensors'}" in error_of(
        load_package, folder
    )


def test_missing_package_folder_and_manifest(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML.replace("../mlp", "../nope"))
    message = error_of(load_app, app_toml)
    assert f"[app] packages[0]: not a package: folder not found: {tmp_path / 'nope'}" in message

    with pytest.raises(ManifestError, match=r"not a package: no plex\.toml"):
        load_package(tmp_path / "app")
    with pytest.raises(ManifestError, match="file not found"):
        load_app(tmp_path / "missing.toml")


def test_frontend_must_be_given_for_python_and_fit_the_source(tmp_path):
    toml = MLP_TOML.replace('source = "mlp.mlir"', 'source = "model.py:build"')
    folder = make_package(tmp_path / "mlp", toml, **{"model.py": ""})
    message = error_of(load_package, folder)
    assert "[graph.mlp] source: a Python source needs an explicit frontend" in message
    assert "add frontend = 'torch' or 'jax'" in message

    (folder / "plex.toml").write_text(
        MLP_TOML.replace("[graph.mlp]", '[graph.mlp]\nfrontend="jax"')
    )
    assert "frontend 'jax' needs a Python source" in error_of(load_package, folder)

    (folder / "plex.toml").write_text(MLP_TOML.replace("mlp.mlir", "model.py"))
    assert "cannot infer the frontend of 'model.py'" in error_of(load_package, folder)


def test_target_options_must_fit_the_target(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[devices.cpu]\narch = "sm_80"\n')
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'arch')}: [devices.cpu] arch: does not apply to target" in message
    assert (
        "(options of llvm-cpu: cpu, cpu_features, data_tiling, result_storage, compute, "
        "matmul_tiles, reductions, relayout_tiles, conv_batch)" in message
    )

    app_toml.write_text(APP_TOML + '\n[devices.amd]\ntarget = "rocm"\n')
    assert "[devices.amd]: target 'rocm' needs 'arch'" in error_of(load_app, app_toml)

    app_toml.write_text(APP_TOML + '\n[devices.cpu]\ndriver = "cuda"\n')
    message = error_of(load_app, app_toml)
    assert "[devices.cpu] driver: driver 'cuda' cannot run target 'llvm-cpu'" in message
    assert "(accepted for llvm-cpu: local-task, local-sync)" in message


def test_variant_names_an_unknown_device(tmp_path):
    app_toml = make_app(
        tmp_path,
        APP_TOML + '\n[devices.gpu]\ntarget = "cuda"\n\n[[variant]]\nname = "g"\n'
        'devices = [\n  "gpu",\n  "gpo",\n]\n',
    )
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'gpo')}: [[variant]] devices[1]: unknown device 'gpo'" in message
    assert "did you mean 'gpu'? (accepted: gpu)" in message


def test_toml_syntax_error_reports_its_line(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + "\n[build]\njobs = = 2\n")
    message = error_of(load_app, app_toml)
    assert message.startswith(f"{app_toml}:{line_of(app_toml, 'jobs')}: invalid TOML: ")
    assert "at column" in message


# -- references ------------------------------------------------------------------------------------


def test_unresolved_graph_reference_suggests_a_close_one(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + 'graphs = ["mlp:mpl"]\n')
    message = error_of(load_app, app_toml)
    assert f":{line_of(app_toml, 'mlp:mpl')}: [app] graphs[0]: unknown graph 'mlp:mpl'" in message
    assert "did you mean 'mlp:mlp'? (accepted: mlp:mlp)" in message

    app_toml.write_text(APP_TOML + 'graphs = ["mpl:mlp"]\n')
    message = error_of(load_app, app_toml)
    assert "[app] graphs[0]: unknown package 'mpl'; did you mean 'mlp'?" in message

    app_toml.write_text(APP_TOML + 'graphs = ["mlp"]\n')
    assert "invalid reference 'mlp' (expected 'package:name')" in error_of(load_app, app_toml)


def test_unresolved_weights_reference_points_into_the_package(tmp_path):
    app_toml = make_app(tmp_path, package_toml=MLP_TOML.replace('"params"', '"other:params"'))
    message = error_of(load_app, app_toml)
    plex_toml = tmp_path / "mlp" / "plex.toml"
    assert message.startswith(f"{plex_toml}:{line_of(plex_toml, 'other:params')}: ")
    assert "[graph.mlp] weights: unknown package 'other'" in message

    plex_toml.write_text(MLP_TOML.replace('"params"', '"parms"'))
    message = error_of(load_package, plex_toml)  # same-package references are checked early
    assert "unknown weights 'mlp:parms'; did you mean 'mlp:params'?" in message


def test_weights_from_another_package(tmp_path):
    make_package(
        tmp_path / "shared",
        '[package]\nname = "shared"\n\n[weights.params]\nsource = "params.safetensors"\n',
    )
    app_toml = make_app(
        tmp_path,
        APP_TOML.replace('["../mlp"]', '["../mlp", "../shared"]'),
        MLP_TOML.replace('"params"', '"shared:params"'),
    )
    (graph,) = load_app(app_toml).graphs
    assert graph.weights is not None
    assert graph.weights.source == tmp_path / "shared" / "params.safetensors"


def test_packages_found_on_plex_path(tmp_path, monkeypatch):
    make_package(tmp_path / "installed" / "mlp")
    app_toml = (
        write(tmp_path / "app", {"app.toml": '[app]\nname = "demo"\ngraphs = ["mlp:mlp"]\n'})
        / "app.toml"
    )
    monkeypatch.setenv(
        PLEX_PATH, os.pathsep.join([str(tmp_path / "nowhere"), str(tmp_path / "installed")])
    )

    app = load_app(app_toml)
    assert [p.path for p in app.packages] == [tmp_path / "installed" / "mlp"]
    assert app.graphs[0].ref == "mlp:mlp"

    monkeypatch.delenv(PLEX_PATH)
    assert "unknown package 'mlp'" in error_of(load_app, app_toml)


def test_plex_path_packages_are_not_selected_by_default(tmp_path, monkeypatch):
    make_package(tmp_path / "installed" / "extra", MLP_TOML.replace('"mlp"', '"extra"', 1))
    monkeypatch.setenv(PLEX_PATH, str(tmp_path / "installed"))
    app = load_app(make_app(tmp_path))
    assert [g.ref for g in app.graphs] == ["mlp:mlp"]
    assert [p.name for p in app.packages] == ["mlp"]


def test_duplicate_package_names_name_both_folders(tmp_path, monkeypatch):
    make_package(tmp_path / "mlp2")
    app_toml = make_app(tmp_path, APP_TOML.replace('["../mlp"]', '["../mlp", "../mlp2"]'))
    message = error_of(load_app, app_toml)
    assert "[app] packages[1]: two packages are named 'mlp'" in message
    assert f"{tmp_path / 'mlp'} and {tmp_path / 'mlp2'}" in message

    make_package(tmp_path / "installed" / "mlp")
    monkeypatch.setenv(PLEX_PATH, str(tmp_path / "installed"))
    app_toml.write_text(APP_TOML)
    message = error_of(load_app, app_toml)
    assert f"{tmp_path / 'mlp'} (listed here) and {tmp_path / 'installed' / 'mlp'}" in message


# -- not implemented yet: accepted, validated, and refused when used ------------------------------


def test_app_selects_a_tuning_spec_per_target(tmp_path):
    package = MLP_TOML + '\n[tuning.cpu]\npath = "mlp.mlir"\ntarget = "llvm-cpu"\n'
    app_toml = make_app(tmp_path, APP_TOML + '\n[myelin]\ntuning = "mlp:cpu"\n', package)
    [spec] = load_app(app_toml).tuning
    assert (spec.ref, spec.target) == ("mlp:cpu", "llvm-cpu")


def test_defaults_of_not_implemented_features_are_fine(tmp_path):
    app_toml = make_app(
        tmp_path,
        APP_TOML + '\n[weights]\nresidency = "resident"\n\n[placement]\n\n[runtime.profile]\n',
        MLP_TOML.replace('scope = "mlp"', 'scope = "mlp"\ncodec = "fp32"'),
    )
    assert load_app(app_toml).residency == "resident"


def test_not_implemented_values_are_still_validated(tmp_path):
    app_toml = make_app(tmp_path, APP_TOML + '\n[placement]\n"mlp.*" = "gpu"\n')
    assert "[placement] \"mlp.*\": unknown device 'gpu'" in error_of(load_app, app_toml)

    app_toml.write_text(APP_TOML + '\n[myelin]\ntuning = "mlp:gpu"\n')
    assert "unknown tuning spec 'mlp:gpu'" in error_of(load_app, app_toml)


def test_a_backend_is_validated_at_its_line(tmp_path):
    toml = f'{MLP_TOML}\n[backend.npu]\nlibrary = "npu.so"\nops = ["matmul"]\n'
    make_app(tmp_path, package_toml=toml)
    message = error_of(load_package, tmp_path / "mlp")
    plex_toml = tmp_path / "mlp" / "plex.toml"
    assert message.startswith(f"{plex_toml}:{line_of(plex_toml, 'library =')}: ")
    assert "file not found" in message and "npu.so" in message


def test_weights_formats(tmp_path):
    toml = MLP_TOML.replace("params.safetensors", "params.gguf")
    app_toml = make_app(tmp_path, package_toml=toml)
    make_package(tmp_path / "mlp", toml, **{"params.gguf": ""})
    message = error_of(load_app, app_toml)
    assert "[weights.params] source: the .gguf weights format is not implemented yet" in message

    (tmp_path / "mlp" / "params.bin").write_text("")
    (tmp_path / "mlp" / "plex.toml").write_text(toml.replace(".gguf", ".bin"))
    message = error_of(load_package, tmp_path / "mlp")
    assert "unknown weights format '.bin' (accepted: .safetensors, .irpa, .gguf)" in message


def test_unused_package_features_do_not_block_an_app(tmp_path):
    toml = MLP_TOML + (
        '\n[graph.other]\nsource = "mlp.mlir"\nweights = "gg"\n\n[weights.gg]\n'
        'source = "params.gguf"\n'
    )
    app_toml = make_app(tmp_path, APP_TOML + 'graphs = ["mlp:mlp"]\n', toml)
    (tmp_path / "mlp" / "params.gguf").write_text("")
    app = load_app(app_toml)
    assert [g.ref for g in app.graphs] == ["mlp:mlp"]


def test_specs_are_immutable_hashable_and_pickle(tmp_path):
    app = load_app(make_app(tmp_path))
    assert pickle.loads(pickle.dumps(app)) == app  # worker processes receive specs
    assert hash(app) == hash(pickle.loads(pickle.dumps(app)))
    with pytest.raises(TypeError):
        app.graphs[0].arg_names["forward"] = ("y",)  # type: ignore[index]


# -- plex.lock -------------------------------------------------------------------------------------


def test_lock_is_deterministic_and_follows_content(tmp_path):
    app_toml = make_app(tmp_path)
    lock = write_lock(load_app(app_toml))
    assert lock == tmp_path / "app" / "plex.lock"
    first = lock.read_bytes()

    data = tomllib.loads(first.decode())
    (package,) = data["package"]
    assert package["name"] == "mlp" and package["version"] == "0.1.0"
    assert package["path"] == "../mlp"
    assert package["fingerprint"] == fingerprint_package(tmp_path / "mlp")
    assert data["app"] == {"name": "demo", "version": "0.0.0"}

    assert write_lock(load_app(app_toml)).read_bytes() == first
    (tmp_path / "mlp" / "mlp.mlir").write_text("module { }\n")
    assert write_lock(load_app(app_toml)).read_bytes() != first


def test_fingerprint_covers_every_referenced_file_and_names(tmp_path):
    folder = make_package(tmp_path / "mlp")
    package = load_package(folder)
    assert fingerprint_package(package) == package.spec.fingerprint

    (folder / "params.safetensors").write_text("other bytes\n")
    assert fingerprint_package(package) != package.spec.fingerprint

    (folder / "unrelated.txt").write_text("not referenced\n")
    assert fingerprint_package(folder) == fingerprint_package(load_package(folder))


def test_lock_at_an_explicit_path(tmp_path):
    lock = write_lock(load_app(make_app(tmp_path)), tmp_path / "elsewhere.lock")
    assert lock.read_text().startswith("# plex.lock")


# -- sizes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GiB", 2 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("1KiB", 1024),
        ("1.5GB", 1_500_000_000),
        ("3MB", 3_000_000),
        ("64B", 64),
        ("4096", 4096),
        (4096, 4096),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "2 gigs", "2gib", "-1GiB", -1, True, 2.5])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)
