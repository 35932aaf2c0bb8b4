"""The example MLP built for CUDA (sm_80 PTX) matches its CPU build and numpy on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import REPO, artifact, assert_close_fp16

pytestmark = pytest.mark.gpu


def mlp_weights() -> dict[str, np.ndarray]:
    import sys

    sys.path.insert(0, str(REPO / "examples" / "placement"))
    from run import load_weights  # a safetensors reader that needs only numpy

    return load_weights(REPO / "examples" / "mlp" / "params.safetensors")


def test_mlp_on_cuda_matches_cpu_and_numpy(artifacts):
    import myelin

    mln = artifact(artifacts, "mlp.mln")
    instance = myelin.Instance()
    gpu = instance.load(mln, variant="cuda")
    cpu = instance.load(mln, variant="cpu")
    assert gpu.variant["devices"][0]["driver"] == "cuda"
    w = mlp_weights()
    rng = np.random.default_rng(0)
    with gpu.session() as g, cpu.session() as c:
        for batch in (1, 7, 256):
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            hidden = np.maximum(x @ w["w1"] + w["b1"], 0)
            for name, ref in (("hidden", hidden), ("forward", hidden @ w["w2"] + w["b2"])):
                on_gpu = g.call(name, x)
                assert_close_fp16(on_gpu, c.call(name, x), f"{name} batch {batch} vs CPU")
                assert_close_fp16(on_gpu, ref, f"{name} batch {batch} vs numpy")


def test_mlp_results_stay_on_the_gpu(artifacts):
    import iree.runtime as rt

    import myelin

    model = myelin.Instance().load(artifact(artifacts, "mlp.mln"), variant="cuda")
    x = np.ones((4, 16), np.float32)
    with model.session() as s:
        y = s.call("forward", x, output="device")
        assert y._device is model.devices[0]
        memory = int(y._buffer_view.get_buffer().memory_type())
        assert memory & int(rt.MemoryType.DEVICE_LOCAL)
        np.testing.assert_allclose(y.to_host(), s.call("forward", x), rtol=1e-6)
        del y
