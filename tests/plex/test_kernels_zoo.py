"""Standard models reach the kernel library as their libraries return them: Hugging Face Llama,
Qwen2 (grouped-query attention), GPT-2 (Conv1D: addmm with a [k, n] weight), BERT, ViT, Whisper's
encoder and timm's ViT-B and ResNet-50, at small f16 configs (benchmarks/gpu/zoo/models.py, the
same functions the GPU zoo builds at real widths), built in one app for a Hopper device with
`kernels = "triton-attention"`, without a GPU. Every contraction is in the kernel report: the
transformers' on kernels, the rest with the reason it stays with IREE.

Numerics of the export's normalizations (the f16 addmm as one matmul, the constant masks dropped
or turned causal) are checked against torch eager here; the fp32 CPU zoo
(tests/frontends/test_hf_zoo.py) checks the same frontend end to end through IREE.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("iree.turbine")
pytest.importorskip("transformers")
pytest.importorskip("triton")

import torch

from myelin.mln import MlnReader
from plex.builder import build
from plex.errors import BuildWarning

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "benchmarks" / "gpu" / "zoo"
TORCHVISION_PLACEHOLDER = REPO / "tests" / "frontends" / "_torchvision_shim"
GRAPHS = (
    "llama", "qwen2", "gpt2", "bert", "vit", "whisper_encoder", "timm_vit_base", "timm_resnet50"
)  # fmt: skip
APP = """
[app]
name = "zoo-kernels"
packages = ["{zoo}"]
graphs = [{graphs}]

[devices.hopper]
target = "cuda"
kernels = "triton-attention"
"""
# timm's classifier: 1000 classes (N = 1000 is no multiple of 16)
HEAD_1000 = "N = 1000, K = {k}: kernels need K % 64 == 0 and N % 16 == 0"

# module -> {(op, kernel or None for "stays with IREE", reason prefix): count}
EXPECTED: dict[str, dict[tuple[str, bool, str], int]] = {
    # 2 layers x 7 projections + the LM head; causal SDPA (HF's mask, evaluated at export)
    "llama_small": {("matmul_transpose_b", True, "matched"): 15, ("attention_causal", True, "matched"): 2},
    # grouped-query attention: repeat_kv expands K and V before SDPA, which the kernel reads
    "qwen2_small": {("matmul_transpose_b", True, "matched"): 15, ("attention_causal", True, "matched"): 2},
    # Conv1D's addmm with its [k, n] weight: A x B; the tied LM head: A x B^T
    "gpt2_small": {
        ("matmul", True, "matched"): 8,
        ("matmul_transpose_b", True, "matched"): 1,
        ("attention_causal", True, "matched"): 2,
    },
    # 2 layers x 6 linears + the pooler; SDPA with HF's all-keep mask dropped
    "bert_small": {("matmul_transpose_b", True, "matched"): 13, ("attention", True, "matched"): 2},
    "vit_small": {
        ("matmul_transpose_b", True, "matched"): 13,
        ("attention", True, "matched"): 2,
        ("conv_2d_nchw_fchw", True, "matched"): 1,  # the patch embedding, as im2col + matmul
    },
    "whisper_encoder_small": {
        ("matmul_transpose_b", True, "matched"): 12,
        ("attention", True, "matched"): 2,
        # the two convolutions over the mel frames, as 2-D ones of height 1 (im2col + matmul)
        ("conv_1d_ncw_fcw", True, "matched"): 2,
    },
    "timm_vit_base_small": {
        ("matmul_transpose_b", True, "matched"): 8,
        ("attention", True, "matched"): 2,
        ("matmul_transpose_b", False, HEAD_1000.format(k=128)): 1,
        ("conv_2d_nchw_fchw", True, "matched"): 1,
    },
    # every convolution as im2col + matmul (1x1 ones without the gather), narrowed in the kernel
    "timm_resnet50_small": {
        ("conv_2d_nchw_fchw", True, "matched, with its truncf"): 17,
        ("matmul_transpose_b", False, HEAD_1000.format(k=2048)): 1,
    },
}  # fmt: skip


def use_torchvision_placeholder() -> None:
    """timm imports torchvision; where none loads, the frontend tests' placeholder stands in."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        if str(TORCHVISION_PLACEHOLDER) not in sys.path:
            sys.path.insert(0, str(TORCHVISION_PLACEHOLDER))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> tuple[Path, list[str]]:
    """The eight small models in one app for Hopper with the attention library, and the build's
    warnings."""
    use_torchvision_placeholder()
    pytest.importorskip("timm")
    root = tmp_path_factory.mktemp("zoo-kernels")
    graphs = ", ".join(f'"zoo:{g}_small"' for g in GRAPHS)
    (root / "app.toml").write_text(APP.format(zoo=ZOO.as_posix(), graphs=graphs))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BuildWarning)
        out = build(root / "app.toml", root / "zoo.mln").output
    return out, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


@pytest.fixture(scope="module")
def sites(zoo) -> dict[str, list[dict]]:
    with MlnReader(zoo[0]) as r:
        (device,) = r.manifest["variants"][0]["devices"]
        by_module: dict[str, list[dict]] = {}
        for site in device["kernels"]:
            by_module.setdefault(site["module"], []).append(site)
    return by_module


def _summary(module_sites: list[dict]) -> Counter:
    counts: Counter = Counter()
    for s in module_sites:
        if s["op"] == "concat":
            continue
        prefixes = {p for (op, _, p) in EXPECTED_ALL if op == s["op"] and s["reason"].startswith(p)}
        reason = max(prefixes, key=len) if prefixes else s["reason"]
        counts[(s["op"], bool(s["kernel"]), reason)] += 1
    return counts


EXPECTED_ALL = {key for per_module in EXPECTED.values() for key in per_module}


@pytest.mark.parametrize("module", list(EXPECTED))
def test_every_contraction_of_the_model_is_reported_matched_or_with_its_reason(sites, module):
    assert _summary(sites[module]) == Counter(EXPECTED[module])


def test_the_transformers_have_every_matmul_flop_on_kernels_and_the_cnn_its_convolutions(zoo):
    out, warned = zoo
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line

    with MlnReader(out) as r:
        (device,) = r.manifest["variants"][0]["devices"]
    lines = {}
    for module in EXPECTED:
        module_sites = [s for s in device["kernels"] if s["module"] == module]
        lines[module] = coverage_line(module_sites, KERNELS_CUDA_ARCH)
    for module in ("llama_small", "qwen2_small", "bert_small"):
        assert "(100% of FLOPs)" in lines[module], lines[module]
        assert not any(f"module {module} " in w for w in warned)
    assert lines["gpt2_small"] == "kernels: 11 of 11 contractions (100% of FLOPs) on sm_90a kernels"
    # the 1000-class head (N % 16 != 0) is the one contraction left: 2% of the FLOPs on a
    # 64-pixel image (0.1% at 224 pixels)
    assert lines["timm_resnet50_small"].startswith("kernels: 17 of 18 contractions (98% of FLOPs)")
    # a build that leaves contractions to IREE's sm_80 codegen says which and why
    (resnet,) = [w for w in warned if "module timm_resnet50_small " in w]
    assert "matmul_transpose_b 2x1000x2048" in resnet and "conv" not in resnet
    # Whisper's 1-D convolutions are on the kernels too: every contraction, no warning
    assert "(100% of FLOPs)" in lines["whisper_encoder_small"], lines["whisper_encoder_small"]
    assert not any("module whisper_encoder_small " in w for w in warned), warned


def test_inspect_shows_each_models_coverage_line(zoo):
    from typer.testing import CliRunner

    from plex.cli import app

    shown = CliRunner().invoke(app, ["inspect", str(zoo[0])], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "kernels: " in shown.output and "on sm_90a kernels" in shown.output
    # the contractions left to IREE are listed: timm's 1000-class heads, and no convolution
    assert "N = 1000" in shown.output and "conv_" not in shown.output


def _load_zoo_models():
    import importlib.util

    use_torchvision_placeholder()
    spec = importlib.util.spec_from_file_location("gpu_zoo_models", ZOO / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", ["llama", "gpt2", "bert"])
def test_the_exported_normal_forms_compute_what_the_library_model_does(model):
    """The program the frontend exports (f16 addmm as mm + bias, masks evaluated and dropped
    or made causal) run by torch equals the library model in eager mode, in f32 (within the
    rounding of a different summation order)."""
    from myelin.frontends._torch_fixes import constant_attention_masks, decomposition_table

    module, inputs = getattr(_load_zoo_models(), f"{model}_small")()
    module = module.float()
    program = torch.export.export(module, (), inputs, strict=False)
    program = program.run_decompositions(decomposition_table())
    assert constant_attention_masks(program) == 2  # one per layer
    sdpa = [n for n in program.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert all(n.args[3:4] in ((), (None,)) for n in sdpa)
    with torch.no_grad():
        want = module(**inputs)[0]
        got = program.module()(**inputs)[0]
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < 1e-5, rel


# each transformer's feed-forward activation, as its library writes it (GPT-2's tanh GELU is
# eight elementwise ops; Llama's and Qwen2's SiLU is a sigmoid and a product)
ACTIVATIONS = {
    "llama_small": "silu", "qwen2_small": "silu", "gpt2_small": "gelu_tanh", "bert_small": "gelu",
    "vit_small": "gelu", "whisper_encoder_small": "gelu", "timm_vit_base_small": "gelu",
}  # fmt: skip


@pytest.mark.parametrize("module", list(ACTIVATIONS))
def test_each_layers_activation_is_applied_by_its_matmul_kernel_and_the_merges_reported(
    sites, module
):
    """Per layer: the feed-forward's activation in its first matmul's kernel. The residual adds
    (after attention's output projection and after the feed-forward) and Llama's and Qwen2's
    `act(gate) * up` are merges the kernels take where the kernel with the other tensor's tile
    fits a block's shared memory; these small models' 128x256 tiles do not (IREE refuses such
    a kernel only when the .mln loads), so each stays IREE's and its site says why (the decode
    tiles take them: tests/plex/test_kernels_torch_block.py)."""
    import re

    activation = ACTIVATIONS[module]
    kernels = [s["kernel"] or "" for s in sites[module]]
    applied = [k for k in kernels if re.search(f"_{activation}$", k)]
    assert len(applied) == 2, kernels  # one per layer
    merges = [s for s in sites[module] if "stays IREE's" in s["reason"]]
    expected = 6 if activation == "silu" else 4  # 2 adds a layer, and the gate's product
    assert len(merges) == expected, [s["reason"] for s in sites[module]]
    assert all("B of shared memory with it" in s["reason"] for s in merges), merges
