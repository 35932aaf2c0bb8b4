"""The Llama-style decoders on the GPU.

- examples/llama (when present), built small for CUDA and CPU in one .mln: prefill and one decode
  step on the GPU match the CPU variant (float32 weights; float16-level tolerance).
- the benchmark's float16 decoder (benchmarks/gpu/decoder): PLeX on CUDA matches torch eager on
  the same GPU with the same weights (read back from the .mln).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import REPO, artifact, assert_close_fp16

pytestmark = pytest.mark.gpu


def inputs_for(signature, rng: np.random.Generator, prompt: int = 16) -> list[np.ndarray]:
    """Inputs matching a signature: token ids in [0, 32), dynamic dims of size `prompt`."""
    out = []
    for spec in signature.inputs:
        shape = tuple(prompt if d is None else d for d in spec.shape or ())
        if spec.dtype.startswith("int"):
            out.append(rng.integers(0, 32, shape).astype(spec.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(spec.dtype))
    return out


@pytest.mark.skipif(not (REPO / "examples" / "llama").is_dir(), reason="no examples/llama")
def test_example_llama_on_cuda_matches_cpu(artifacts):
    import myelin

    mln = artifact(artifacts, "llama.mln")
    instance = myelin.Instance()
    gpu = instance.load(mln, variant="cuda")
    cpu = instance.load(mln, variant="cpu")
    rng = np.random.default_rng(0)
    with gpu.session() as g, cpu.session() as c:
        tokens = inputs_for(gpu.entrypoint("prefill").signature, rng)
        on_gpu, on_cpu = g.call("prefill", *tokens), c.call("prefill", *tokens)
        for i, (a, b) in enumerate(zip(on_gpu, on_cpu, strict=True)):
            assert_close_fp16(a, b, f"prefill output {i}")
        prompt = tokens[0].shape[1]
        token = np.argmax(on_cpu[0], axis=-1).astype(np.int64).reshape(-1, 1)
        step = (token, np.array([prompt], np.int64), on_cpu[1], on_cpu[2])
        for i, (a, b) in enumerate(
            zip(g.call("decode", *step), c.call("decode", *step), strict=True)
        ):
            assert_close_fp16(a, b, f"decode output {i}")


def test_benchmark_decoder_on_cuda_matches_torch(artifacts):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    import sys

    import myelin

    sys.path.insert(0, str(REPO / "benchmarks" / "probes" / "gpu"))
    from decoder_h200 import load_torch_decoder

    mln = artifact(artifacts, "decoder.mln")
    model = myelin.Instance().load(mln)
    reference, config = load_torch_decoder(mln, device="cuda")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab, (config.batch, config.prompt)).astype(np.int64)
    with model.session() as s, torch.inference_mode():
        logits, k, v = s.call("prefill", tokens)
        want = reference.prefill(torch.from_numpy(tokens).cuda())
        for name, got, ref in zip(
            ("logits", "k_cache", "v_cache"), (logits, k, v), want, strict=True
        ):
            assert_close_fp16(got, ref.float().cpu().numpy(), f"prefill {name}")
        token = np.argmax(logits, axis=-1).astype(np.int64).reshape(-1, 1)
        pos = np.array([config.prompt], np.int64)
        got = s.call("decode", token, pos, k, v)
        want = reference.decode(*(torch.from_numpy(a).cuda() for a in (token, pos, k, v)))
        assert_close_fp16(got[0], want[0].float().cpu().numpy(), "decode logits")
