"""Graph shards: each shard its own VM module and cache entry, all in one context at run time."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import myelin
from plex.builder import build
from plex.errors import BuildError, ManifestError
from plex.manifest import load_app, load_package
from synapse import explain
from tests.models import mlp_reference
from tests.plex.build_helpers import (
    EXAMPLES,
    copy_example,
    sharded_reference,
    write_mlp_split_by_entrypoint,
)

TOL = 1e-5  # float32 matmuls of 16-32 terms, against numpy


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[Path, Path]:
    """(app.toml of a private copy of examples/sharded, its built .mln)."""
    root = tmp_path_factory.mktemp("sharded")
    app_toml = copy_example("sharded", root / "pkg")
    out = root / "sharded.mln"
    build(app_toml, out)
    return app_toml, out


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return load_file(str(EXAMPLES / "sharded" / "params.safetensors"))


def test_each_shard_is_a_module_and_shared_weights_are_stored_once(sharded, weights):
    _, out = sharded
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    with myelin.Instance().load(out) as model:
        # The decoder imports the encoder's `encode`, so the encoder is registered first.
        assert [m["name"] for m in model.variant["modules"]] == [
            "autoenc_encoder",
            "autoenc_decoder",
        ]
        stored = [(p["scope"], p["key"]) for p in model.manifest["parameters"]]
        assert sorted(stored) == [("sharded", "b_dec"), ("sharded", "b_enc"), ("sharded", "w")]
        with model.session() as session:
            h = session.call("encode", x)
            y = session.call("decode", h)
            y_cross = session.call("forward", x)  # a call from one shard module into the other
    want = sharded_reference(weights, x)
    np.testing.assert_allclose(h, np.maximum(x @ weights["w"] + weights["b_enc"], 0), atol=TOL)
    np.testing.assert_allclose(y, want, atol=TOL)
    np.testing.assert_allclose(y_cross, want, atol=TOL)


def test_touching_one_shard_recompiles_only_that_shard(sharded, tmp_path):
    app_toml, _ = sharded
    decoder = app_toml.parent / "decoder.mlir"
    original = decoder.read_text()
    try:
        decoder.write_text(original + "// an edit that changes the file, not the model\n")
        result = build(app_toml, tmp_path / "edited.mln")
    finally:
        decoder.write_text(original)
    ran = {node_id for node_id, r in result.results.items() if r.status == "built"}
    assert ran == {
        "import:sharded:autoenc_decoder",
        "compile:sharded:autoenc_decoder:default",
        "link",
        "compose",
    }
    lines = explain(result.results)
    assert "compile:sharded:autoenc_encoder:default  hit" in lines
    assert "import:sharded:autoenc_decoder           rebuilt: input 'source' changed" in lines


def test_module_order_follows_imports_not_the_manifest(sharded, tmp_path, weights):
    app_toml, _ = sharded
    folder = tmp_path / "pkg"
    shutil.copytree(app_toml.parent, folder)
    toml = (folder / "plex.toml").read_text()
    encoder = '[graph.autoenc.shards.encoder]\nsource = "encoder.mlir"\n\n'
    assert encoder in toml
    (folder / "plex.toml").write_text(toml.replace(encoder, "") + "\n" + encoder)  # decoder first
    out = tmp_path / "reordered.mln"
    build(folder / "app.toml", out)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    with myelin.Instance().load(out) as model, model.session() as session:
        assert model.variant["modules"][0]["name"] == "autoenc_encoder"
        np.testing.assert_allclose(
            session.call("forward", x), sharded_reference(weights, x), atol=TOL
        )


@pytest.fixture(scope="module")
def mlp_split(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mlpsplit")
    out = root / "split.mln"
    build(write_mlp_split_by_entrypoint(root / "pkg"), out)
    return out


def test_split_by_entrypoint_matches_the_unsharded_graph(mlp_split, mlp_mln, mlp_weights):
    x = np.random.default_rng(2).standard_normal((7, 16)).astype(np.float32)
    instance = myelin.Instance()
    with instance.load(mlp_split) as split, instance.load(mlp_mln) as whole:
        assert [m["name"] for m in split.variant["modules"]] == ["mlp_first", "mlp_head"]
        entries = {e["name"]: e["module"] for e in split.variant["entrypoints"]}
        assert entries == {"hidden": "mlp_first", "forward": "mlp_head"}
        # `forward` calls `hidden` inside its own module; the weights are still stored once.
        assert len(split.manifest["parameters"]) == len(whole.manifest["parameters"]) == 4
        with split.session() as s1, whole.session() as s2:
            for name in ("hidden", "forward"):
                np.testing.assert_array_equal(s1.call(name, x), s2.call(name, x))
    hidden, forward = mlp_reference(mlp_weights, x)
    with instance.load(mlp_split) as split, split.session() as s:
        np.testing.assert_allclose(s.call("forward", x), forward, atol=TOL)
        np.testing.assert_allclose(s.call("hidden", x), hidden, atol=TOL)


def test_a_shard_module_exports_only_its_entrypoints(mlp_split):
    import iree.runtime as rt

    from myelin.mln import MlnReader

    reader = MlnReader(mlp_split)
    instance = rt.VmInstance()
    exported = {}
    for m in reader.manifest["variants"][0]["modules"]:
        module = rt.VmModule.copy_buffer(instance, bytes(reader.section_view(m["section"])))
        exported[m["name"]] = sorted(f for f in module.function_names if not f.startswith("__"))
    assert exported == {"mlp_first": ["hidden"], "mlp_head": ["forward"]}


def test_calling_a_module_the_app_does_not_build_is_a_build_error(tmp_path):
    folder = tmp_path / "pkg"
    copy_example("sharded", folder)
    decoder = folder / "decoder.mlir"
    decoder.write_text(
        decoder.read_text().replace("@autoenc_encoder.encode", "@autoenc_enc.encode")
    )
    with pytest.raises(BuildError, match="calls functions of VM module 'autoenc_enc', which"):
        build(folder / "app.toml", tmp_path / "x.mln")
    assert not (tmp_path / "x.mln").exists()


def test_module_names_must_stay_unique(tmp_path):
    folder = write_mlp_split_by_entrypoint(tmp_path / "pkg").parent
    with (folder / "plex.toml").open("a") as f:
        f.write('\n[graph.mlp_head]\nsource = "mlp.mlir"\nweights = "params"\n')
    with pytest.raises(BuildError, match="both compile to VM module 'mlp_head'"):
        build(folder / "app.toml", tmp_path / "x.mln")


# -- manifest -------------------------------------------------------------------------------------


def package(tmp_path: Path, graph: str) -> Path:
    folder = tmp_path / "p"
    folder.mkdir()
    for name in ("a.mlir", "b.mlir"):
        (folder / name).write_text("module {}\n")
    (folder / "plex.toml").write_text('[package]\nname = "p"\n\n' + textwrap.dedent(graph))
    return folder


def test_shard_specs(tmp_path):
    folder = package(
        tmp_path,
        """\
        [graph.g]
        source = "a.mlir"
        shards = { one = ["f"], two = ["g", "h"] }

        [graph.files]
        [graph.files.shards.x]
        source = "a.mlir"
        [graph.files.shards.y]
        source = "b.mlir"
        entrypoints = ["main"]
        """,
    )
    graphs = load_package(folder).graphs
    split = graphs["g"].shards
    assert [(s.name, s.entrypoints, s.own_source) for s in split] == [
        ("one", ("f",), False),
        ("two", ("g", "h"), False),
    ]
    files = graphs["files"]
    assert files.source is None and files.frontend == "mlir"
    assert [(s.name, s.source.name, s.entrypoints, s.own_source) for s in files.shards] == [
        ("x", "a.mlir", None, True),
        ("y", "b.mlir", ("main",), True),
    ]
    # Shard sources are part of the package fingerprint, like graph sources.
    assert folder / "b.mlir" in load_package(folder).files


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        ('[graph.g]\nsource = "a.mlir"\nshards = ["f"]\n', "[graph.g] shards: expected a table"),
        ('[graph.g]\nsource = "a.mlir"\nshards = { one = [] }\n', "must list at least one"),
        (
            '[graph.g]\nsource = "a.mlir"\nshards = { one = ["f"], two = ["f"] }\n',
            "[graph.g] shards.two[0]: 'f' is already in shard 'one'",
        ),
        (
            '[graph.g]\nsource = "a.mlir"\nentrypoints = ["f"]\nshards = { one = ["f"] }\n',
            "[graph.g] entrypoints: a sharded graph lists entrypoints per shard",
        ),
        (
            '[graph.g]\n[graph.g.shards.one]\nentrypoints = ["f"]\n',
            "[graph.g.shards.one] source: missing required key",
        ),
        (
            '[graph.g]\nsource = "a.mlir"\n[graph.g.shards.one]\nsource = "b.mlir"\n',
            "[graph.g] source: no shard uses the graph's source",
        ),
        ('[graph.g]\nsource = "a.mlir"\n[graph.g.shards.one]\nsorce = "b.mlir"\n', "did you mean"),
        ('[graph.g]\nweights = "w"\n', "[graph.g] source: missing required key"),
        ('[graph.g]\nsource = "a.mlir"\nshards = { "bad name" = ["f"] }\n', "invalid name"),
    ],
)
def test_shard_mistakes_are_one_line_errors_at_their_key(tmp_path, graph, message):
    folder = package(tmp_path, graph)
    with pytest.raises(ManifestError) as caught:
        load_package(folder)
    assert message in str(caught.value)


def test_shards_are_no_longer_refused_by_apps(tmp_path):
    folder = package(tmp_path, '[graph.g]\nsource = "a.mlir"\nshards = { one = ["f"] }\n')
    (tmp_path / "app.toml").write_text('[app]\nname = "a"\npackages = ["p"]\n')
    assert [s.name for s in load_app(tmp_path / "app.toml").graphs[0].shards] == ["one"]
    assert folder.is_dir()
