"""Transfers at a module boundary: graph A's device output, passed to graph B placed on another
device, moves device to device with a HAL queue copy, never through numpy or a host staging
buffer. The example package `examples/placement` (embedding, MLP blocks, head), placed on two
CPU devices here; on the H200 the same package runs with the blocks on CUDA
(tests/gpu/test_cuda_placement.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import myelin
from plex.builder import build

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

APP = """\
[app]
name = "placement-cpu"
packages = ["{pkg}"]

[devices.cpu0]
target = "llvm-cpu"

[devices.cpu1]
target = "llvm-cpu"
driver = "{driver}"

[placement]
embed = "cpu0"
blocks = "cpu1"
head = "cpu0"
"""


def weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(EXAMPLES / "placement" / "params.safetensors"))


def embedding_rows(ids: np.ndarray) -> np.ndarray:
    return weights()["embed.table"][ids]


def reference(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hidden states after the blocks, logits), in numpy from the package's weights."""
    w = weights()
    h = w["embed.table"][ids]
    for i in range(2):
        h = h + np.maximum(h @ w[f"blocks.{i}.w1"] + w[f"blocks.{i}.b1"], 0) @ w[f"blocks.{i}.w2"]
    return h, h @ w["head.w"]


def build_placed(root: Path, driver: str) -> Path:
    (root / "app.toml").write_text(APP.format(pkg=EXAMPLES / "placement", driver=driver))
    return build(root / "app.toml", root / "placed.mln").output


@pytest.fixture(scope="module")
def two_local_task(tmp_path_factory) -> Path:
    return build_placed(tmp_path_factory.mktemp("two-local-task"), "local-task")


@pytest.fixture(scope="module")
def task_and_sync(tmp_path_factory) -> Path:
    """cpu1 on the local-sync driver: a HAL allocator of its own (the two local-task devices share
    their driver's), so allocator statistics show which device allocated what."""
    return build_placed(tmp_path_factory.mktemp("task-and-sync"), "local-sync")


IDS = np.array([3, 1, 4, 1, 5, 9, 2, 6, 255, 0], np.int64)


def test_chained_graphs_on_two_local_task_devices(two_local_task):
    instance = myelin.Instance()
    model = instance.load(two_local_task)
    assert {e["name"]: e["device"] for e in model.variant["entrypoints"]} == {
        "embed": "cpu0",
        "blocks": "cpu1",
        "head": "cpu0",
    }
    hidden, logits = reference(IDS)
    with model.session() as s:
        embedded = s.call("embed", IDS, output="device")
        blocks_out = s.call("blocks", embedded, output="device")
        assert embedded._device is model.hal_device("cpu0")
        assert blocks_out._device is model.hal_device("cpu1")
        np.testing.assert_allclose(s.call("head", blocks_out), logits, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(blocks_out.to_host(), hidden, rtol=1e-5, atol=1e-5)
        # The runtime never mapped the intermediate to the host: it went device to device.
        assert embedded._host_array is None
        moved = instance.device_registry.transfers[("local-task", "local-task", "queue-copy")]
        assert (moved.count, moved.bytes) == (2, 2 * IDS.size * 64 * 4)  # cpu0->cpu1->cpu0
        del embedded, blocks_out


def test_the_copy_is_allocated_by_the_target_device_only(task_and_sync):
    instance = myelin.Instance()
    model = instance.load(task_and_sync)
    cpu0, cpu1 = model.hal_device("cpu0"), model.hal_device("cpu1")
    with model.session() as s:
        embedded = s.call("embed", IDS, output="device")
        before = (cpu0.allocator.statistics, cpu1.allocator.statistics)
        moved = instance.device_registry.move(embedded, cpu1)
        after = (cpu0.allocator.statistics, cpu1.allocator.statistics)
        nbytes = IDS.size * 64 * 4
        # One device-local buffer of exactly the tensor's size on cpu1's allocator; nothing on
        # cpu0's, and no host staging memory on either.
        assert after[1]["device_bytes_allocated"] - before[1]["device_bytes_allocated"] == nbytes
        assert after[0]["device_bytes_allocated"] == before[0]["device_bytes_allocated"]
        for b, a in zip(before, after, strict=True):
            assert a["host_bytes_allocated"] == b["host_bytes_allocated"]
        assert moved._device is cpu1 and embedded._host_array is None
        assert instance.device_registry.transfers[
            ("local-task", "local-sync", "queue-copy")
        ].bytes == (nbytes)
        np.testing.assert_array_equal(moved.to_host(), embedding_rows(IDS))
        # The moved array feeds cpu1's graph without another copy.
        hidden = s.call("blocks", moved)
        np.testing.assert_allclose(hidden, reference(IDS)[0], rtol=1e-5, atol=1e-5)
        assert (
            instance.device_registry.transfers[("local-task", "local-sync", "queue-copy")].count
            == 1
        )
        del embedded, moved
