"""A decoder pipelined over two devices: examples/pipeline's first half of layers on one device,
its second half and head on another, the same way its app places them on two GPUs. Here the two
devices are two local-task CPU devices in one process (IREE 3.13's Python runtime creates them as
distinct HAL devices; local-task + local-sync works too, test_placement_transfers.py): the
two-device variant must decode exactly what the one-device variant of the same build decodes,
with only the hidden states crossing between the devices, counted by kind."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import myelin
from plex.builder import build

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"


def load_pipeline_model():
    """examples/pipeline/model.py under a name of its own (examples/llama has a model.py too)."""
    spec = importlib.util.spec_from_file_location("pipeline_model", PIPELINE / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(PIPELINE))  # for the llama_model.py beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(PIPELINE))
    return module


pipeline = load_pipeline_model()

APP = """\
[app]
name = "pipeline-cpu"
packages = ["{pkg}"]

[devices.cpu0]
target = "llvm-cpu"

[devices.cpu1]
target = "llvm-cpu"

[[variant]]
name = "two_cpus"
devices = ["cpu0", "cpu1"]

[[variant]]
name = "one_cpu"
devices = ["cpu0"]

[placement]
front = "cpu0"
back = "cpu1"
"""

PROMPT = [1, 30, 4, 158, 27, 92]
STEPS = 16
STAGES = ("front.prefill", "front.decode", "back.prefill", "back.decode")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pipeline-cpu")
    (root / "app.toml").write_text(APP.format(pkg=PIPELINE))
    return build(root / "app.toml", root / "pipeline.mln").output


def decode(instance: myelin.Instance, artifact: Path, variant: str):
    """(token ids, logits per step, the loaded model) of a greedy run with every result kept
    on its device (output="device"): caches and hidden states never visit numpy."""
    model = instance.load(artifact, variant=variant)
    with model.session() as s:
        stages = [lambda *a, name=name: s.call(name, *a, output="device") for name in STAGES]
        ids, logits = pipeline.generate(*stages, PROMPT, STEPS)
    return ids, logits, model


def test_two_devices_decode_what_one_device_decodes(artifact):
    two = myelin.Instance()
    ids, logits, model = decode(two, artifact, "two_cpus")
    assert {name: model.entrypoints[name].device for name in STAGES} == {
        "front.prefill": "cpu0",
        "front.decode": "cpu0",
        "back.prefill": "cpu1",
        "back.decode": "cpu1",
    }
    one = myelin.Instance()
    want_ids, want_logits, _ = decode(one, artifact, "one_cpu")
    assert ids == want_ids
    # Same compiled code on the same kind of device: the split changes no arithmetic. Tolerance
    # 1e-6 of the largest logit (measured: bitwise equal).
    for got, want in zip(logits, want_logits, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    # Both match the torch model the stages come from (f32, 1e-5 of the largest logit).
    eager_ids, eager_logits = pipeline.generate(*pipeline.eager(), PROMPT, STEPS)
    assert ids == eager_ids
    for got, want in zip(logits, eager_logits, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert one.device_registry.transfers == {}  # one device: nothing moved


def test_only_the_hidden_states_cross_between_the_devices(artifact):
    instance = myelin.Instance()
    _, _, model = decode(instance, artifact, "two_cpus")
    # Each stage's results (the hidden states, logits and KV caches) live on its own device.
    with model.session() as s:
        hidden, k0, _ = s.call("front.prefill", np.array([PROMPT]), output="device")
        logits, k1, _ = s.call("back.prefill", hidden, output="device")
        assert hidden._device is k0._device is model.hal_device("cpu0")
        assert logits._device is k1._device is model.hal_device("cpu1")
        del hidden, k0, logits, k1
    instance.device_registry.transfers.clear()
    decode(instance, artifact, "two_cpus")
    dim = pipeline.Config().dim
    # The prompt's hidden states once, then one position per decoded token; the KV caches stay
    # on their stage's device, and nothing comes back from cpu1 to cpu0.
    crossed = (len(PROMPT) + STEPS - 1) * dim * 4
    by_kind = instance.device_registry.transfers_by_kind()
    assert {k: (v.count, v.bytes) for k, v in by_kind.items()} == {"host": (STEPS, crossed)}
    moved = instance.device_registry.transfers[("local-task", "local-task", "queue-copy")]
    assert (moved.count, moved.bytes) == (STEPS, crossed)
