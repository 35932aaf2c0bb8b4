"""The zoo in the other forms users build it from reaches the kernel library too: Hugging Face
models with their hand-written ("eager") attention through the torch frontend, and every zoo
architecture exported by `torch.onnx.export` through the ONNX frontend (small f16 configs,
benchmarks/gpu/zoo/models.py), built for a Hopper device with `kernels = "triton-attention"`
without a GPU. Every contraction is reported: on a kernel, or with the reason it stays IREE's.

The normal forms compute what the written forms do: the ONNX graphs rewritten as the kernels step
rewrites them (`myelin.kernels.normalize_contractions`), compiled for the CPU, against the plain
CPU build and torch eager in f32; the torch export of eager attention as SDPA, against eager.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("transformers")
pytest.importorskip("triton")
pytest.importorskip("onnx")

import torch

import myelin
from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "benchmarks" / "gpu" / "zoo"
TORCHVISION_PLACEHOLDER = REPO / "tests" / "frontends" / "_torchvision_shim"
HOPPER = '\n[devices.hopper]\ntarget = "cuda"\nkernels = "triton-attention"\n'
CPU = '\n[devices.cpu]\ntarget = "llvm-cpu"\n'
APP = '[app]\nname = "{name}"\npackages = ["."]\n'
# Python graph sources: the zoo's Hugging Face models with eager attention
EAGER_PY = f"""
import importlib.util

spec = importlib.util.spec_from_file_location("gpu_zoo_models", {str(ZOO / "models.py")!r})
zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zoo)

for _name in zoo.HF_MODELS:
    globals()[f"{{_name}}_eager"] = lambda _name=_name: zoo.eager(_name, "small")
"""
HEAD_1000 = "N = 1000, K = {k}: kernels need K % 64 == 0 and N % 16 == 0"
# An exporter-folded causal mask is a constant of the graph (a weight), not torch's causal op:
# the flash kernel cannot tell it is causal, so the attention stays IREE's (its own attention op).
MASK = "the mask is not the causal mask"

# graph -> {(op, on a kernel, reason prefix): count}
EAGER: dict[str, dict[tuple[str, bool, str], int]] = {
    # softmax(q @ k^T * scale + mask) @ v through repeat_kv (GQA): SDPA, mask made causal
    "llama_eager": {("matmul_transpose_b", True, "matched"): 15, ("attention_causal", True, "matched"): 2},
    "qwen2_eager": {("matmul_transpose_b", True, "matched"): 15, ("attention_causal", True, "matched"): 2},
    "gpt2_eager": {
        ("matmul", True, "matched"): 8,
        ("matmul_transpose_b", True, "matched"): 1,
        ("attention_causal", True, "matched"): 2,
    },
    "bert_eager": {("matmul_transpose_b", True, "matched"): 13, ("attention", True, "matched"): 2},
    "vit_eager": {
        ("matmul_transpose_b", True, "matched"): 13,
        ("attention", True, "matched"): 2,
        ("conv_2d_nchw_fchw", True, "matched"): 1,
    },
    "whisper_encoder_eager": {
        ("matmul_transpose_b", True, "matched"): 12,
        ("attention", True, "matched"): 2,
        ("conv_1d_ncw_fcw", True, "matched"): 2,
    },
}  # fmt: skip
# ONNX stores a linear's weight [k, n] (A x B); its MatMul of [b, s, k] is a batched matmul
# with a broadcast weight, and its attention two batched matmuls around a softmax: both become
# the canonical forms at IR level.
ONNX: dict[str, dict[tuple[str, bool, str], int]] = {
    "llama": {("matmul", True, "matched"): 15, ("attention_masked", False, MASK): 2},
    "qwen2": {("matmul", True, "matched"): 15, ("attention_masked", False, MASK): 2},
    "gpt2": {("matmul", True, "matched"): 9, ("attention_masked", False, MASK): 2},
    "bert": {("matmul", True, "matched"): 12, ("attention", True, "matched"): 2},
    "vit": {
        ("matmul", True, "matched"): 12,
        ("attention", True, "matched"): 2,
        ("conv_2d_nchw_fchw", True, "matched"): 1,
    },
    "whisper_encoder": {
        ("matmul", True, "matched"): 12,
        ("attention", True, "matched"): 2,
        ("conv_1d_ncw_fcw", True, "matched"): 2,
    },
    "timm_vit_base": {
        ("matmul", True, "matched"): 8,
        ("attention", True, "matched"): 2,
        ("matmul_transpose_b", False, HEAD_1000.format(k=128)): 1,
        ("conv_2d_nchw_fchw", True, "matched"): 1,
    },
    "timm_resnet50": {
        ("conv_2d_nchw_fchw", True, "matched"): 17,
        ("matmul_transpose_b", False, HEAD_1000.format(k=2048)): 1,
    },
}  # fmt: skip


def zoo_models():
    """benchmarks/gpu/zoo/models.py (timm imports torchvision: the placeholder where none
    loads)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        if str(TORCHVISION_PLACEHOLDER) not in sys.path:
            sys.path.insert(0, str(TORCHVISION_PLACEHOLDER))
    spec = importlib.util.spec_from_file_location("gpu_zoo_models", ZOO / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_sites(root: Path, package: str, device: str) -> tuple[dict[str, list[dict]], list[str]]:
    (root / "plex.toml").write_text(package)
    (root / "app.toml").write_text(APP.format(name=root.name) + device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        out = build(root / "app.toml", root / "zoo.mln").output
    with MlnReader(out) as r:
        (dev,) = r.manifest["variants"][0]["devices"]
    by_module: dict[str, list[dict]] = {}
    for site in dev["kernels"]:
        by_module.setdefault(site["module"], []).append(site)
    return by_module, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> Path:
    """Every zoo architecture exported to ONNX, as a user exports it."""
    zoo = zoo_models()  # first: it puts the torchvision placeholder in place for timm
    pytest.importorskip("timm")
    root = tmp_path_factory.mktemp("zoo-onnx")
    for model in ONNX:
        zoo.export_onnx(model, "small", root / f"{model}.onnx")
    return root


@pytest.fixture(scope="module")
def onnx_sites(onnx_files) -> dict[str, list[dict]]:
    graphs = "".join(f'[graph.{m}]\nsource = "{m}.onnx"\n' for m in ONNX)
    sites, _ = _build_sites(onnx_files, f'[package]\nname = "zoo_onnx"\n{graphs}', HOPPER)
    return sites


@pytest.fixture(scope="module")
def eager_sites(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("zoo-eager")
    (root / "eager.py").write_text(EAGER_PY)
    graphs = "".join(f'[graph.{g}]\nsource = "eager.py:{g}"\nfrontend = "torch"\n' for g in EAGER)
    sites, _ = _build_sites(root, f'[package]\nname = "zoo_eager"\n{graphs}', HOPPER)
    return sites


def _summary(module_sites: list[dict], expected: dict) -> Counter:
    prefixes = {key for per_module in expected.values() for key in per_module}
    counts: Counter = Counter()
    for s in module_sites:
        if s["op"] == "concat":
            continue
        known = {p for (op, _, p) in prefixes if op == s["op"] and s["reason"].startswith(p)}
        counts[(s["op"], bool(s["kernel"]), max(known, key=len) if known else s["reason"])] += 1
    return counts


@pytest.mark.parametrize("graph", list(EAGER))
def test_hand_written_attention_through_torch_goes_to_the_attention_kernels(eager_sites, graph):
    assert _summary(eager_sites[graph], EAGER) == Counter(EAGER[graph])


@pytest.mark.parametrize("model", list(ONNX))
def test_the_onnx_export_of_every_zoo_model_reaches_the_kernels_or_says_why(onnx_sites, model):
    assert _summary(onnx_sites[model], ONNX) == Counter(ONNX[model])


def test_the_transformers_have_every_f16_matmul_flop_on_kernels_through_both_frontends(
    eager_sites, onnx_sites
):
    """What the coverage line says: 100% of FLOPs for the transformers whose attention has no
    mask or torch's causal one; the ONNX decoders' only misses are their attentions, with the
    exporter's folded mask as the reason."""
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line

    for graph in ("llama_eager", "qwen2_eager", "gpt2_eager", "bert_eager"):
        assert "(100% of FLOPs)" in coverage_line(eager_sites[graph], KERNELS_CUDA_ARCH), graph
    assert "(100% of FLOPs)" in coverage_line(onnx_sites["bert"], KERNELS_CUDA_ARCH)
    for model in ("llama", "qwen2", "gpt2"):
        missed = [s for s in onnx_sites[model] if s["op"] != "concat" and not s["kernel"]]
        assert {s["op"] for s in missed} == {"attention_masked"}, missed
        assert all("matmul" not in s["op"] or s["kernel"] for s in onnx_sites[model])


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float32) - want).max() / np.abs(want).max())


# f16 CPU builds against torch eager in f32 (a relative error over the output's largest value):
# both the plain and the normalized build land at 1.4e-3 to 1.8e-3 on these models.
F16_TOLERANCE = 5e-3


def _normal_and_plain_cpu_builds(
    root: Path, graphs: str, expected: dict[str, dict[str, int]]
) -> tuple[Path, Path]:
    """The package's graphs built for llvm-cpu twice: as imported (plain) and rewritten as the
    kernels step rewrites them (`normalize_contractions` on the input-phase IR, resumed)."""
    from myelin.compiler.phases import read_phase_file, render_phase_file
    from myelin.kernels import normalize_contractions

    (root / "plex.toml").write_text(f'[package]\nname = "{root.name}"\n{graphs}')
    (root / "app.toml").write_text(APP.format(name=root.name) + CPU)
    build(root / "app.toml", root / "ir", compile_to="input")
    normal = []
    for graph, counts in expected.items():
        saved = read_phase_file(root / "ir" / graph / "default" / "01.input.mlir")
        text, done = normalize_contractions(saved.text, what=graph)
        assert done == counts, (graph, done)
        path = root / f"{graph}.normal.mlir"
        path.write_text(render_phase_file(text, saved.fields))
        normal.append(path)
    build(root / "app.toml", root / "normal.mln", resume_from=normal)
    build(root / "app.toml", root / "plain.mln")
    return root / "plain.mln", root / "normal.mln"


def _call(artifact: Path, function: str, *args: np.ndarray) -> np.ndarray:
    with myelin.Instance().load(artifact) as model, model.session() as s:
        return np.asarray(s.call(function, *args))


def test_the_normal_forms_compute_what_the_onnx_graphs_do(onnx_files, tmp_path):
    """BERT (linears, attention without a mask) and Llama (GQA, an additive causal mask) from
    ONNX, rewritten as the kernels step rewrites them and compiled for the CPU, against the
    same graphs compiled as imported and against torch eager in f32."""
    root = tmp_path / "cpu_onnx"
    root.mkdir()
    models = ("bert", "llama")
    for m in models:
        (root / f"{m}.onnx").write_bytes((onnx_files / f"{m}.onnx").read_bytes())
    graphs = "".join(f'[graph.{m}]\nsource = "{m}.onnx"\n' for m in models)
    # Attention is not rewritten here: a CPU variant's input phase already put each written-out
    # softmax's row max behind a barrier (myelin.compiler.cpu_max_reduction), which the
    # attention rewrite does not look through; a CUDA variant has no such rewrite (the coverage
    # tests above), and the JAX test below checks the attention rewrite's numerics on the CPU.
    expected = {
        "bert": {"linears": 12, "convolutions": 0, "attention": 0},
        "llama": {"linears": 15, "convolutions": 0, "attention": 0},
    }
    artifacts = _normal_and_plain_cpu_builds(root, graphs, expected)
    zoo = zoo_models()
    for m in models:
        module, inputs = zoo.eager(m, "small")
        ((name, x),) = inputs.items()
        with torch.no_grad():
            want = zoo._FirstOutput(module.float(), name, m in zoo.DECODERS)(x).numpy()
        for artifact in artifacts:
            got = _call(artifact, f"{m}.forward", x.numpy())
            assert _relative(got, want) < F16_TOLERANCE, (m, artifact.name, _relative(got, want))


JAX_PY = """
import jax
import jax.numpy as jnp
import numpy as np


def block():
    rng = np.random.default_rng(0)
    p = {
        name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float16)
        for name, shape in (("wq", (128, 128)), ("wk", (128, 128)), ("wv", (128, 128)))
    }
    p["bq"] = (0.1 * rng.standard_normal(128)).astype(np.float16)

    def fn(p, x):
        b, s, _ = x.shape
        heads = lambda t: t.reshape(b, s, 2, 64).transpose(0, 2, 1, 3)
        q = heads(x @ p["wq"] + p["bq"])
        k = heads(jnp.einsum("bsd,ed->bse", x, p["wk"]))  # the weight as [n, k]
        v = heads(x @ p["wv"])
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)

    return fn, p, (rng.standard_normal((2, 64, 128)).astype(np.float16),)
"""


def test_a_jax_block_reaches_the_kernels_and_its_normal_form_computes_the_same(tmp_path):
    """JAX's linears (2-D already: StableHLO's dot_general) and its attention written out
    (einsum, softmax, einsum) through the JAX frontend: every contraction on a kernel, and the
    normal form on the CPU equal to the graph as imported and to numpy in f32."""
    pytest.importorskip("jax")
    hopper = tmp_path / "jax_hopper"
    hopper.mkdir()
    (hopper / "block.py").write_text(JAX_PY)
    graph = '[graph.block]\nsource = "block.py:block"\nfrontend = "jax"\n'
    sites, _ = _build_sites(hopper, f'[package]\nname = "jax_block"\n{graph}', HOPPER)
    ops = Counter((s["op"], bool(s["kernel"])) for s in sites["block"] if s["op"] != "concat")
    assert ops == Counter({("matmul", True): 3, ("attention", True): 1}), sites["block"]

    cpu = tmp_path / "jax_cpu"
    cpu.mkdir()
    (cpu / "block.py").write_text(JAX_PY)
    expected = {"block": {"linears": 0, "convolutions": 0, "attention": 1}}
    artifacts = _normal_and_plain_cpu_builds(cpu, graph, expected)
    spec = importlib.util.spec_from_file_location("jax_block", cpu / "block.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    _, p, (x,) = source.block()
    f = {k: v.astype(np.float32) for k, v in p.items()}
    xf = x.astype(np.float32)

    def heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(2, 64, 2, 64).transpose(0, 2, 1, 3)

    q, k, v = heads(xf @ f["wq"] + f["bq"]), heads(xf @ f["wk"].T), heads(xf @ f["wv"])
    scores = q @ k.transpose(0, 1, 3, 2) * 0.125
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True)) @ v
    for artifact in artifacts:
        got = _call(artifact, "block.forward", x)
        assert _relative(got, want) < F16_TOLERANCE, (artifact.name, _relative(got, want))


@pytest.mark.parametrize("model", ["llama", "qwen2", "gpt2", "bert"])
def test_eager_attention_exported_as_sdpa_computes_what_eager_mode_does(model):
    """The program the torch frontend exports (eager attention as SDPA, its constant masks
    dropped or made causal) run by torch equals the eager model, in f32."""
    from myelin.frontends._torch_fixes import (
        constant_attention_masks,
        decomposition_table,
        eager_attention_as_sdpa,
    )

    module, inputs = zoo_models().eager(model, "small")
    module = module.float()
    program = torch.export.export(module, (), inputs, strict=False)
    program = program.run_decompositions(decomposition_table())
    assert eager_attention_as_sdpa(program) == 2  # one per layer
    assert constant_attention_masks(program) == 2
    sdpa = [n for n in program.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert len(sdpa) == 2 and all(n.args[3:4] in ((), (None,)) for n in sdpa)
    with torch.no_grad():
        want = module(**inputs)[0]
        got = program.module()(**inputs)[0]
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < 1e-5, rel
