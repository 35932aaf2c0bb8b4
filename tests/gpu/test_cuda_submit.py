"""Submitted calls on CUDA (myelin.runtime.pending): a one-execution entrypoint's submissions
wait for nothing and still come back in order, each with its own call's results; a stream of
them through the tuned GEMV gives the synchronous call's result bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import artifact, assert_close_fp16

pytestmark = pytest.mark.gpu
GEMV_BUILD = "plex build benchmarks/gpu/tunekern_tuned/app.toml -o ART/tunekern_tuned.mln"


def test_mlp_submissions_on_cuda_match_the_cpu(artifacts):
    import myelin

    mln = artifact(artifacts, "mlp.mln")
    instance = myelin.Instance()
    gpu = instance.load(mln, variant="cuda")
    cpu = instance.load(mln, variant="cpu")
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((b, 16)).astype(np.float32) for b in (1, 7, 256, 3) * 8]
    with gpu.session() as g, cpu.session() as c:
        forward = g.resolve("forward")
        assert forward._unchained  # one queue execution: submitted without a wait
        pending = [forward.submit(x, output="numpy") for x in xs]
        for p, x in zip(pending, xs, strict=True):
            assert_close_fp16(p.result(), c.call("forward", x), f"batch {len(x)}")


def test_a_stream_of_gemv_submissions_equals_the_call(artifacts):
    import iree.runtime as rt

    import myelin

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((1, 8192)) * 0.1).astype(np.float16)
    w = (rng.standard_normal((28672, 8192)) * 0.1).astype(np.float16)
    model = myelin.Instance().load(artifact(artifacts, "tunekern_tuned.mln", GEMV_BUILD))
    with model.session(spin_us=200) as s:
        gemv = s.resolve("gemv_nk")
        xd = rt.asdevicearray(gemv._device, x)  # resident: uploaded once
        wd = rt.asdevicearray(gemv._device, w)
        want = np.asarray(gemv(xd, wd))
        pending = [gemv.submit(xd, wd) for _ in range(40)]
        for p in pending:
            np.testing.assert_array_equal(np.asarray(p.result().to_host()), want)
