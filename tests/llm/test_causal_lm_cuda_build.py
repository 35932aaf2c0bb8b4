"""A causal LM builds for a CUDA device (no GPU needed): its prefill and decode store the KV
cache in module state, which IREE 3.13 cannot compile inside a storage twin for CUDA, so they
get none (myelin.compiler.storage_twins)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("iree.turbine")

from myelin.mln import MlnReader
from myelin.signature import STORAGE_TWIN_SUFFIX
from tests.llm.builds import build_causal_lm

pytestmark = pytest.mark.slow


def test_a_causal_lm_builds_for_cuda_without_twins_for_its_stateful_entrypoints(tmp_path: Path):
    mln = build_causal_lm(
        tmp_path,
        max_seq=64,
        max_batch=2,
        app='[devices.gpu]\ntarget = "cuda"\narch = "sm_90a"\nkernels = "none"',
    )
    exported = vm_exports(mln, tmp_path)
    assert {"prefill", "decode"} <= exported
    assert not {n for n in exported if n.endswith(STORAGE_TWIN_SUFFIX)}


def test_a_static_prefill_length_puts_prefills_attention_on_the_flash_kernel(tmp_path: Path):
    """`prefill_lengths = [32]` exports `prefill_32`, whose attention has static shapes and
    torch's causal mask (the right-padded form): the flash kernel takes it. The dynamic
    `prefill` keeps IREE's attention, as before. Head dim 64: the kernel takes 64 and 128."""
    pytest.importorskip("triton")
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line

    mln = build_causal_lm(
        tmp_path,
        max_seq=64,
        max_batch=2,
        graph='dtype = "float16"\nprefill_lengths = [32]',
        app='[devices.gpu]\ntarget = "cuda"\narch = "sm_90a"\nkernels = "triton-attention"',
        config=dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1),
    )
    assert {"prefill", "prefill_32", "decode"} <= vm_exports(mln, tmp_path)
    with MlnReader(mln) as reader:
        variants = reader.manifest["variants"]
    sites = [s for v in variants for d in v["devices"] for s in d.get("kernels", [])]
    attention = {}
    for s in sites:
        if s["op"].startswith("attention"):
            attention.setdefault(s["function"], []).append(s)
    # matched (the output written token-major where its transpose back follows: no transpose)
    assert [s["reason"][:7] for s in attention["prefill_32"]] == ["matched", "matched"]
    assert all(
        s["kernel"].startswith("plex_attention_causal_f16_d64") for s in attention["prefill_32"]
    )
    assert (attention["prefill_32"][0]["m"], attention["prefill_32"][0]["k"]) == (32, 32)
    assert [s["reason"] for s in attention["prefill"]] == ["shapes must be static, rank 3"] * 2
    # before: 30 of 34 (prefill_32 adds its 15 matmuls and its 2 attentions, on kernels)
    assert "47 of 51 contractions" in coverage_line(sites, KERNELS_CUDA_ARCH)


def vm_exports(mln: Path, tmp_path: Path) -> set[str]:
    """The function names the .mln's compiled module exports, as iree-dump-module prints them."""
    import iree._runtime_libs as libs

    with MlnReader(mln) as reader:
        (module,) = [s for s in reader.manifest["sections"] if "/module/" in s["name"]]
        vmfb = tmp_path / "lm.vmfb"
        vmfb.write_bytes(bytes(reader.section_view(module["name"])))
    dump = Path(libs.__file__).parent / "iree-dump-module"
    text = subprocess.run([dump, vmfb], capture_output=True, text=True, check=True).stdout
    return {
        line.split("@", 1)[1].split(",")[0].split(" ")[0]
        for line in text.splitlines()
        if line.strip().startswith("vm.export @")
    }


def test_q4_weights_in_a_float16_graph_build_with_the_kernel_library(tmp_path: Path):
    """q4 weights in a float16 graph for Hopper with the kernels: decode steps' matmuls take
    the q4 kernel, and a prefill matmul whose weight the codec decodes inside the matmul's own
    dispatch stays IREE's, with that reason (a kernel call inside a dispatch region does not
    compile: it once failed the whole build)."""
    pytest.importorskip("triton")
    mln = build_causal_lm(
        tmp_path,
        max_seq=64,
        max_batch=2,
        graph='dtype = "float16"\nprefill_lengths = [32]',
        app='[weights.codec]\n"*" = "q4"\n\n'
        '[devices.gpu]\ntarget = "cuda"\narch = "sm_90a"\nkernels = "triton-attention"',
        config=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4),
    )
    with MlnReader(mln) as reader:
        variants = reader.manifest["variants"]
    sites = [s for v in variants for d in v["devices"] for s in d.get("kernels", [])]
    decode = [s for s in sites if s["function"] == "decode" and "matmul" in s["op"]]
    assert decode and all(s["reason"] == "matched q4" for s in decode)
    fused = [s for s in sites if "decodes its weight inside" in s["reason"]]
    assert fused and {s["function"] for s in fused} <= {"prefill", "prefill_32"}
