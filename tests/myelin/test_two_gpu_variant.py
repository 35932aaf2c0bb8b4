"""examples/pipeline's app: its decoder pipelined over two CUDA devices (`two_gpus`: layers 0-1
on gpu0 = cuda[0], layers 2-3 and the head on gpu1 = cuda[1]), with `one_gpu` and `cpu` variants
to fall back to. This machine has no GPU, so the CUDA code is compiled (sm_80 PTX) and checked in
IREE's own IR, and the runtime's choice of variant is checked on the built artifact; the run on
two GPUs is benchmarks/probes/gpu/multigpu_h200x2.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import myelin
from myelin.compiler.pipeline import compile_module, import_graph
from myelin.compiler.targets import TargetDevice
from myelin.errors import DeviceUnavailable
from myelin.mln import DeviceRecord, MlnReader
from myelin.runtime.devices import DeviceRegistry
from myelin.runtime.model import choose_variant
from plex.builder import build
from tests.myelin.test_pipeline_placement import PIPELINE, STAGES, pipeline

EXAMPLES = PIPELINE.parent
TWO_GPUS = [TargetDevice("gpu0", target="cuda"), TargetDevice("gpu1", target="cuda")]
_CUDA_TARGET = re.compile(r'#hal\.device\.target<"cuda", \{ordinal = (\d) : index\}')
_EXECUTE_ON = re.compile(r"stream\.cmd\.execute on\(#hal\.device\.affinity<@(\w+)>\)")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the .mln of examples/pipeline/app.toml, the folder with every module's IR per phase)."""
    root = tmp_path_factory.mktemp("pipeline-gpu")
    result = build(
        EXAMPLES / "pipeline" / "app.toml", root / "pipeline.mln", dump_phases=root / "phases"
    )
    return result.output, root / "phases"


def stream_ir(phases: Path, module: str, variant: str) -> str:
    return (phases / module / variant / "07.stream.mlir").read_text()


def test_the_two_gpu_variant_compiles_for_cuda_0_and_cuda_1(built):
    mln, phases = built
    variant = MlnReader(mln).artifact_manifest.variant("two_gpus")
    assert [(d.name, d.driver) for d in variant.devices] == [("gpu0", "cuda"), ("gpu1", "cuda")]
    assert "--iree-hal-target-device=gpu0=cuda[0]" in variant.flags
    assert "--iree-hal-target-device=gpu1=cuda[1]" in variant.flags
    assert {e.name: variant.device_of(e).name for e in variant.entrypoints} == {
        "front.prefill": "gpu0",
        "front.decode": "gpu0",
        "back.prefill": "gpu1",
        "back.decode": "gpu1",
    }
    # In IREE's Stream IR: `back`'s module declares both CUDA devices (gpu0 is the module's
    # default) and runs every command buffer on gpu1; `front` runs all of its work on gpu0.
    back, front = stream_ir(phases, "back", "two_gpus"), stream_ir(phases, "front", "two_gpus")
    assert sorted(set(_CUDA_TARGET.findall(back))) == ["0", "1"]
    assert "util.global private @gpu1 = #device_target_cuda_1_" in back
    assert set(_EXECUTE_ON.findall(back)) == {"gpu1"}
    assert set(_EXECUTE_ON.findall(front)) == {"gpu0"}
    # The one-GPU variant runs both stages on its one (unnamed) CUDA device.
    one = stream_ir(phases, "back", "one_gpu")
    assert one.count('= #hal.device.target<"cuda"') == 1 and not _CUDA_TARGET.findall(one)
    assert set(_EXECUTE_ON.findall(one)) == {"__device_0"}


def test_stream_moves_data_between_the_two_cuda_devices_inside_a_module():
    """Inside one module the transfer is IREE's: examples/mlp with `hidden` placed on gpu0 and
    `forward` (which calls it) on gpu1, compiled for two CUDA devices."""
    imported = import_graph(
        EXAMPLES / "mlp" / "mlp.mlir", input_type="auto", module_name="mlp", scope="mlp.mlp"
    )
    texts: dict[str, str] = {}
    compile_module(
        imported.module_bytecode,
        phase="input",
        devices=TWO_GPUS,
        placement=[("hidden", "gpu0"), ("forward", "gpu1")],
        stop_at="stream",
        on_phase=lambda phase, text: texts.__setitem__(phase, text),
    )
    stream = texts["stream"]
    assert sorted(set(_CUDA_TARGET.findall(stream))) == ["0", "1"]
    forward = stream.split("util.func public @forward")[1].split("util.func public")[0]
    # gpu0 computes the hidden layer into a buffer allocated for both devices and flushes it to
    # gpu1, whose command buffer then reads it.
    shared = "on(#hal.device.optimal<[#hal.device.affinity<@gpu0>, #hal.device.affinity<@gpu1>]>)"
    assert f"stream.resource.alloca uninitialized {shared}" in forward
    assert "stream.cmd.flush to(#hal.device.affinity<@gpu1>)" in forward
    assert _EXECUTE_ON.findall(forward) == ["gpu0", "gpu1"]


def cuda_usable() -> bool:
    return "cuda" in myelin.Instance().drivers()


@pytest.mark.skipif(cuda_usable(), reason="checks the fallback on a machine without a GPU")
def test_without_a_gpu_the_cpu_variant_runs_and_two_gpus_is_refused(built):
    mln, _ = built
    instance = myelin.Instance()
    model = instance.load(mln)
    assert model.variant_name == "cpu"
    with model.session() as s:
        stages = [lambda *a, name=name: s.call(name, *a) for name in STAGES]
        ids, logits = pipeline.generate(*stages, [1, 30, 4, 158], 4)
    want_ids, want_logits = pipeline.generate(*pipeline.eager(), [1, 30, 4, 158], 4)
    assert ids == want_ids
    np.testing.assert_allclose(
        logits[-1], want_logits[-1], atol=1e-5 * np.abs(want_logits[-1]).max()
    )
    with pytest.raises(
        DeviceUnavailable,
        match=r"variant 'two_gpus' cannot run here: device "
        r"'gpu0': driver 'cuda' cannot start here",
    ):
        instance.load(mln, variant="two_gpus")


class OneGpuMachine(DeviceRegistry):
    """This machine's registry, except that its CUDA driver offers one GPU. The build machine has
    no GPU at all, so the case of fewer GPUs than a variant needs is set up here; everything else
    (the artifact's records, the variant choice, the message) is the runtime's own."""

    def why_unusable(self, requirement: DeviceRecord) -> str | None:
        return None if requirement.driver == "cuda" else super().why_unusable(requirement)

    def device_count(self, driver: str) -> int | None:
        return 1 if driver == "cuda" else super().device_count(driver)


def test_on_one_gpu_the_one_gpu_variant_is_chosen(built):
    mln, _ = built
    manifest = MlnReader(mln).artifact_manifest
    assert choose_variant(manifest, OneGpuMachine(), None, mln).name == "one_gpu"


def test_asking_for_two_gpus_on_one_is_one_clear_error(built):
    mln, _ = built
    manifest = MlnReader(mln).artifact_manifest
    with pytest.raises(DeviceUnavailable) as error:
        choose_variant(manifest, OneGpuMachine(), "two_gpus", mln)
    message = str(error.value)
    assert "\n" not in message
    assert (
        "pipeline.mln: variant 'two_gpus' cannot run here: it needs 2 'cuda' devices (gpu0, "
        "gpu1) and this machine has 1; use a variant with fewer devices, or a machine with 2"
    ) in message


def test_host_drivers_make_as_many_devices_as_a_variant_lists():
    records = [
        DeviceRecord(name=f"cpu{i}", target="llvm-cpu", driver="local-task") for i in range(3)
    ]
    assert DeviceRegistry().why_too_few(records) is None


def test_two_cuda_devices_with_different_archs_are_refused():
    from myelin.compiler.targets import target_flags
    from myelin.errors import CompileError

    assert "--iree-cuda-target=sm_80" in target_flags(TWO_GPUS)
    mixed = [TargetDevice("gpu0", target="cuda"), TargetDevice("gpu1", target="cuda", arch="sm_89")]
    with pytest.raises(CompileError, match=r"one arch .* got 'gpu0' sm_80, 'gpu1' sm_89"):
        target_flags(mixed)
