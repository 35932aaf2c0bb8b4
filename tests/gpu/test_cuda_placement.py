"""examples/placement on CPU + CUDA: embedding lookup and head on the CPU, MLP blocks on the GPU,
chained with device arrays that move device to device (never through numpy)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gpu_helpers import REPO, artifact, assert_close_fp16

pytestmark = pytest.mark.gpu


def test_cpu_and_cuda_placement_runs_correctly(artifacts):
    import myelin

    sys.path.insert(0, str(REPO / "examples" / "placement"))
    from run import reference

    instance = myelin.Instance()
    model = instance.load(artifact(artifacts, "placement.mln"))
    assert model.variant_name == "hybrid"
    devices = {e["name"]: e["device"] for e in model.variant["entrypoints"]}
    assert devices == {"embed": "cpu", "blocks": "gpu", "head": "cpu"}
    ids = np.arange(0, 256, 5, dtype=np.int64)
    with model.session() as s:
        embedded = s.call("embed", ids, output="device")
        hidden = s.call("blocks", embedded, output="device")
        assert embedded._device is model.hal_device("cpu")
        assert hidden._device is model.hal_device("gpu")
        logits = s.call("head", hidden)
        assert embedded._host_array is None  # never mapped to the host by the runtime
        del embedded, hidden
    assert_close_fp16(logits, reference(ids), "logits vs numpy", rtol=1e-3)
    transfers = instance.device_registry.transfers
    nbytes = ids.size * 64 * 4
    assert transfers[("local-task", "cuda", "host-to-device")].bytes == nbytes
    assert transfers[("cuda", "local-task", "device-to-host-visible")].bytes == nbytes
