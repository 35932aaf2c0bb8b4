"""examples/pipeline on CUDA: the variant fits the number of GPUs. On two GPUs the decoder runs
pipelined over cuda[0] and cuda[1] and every move between its stages is a peer copy; on one GPU
the runtime falls back to `one_gpu`, and asking for `two_gpus` is one clear error. Tokens are
compared with torch eager (CPU, float32)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from gpu_helpers import REPO, artifact, assert_close_fp16

pytestmark = pytest.mark.gpu

PROMPT = [1, 30, 4, 158, 27, 92]
STEPS = 8
STAGES = ("front.prefill", "front.decode", "back.prefill", "back.decode")


def pipeline_model():
    folder = REPO / "examples" / "pipeline"
    spec = importlib.util.spec_from_file_location("pipeline_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(folder))  # for the llama_model.py beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def gpu_count() -> int:
    import iree.runtime as rt

    return len(rt.get_driver("cuda").query_available_devices())


def test_the_variant_fits_the_number_of_gpus(artifacts):
    import myelin

    pipeline = pipeline_model()
    instance = myelin.Instance()
    model = instance.load(artifact(artifacts, "pipeline.mln"))
    expected = "two_gpus" if gpu_count() >= 2 else "one_gpu"
    assert model.variant_name == expected
    with model.session() as s:
        stages = [lambda *a, name=name: s.call(name, *a, output="device") for name in STAGES]
        ids, logits = pipeline.generate(*stages, PROMPT, STEPS)
    want_ids, want_logits = pipeline.generate(*pipeline.eager(), PROMPT, STEPS)
    for got, want in zip(logits, want_logits, strict=True):
        assert_close_fp16(got, want, "logits vs torch eager", rtol=1e-3)
    assert ids == want_ids
    kinds = instance.device_registry.transfers_by_kind()
    if expected == "two_gpus":  # the hidden states, gpu0 -> gpu1, once per call pair
        assert set(kinds) == {"peer"} and kinds["peer"].count == STEPS
    else:
        assert kinds == {}


def test_two_gpus_on_one_gpu_is_one_clear_error(artifacts):
    import myelin

    if gpu_count() >= 2:
        pytest.skip("this machine has two GPUs")
    with pytest.raises(myelin.DeviceUnavailable) as error:
        myelin.Instance().load(artifact(artifacts, "pipeline.mln"), variant="two_gpus")
    assert "needs 2 'cuda' devices (gpu0, gpu1) and this machine has 1" in str(error.value)
