"""The JAX frontend end to end: a jax.numpy conv net -> plex build -> myelin, against jax on CPU.

The package's model.py is written by the test; it is built once per module.
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import myelin  # noqa: E402
from myelin.mln import MlnReader  # noqa: E402
from plex.builder import build  # noqa: E402
from plex.errors import BuildError  # noqa: E402

RTOL = 1e-5  # relative L2 error against jax.jit on CPU, fp32

MODEL_PY = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax


    def convnet(params, image):
        # NHWC conv 3x3 -> relu -> global average pool -> dense -> softmax
        y = lax.conv_general_dilated(
            image, params["conv"]["kernel"], window_strides=(1, 1), padding="SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        y = jax.nn.relu(y + params["conv"]["bias"])
        y = jnp.mean(y, axis=(1, 2))
        for layer in params["dense"]:
            y = jnp.tanh(y @ layer["kernel"] + layer["bias"])
        return jax.nn.softmax(y @ params["head"], axis=-1)


    def params(seed=0):
        rng = np.random.default_rng(seed)
        normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
        return {
            "conv": {"kernel": normal(3, 3, 3, 16) / 3, "bias": normal(16)},
            "dense": [{"kernel": normal(16, 32) / 4, "bias": normal(32)},
                      {"kernel": normal(32, 32) / 6, "bias": normal(32)}],
            "head": normal(32, 10),
        }


    def build():
        return convnet, params(), (np.zeros((2, 12, 12, 3), np.float32),)


    def rowwise(params, x):
        return jnp.tanh(x @ params["w"] + params["b"])


    def build_rowwise():
        rng = np.random.default_rng(1)
        p = {"w": rng.standard_normal((8, 4)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
        return rowwise, p, (np.zeros((3, 8), np.float32),)


    def build_dynamic_softmax():
        return convnet, params(), (np.zeros((2, 12, 12, 3), np.float32),)
    """)

PLEX_TOML = textwrap.dedent("""\
    [package]
    name = "jaxnets"
    version = "0.1.0"

    [graph.convnet]
    source = "model.py:build"
    frontend = "jax"

    [graph.rowwise]
    source = "model.py:build_rowwise"
    frontend = "jax"
    entrypoints = ["apply"]
    dynamic = { x = { 0 = "batch" } }

    [graph.softmax_dynamic]
    source = "model.py:build_dynamic_softmax"
    frontend = "jax"
    dynamic = { image = { 0 = "batch" } }
    """)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("jaxnets") / "jaxnets"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_PY)
    (folder / "plex.toml").write_text(PLEX_TOML)
    return folder


def app(package: Path, name: str, graphs: list[str]) -> Path:
    path = package / f"{name}.toml"
    listed = ", ".join(f'"jaxnets:{g}"' for g in graphs)
    path.write_text(f'[app]\nname = "{name}"\npackages = ["."]\ngraphs = [{listed}]\n')
    return path


def user_module(package: Path):
    spec = importlib.util.spec_from_file_location("jaxnets_model", package / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nets_mln(package: Path) -> Path:
    return build(app(package, "nets", ["convnet", "rowwise"]), package / "nets.mln").output


def relerr(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def test_convnet_matches_jax_on_cpu(nets_mln: Path, package: Path) -> None:
    fn, params, _ = user_module(package).build()
    image = np.random.default_rng(4).standard_normal((2, 12, 12, 3)).astype(np.float32)
    expected = np.asarray(jax.jit(fn)(params, image))
    with myelin.Instance().load(nets_mln) as model, model.session() as session:
        got = session.call("forward", image)
    assert got.shape == (2, 10)
    assert relerr(got, expected) < RTOL


def test_params_are_named_mln_parameters_keyed_by_pytree_path(nets_mln: Path) -> None:
    with MlnReader(nets_mln) as reader:
        params = {(p["scope"], p["key"]): p for p in reader.manifest["parameters"]}
    convnet = {key: p for (scope, key), p in params.items() if scope == "jaxnets.convnet"}
    assert set(convnet) == {
        "conv/kernel",
        "conv/bias",
        "dense/0/kernel",
        "dense/0/bias",
        "dense/1/kernel",
        "dense/1/bias",
        "head",
    }
    assert convnet["conv/kernel"]["shape"] == [3, 3, 3, 16]
    assert convnet["head"]["dtype"] == "float32"


def test_signature_shows_only_the_arguments(nets_mln: Path) -> None:
    with myelin.Instance().load(nets_mln) as model:
        signature = model.entrypoints["forward"].signature
    assert [(t.name, t.shape) for t in signature.inputs] == [("image", (2, 12, 12, 3))]


def test_dynamic_batch_where_iree_supports_it(nets_mln: Path, package: Path) -> None:
    fn, params, _ = user_module(package).build_rowwise()
    with myelin.Instance().load(nets_mln) as model, model.session() as session:
        assert model.entrypoints["apply"].signature.inputs[0].shape == (None, 8)
        for batch in (1, 5, 33):
            x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
            got = session.call("apply", x)
            assert relerr(got, np.asarray(fn(params, x))) < RTOL


def test_dynamic_dim_that_iree_cannot_broadcast_is_refused_clearly(package: Path) -> None:
    with pytest.raises(BuildError, match=r"dynamic dimension is broadcast.*make that dimension"):
        build(app(package, "bad", ["softmax_dynamic"]), package / "bad.mln")
