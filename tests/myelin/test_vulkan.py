"""Models built for `target = "vulkan-spirv"` and run by MyeLiN on the `vulkan` driver, against
the same models built for the CPU. CI runs them on Mesa's software Vulkan device, lavapipe
(tools/install_vulkan.sh installs it); on the NVIDIA GPU the same models ran through its Vulkan
driver (benchmarks/gpu/vulkan_models.py, docs/platforms.md).

Tolerances: Vulkan and the CPU both compute in f32 but order their sums differently (SPIR-V
workgroup reductions against the CPU's tiles): results agree within rtol 1e-4, atol 1e-5 (seen:
at most 2e-6 on values up to 3).
"""

from __future__ import annotations

from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest

import myelin
from myelin.errors import MemoryBudgetExceeded, MyelinError
from myelin.runtime.profiling import capture
from plex.builder import build
from plex.errors import BuildWarning
from tests.myelin.test_placement_transfers import IDS, reference


def _vulkan_devices() -> str:
    """Why no Vulkan device can run here, or "" when one can."""
    try:
        found = rt.get_driver("vulkan").query_available_devices()
    except Exception as e:  # no loader or no driver manifest: IREE cannot create an instance
        return f"no Vulkan driver ({str(e).splitlines()[0]})"
    return "" if found else "the Vulkan loader finds no device"


_WHY_NOT = _vulkan_devices()
pytestmark = pytest.mark.skipif(
    bool(_WHY_NOT), reason=f"{_WHY_NOT}; run tools/install_vulkan.sh (Debian/Ubuntu: lavapipe)"
)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RTOL, ATOL = 1e-4, 1e-5

# A Vulkan variant and a CPU one of the same packages: one import, two compiles.
TWO_VARIANTS = """\
[app]
name = "{name}"
packages = ["{package}"]

[devices.gpu]
target = "vulkan-spirv"
driver = "vulkan"

[devices.cpu]
target = "llvm-cpu"
cpu = "generic"

[[variant]]
name = "vulkan"
devices = ["gpu"]

[[variant]]
name = "cpu"
devices = ["cpu"]
"""

# Small transformers from their configs, eager attention: IREE 3.13's SPIR-V pipeline cannot
# lower the fused attention op that torch's SDPA becomes (docs/platforms.md).
TRANSFORMERS = """\
import torch
from transformers import BertConfig, BertModel, ViTConfig, ViTModel


class Hidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args).last_hidden_state


def bert():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, attn_implementation="eager",
    )
    ids = torch.randint(0, 128, (2, 8))
    return Hidden(BertModel(config, add_pooling_layer=False).eval()), (ids, torch.ones_like(ids))


def vit():
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, attn_implementation="eager",
    )
    return Hidden(ViTModel(config, add_pooling_layer=False).eval()), (torch.randn(2, 3, 32, 32),)
"""

PACKAGE = """\
[package]
name = "tiny"

[graph.bert]
source = "model.py:bert"
frontend = "torch"

[graph.vit]
source = "model.py:vit"
frontend = "torch"
"""


def _two_variants(root: Path, name: str, package: Path) -> Path:
    (root / "app.toml").write_text(TWO_VARIANTS.format(name=name, package=package))
    return build(root / "app.toml", root / f"{name}.mln").output


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return _two_variants(tmp_path_factory.mktemp("vk-mlp"), "mlp", EXAMPLES / "mlp")


@pytest.fixture(scope="module")
def transformers_mln(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vk-tiny")
    (root / "tiny").mkdir()
    (root / "tiny" / "model.py").write_text(TRANSFORMERS)
    (root / "tiny" / "plex.toml").write_text(PACKAGE)
    return _two_variants(root, "tiny", root / "tiny")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    """examples/minilm as it is (SDPA, dynamic batch and sequence): on Vulkan its attentions
    become two matmuls and a softmax (myelin.compiler.cpu_attention), which SPIR-V lowers."""
    pytest.importorskip("transformers")
    return _two_variants(tmp_path_factory.mktemp("vk-minilm"), "minilm", EXAMPLES / "minilm")


def _both(path: Path, function: str, *args: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Vulkan result, CPU result) of one call."""
    instance = myelin.Instance()
    with (
        instance.load(path, variant="vulkan").session() as vk,
        instance.load(path, variant="cpu").session() as cpu,
    ):
        return vk.call(function, *args), cpu.call(function, *args)


def test_the_example_mlp_runs_on_vulkan_as_on_the_cpu(mlp):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    on_vulkan, on_cpu = _both(mlp, "forward", x)
    assert on_vulkan.dtype == np.float32 and on_vulkan.shape == (3, 8)
    np.testing.assert_allclose(on_vulkan, on_cpu, rtol=RTOL, atol=ATOL)


def test_the_minilm_example_runs_on_vulkan_as_on_the_cpu(minilm):
    rng = np.random.default_rng(0)
    for batch, seq in ((2, 12), (1, 7)):  # dynamic dims: two shapes, one artifact
        ids = rng.integers(0, 30000, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[-1, seq - 3 :] = 0  # padding in the last sentence
        vk, cpu = _both(minilm, "forward", ids, mask)
        np.testing.assert_allclose(vk, cpu, rtol=RTOL, atol=ATOL)


def test_device_results_stay_on_vulkan_and_read_through_a_staging_copy(mlp):
    """IREE allocates Vulkan results without host mapping (TRANSFER|DISPATCH_STORAGE, even in
    lavapipe's host memory): `to_host`, numpy and DLPack read them through a staging buffer.
    DLPack exports a host copy: no framework imports Vulkan memory."""
    torch = pytest.importorskip("torch")
    x = np.full((2, 16), 0.5, np.float32)
    model = myelin.Instance().load(mlp, variant="vulkan")
    with model.session() as s:
        expected = s.call("forward", x)
        y = s.call("forward", x, output="device")
        assert y._device is model.hal_device("gpu")
        assert not y._buffer_view.get_buffer().allowed_usage() & int(rt.BufferUsage.MAPPING)
        np.testing.assert_array_equal(y.to_host(), expected)
        np.testing.assert_array_equal(np.asarray(y), expected)
        assert y.__dlpack_device__() == (1, 0)  # kDLCPU: the copy
        np.testing.assert_array_equal(torch.from_dlpack(y).numpy(), expected)
        # A device result feeds the next call on the device without a round trip.
        hidden = s.call("hidden", x, output="device")
        assert hidden._host_array is None


def test_bert_and_vit_run_on_vulkan_as_on_the_cpu(transformers_mln):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 128, (2, 8))
    on_vulkan, on_cpu = _both(transformers_mln, "bert.forward", ids, np.ones_like(ids))
    assert on_vulkan.shape == (2, 8, 32)
    np.testing.assert_allclose(on_vulkan, on_cpu, rtol=RTOL, atol=ATOL)
    images = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    on_vulkan, on_cpu = _both(transformers_mln, "vit.forward", images)
    assert on_vulkan.shape == (2, 17, 32)
    np.testing.assert_allclose(on_vulkan, on_cpu, rtol=RTOL, atol=ATOL)


def test_many_loads_keep_the_vulkan_device(transformers_mln):
    """Each load runs the module's initializer, which reads the parameters onto the device.
    IREE 3.13's Vulkan driver reads memory it cannot import through host-side staging, whose
    completions can make it signal a semaphore out of order, and lavapipe then reports the
    device lost for good: before MyeLiN wrapped the parameters in whole pages, within 1-43
    loads here (myelin.runtime.parameter_memory.parameter_pages)."""
    images = np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)
    for _ in range(40):
        with myelin.Instance().load(transformers_mln, variant="vulkan").session() as s:
            assert s.call("vit.forward", images).shape == (2, 17, 32)


PLACED_ONE_DEVICE = """\
[app]
name = "placement-{name}"
packages = ["{pkg}"]

[devices.{name}]
target = "{target}"
"""


@pytest.fixture(scope="module")
def placement_parts(tmp_path_factory) -> tuple[Path, Path]:
    """examples/placement built for the CPU and for Vulkan, as two artifacts."""
    built = []
    for name, target in (("cpu", "llvm-cpu"), ("gpu", "vulkan-spirv")):
        root = tmp_path_factory.mktemp(f"placed-{name}")
        app = PLACED_ONE_DEVICE.format(name=name, target=target, pkg=EXAMPLES / "placement")
        (root / "app.toml").write_text(app)
        built.append(build(root / "app.toml", root / f"{name}.mln").output)
    return built[0], built[1]


def test_placement_across_cpu_and_vulkan_moves_device_to_device(placement_parts):
    """The embedding and head on the CPU, the blocks on Vulkan: the embedding's device result
    is uploaded to Vulkan once, the blocks' result copied into host-visible Vulkan memory that
    the CPU reads in place; neither passes through numpy."""
    cpu_mln, gpu_mln = placement_parts
    instance = myelin.Instance()
    hidden, logits = reference(IDS)
    with (
        instance.load(cpu_mln).session() as cpu,
        instance.load(gpu_mln).session() as gpu,
    ):
        embedded = cpu.call("embed", IDS, output="device")
        blocks_out = gpu.call("blocks", embedded, output="device")
        np.testing.assert_allclose(cpu.call("head", blocks_out), logits, rtol=RTOL, atol=1e-4)
        np.testing.assert_allclose(blocks_out.to_host(), hidden, rtol=RTOL, atol=ATOL)
        assert embedded._host_array is None
        nbytes = IDS.size * 64 * 4
        moves = instance.device_registry.transfers
        up = moves[("local-task", "vulkan", "host-to-device")]
        down = moves[("vulkan", "local-task", "device-to-host-visible")]
        assert (up.count, up.bytes, down.count, down.bytes) == (1, nbytes, 1, nbytes)


def test_one_variant_on_cpu_and_vulkan_is_refused_with_the_reason(tmp_path):
    """IREE 3.13 cannot group a Vulkan device with another (its device group fails: "Vulkan
    queue frontier already assigned"): the load says so and how to place instead."""
    (tmp_path / "app.toml").write_text(
        PLACED_ONE_DEVICE.format(name="cpu", target="llvm-cpu", pkg=EXAMPLES / "placement")
        + '\n[devices.gpu]\ntarget = "vulkan-spirv"\n\n[placement]\nblocks = "gpu"\n'
    )
    placed = build(tmp_path / "app.toml", tmp_path / "placed.mln").output
    with pytest.raises(MyelinError, match=r"cannot run a 'vulkan' device beside other devices"):
        myelin.Instance().load(placed)


def test_an_int8_weight_stays_fp32_on_vulkan_with_a_build_note(tmp_path):
    """Vulkan's baseline target (no arch) cannot decode int8 in IREE 3.13: the build keeps the
    weights fp32 and says why, and the model runs as the fp32 build does."""
    app = TWO_VARIANTS.format(name="mlp-int8", package=EXAMPLES / "mlp")
    (tmp_path / "app.toml").write_text(
        app + '\n[weights.codec]\n"mlp::w1" = "int8"\n"mlp::w2" = "int8"\n'
    )
    with pytest.warns(BuildWarning, match=r"int8 not applied to 2 parameter\(s\) .*vulkan-spirv"):
        built = build(tmp_path / "app.toml", tmp_path / "m.mln").output
    model = myelin.Instance().load(built, variant="vulkan")
    kept = {p["key"]: p for p in model.manifest["parameters"] if p["key"] in ("w1", "w2")}
    for record in kept.values():  # stored as they were, the reason recorded beside them
        assert record["codec"] == "none" and record["dtype"] == "float32"
        assert record["rule"].startswith("kept fp32: int8: IREE 3.13 cannot compile its decode")
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    on_vulkan, on_cpu = _both(built, "forward", x)
    np.testing.assert_allclose(on_vulkan, on_cpu, rtol=RTOL, atol=ATOL)


def test_a_vulkan_call_profiles_with_device_timestamps(mlp, tmp_path):
    """IREE's Vulkan driver records dispatch timestamps and queue-ordered memory, not host
    execution: the capture asks only for what it records."""
    x = np.full((64, 16), 0.5, np.float32)
    captured = capture(mlp, "forward", [x], tmp_path, variant="vulkan", device_timing=True)
    assert captured.dispatches and {d.timing for d in captured.dispatches} == {"device"}
    assert all(d.total_ns > 0 for d in captured.dispatches)
    assert captured.memory_high_water


def test_a_q4_weight_is_stored_fp16_for_a_named_vulkan_target(tmp_path):
    """With arch (here "ampere", the NVIDIA path) IREE 3.13 does not finish compiling q4's
    decode: the build stores the weight fp16 instead and says so. Built only: code for a named
    arch assumes its GPU's subgroup size, which lavapipe does not have."""
    (tmp_path / "app.toml").write_text(
        f'[app]\nname = "mlp-q4"\npackages = ["{EXAMPLES / "mlp"}"]\n\n'
        '[devices.gpu]\ntarget = "vulkan-spirv"\narch = "ampere"\n\n'
        '[weights.codec]\n"mlp::w1" = "q4"\n'
    )
    with pytest.warns(BuildWarning, match=r"q4 not applied to 1 parameter\(s\) \(mlp::w1\).*fp16"):
        built = build(tmp_path / "app.toml", tmp_path / "m.mln").output
    parts = [p for p in myelin.Instance().load(built).manifest["parameters"] if p["key"] == "w1"]
    assert [(p["codec"], p["storage"]["dtype"]) for p in parts] == [("fp16", "float16")]


def test_memory_admission_refuses_a_vulkan_call_over_the_budget(mlp):
    """The budget works from the build's memory plan, on Vulkan as on the CPU."""
    model = myelin.Instance().load(mlp, variant="vulkan", memory_budget="256KiB")
    with model.session() as s:
        with pytest.raises(MemoryBudgetExceeded, match=r"^forward: needs 437\.5 KiB"):
            s.call("forward", np.ones((2000, 16), np.float32))
        assert model.budget.peak_in_flight == 0
        x = np.random.default_rng(3).standard_normal((100, 16)).astype(np.float32)
        assert s.call("forward", x).shape == (100, 8)
        assert model.budget.peak_in_flight > 0
    assert model.budget.in_flight == 0
