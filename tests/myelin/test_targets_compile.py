"""Every compiler target PLeX offers compiles the example MLP here (compile-only: this machine has
no GPU). What ran where is recorded in docs/platforms.md."""

from __future__ import annotations

from pathlib import Path

import iree.runtime as rt
import numpy as np
import pytest

import myelin
from myelin.compiler.pipeline import ImportedGraph, compile_imported, import_graph
from myelin.compiler.targets import TargetDevice, target_flags
from myelin.errors import CompileError
from plex.builder import build
from tests.models import mlp_reference

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp" / "mlp.mlir"

# target device -> the executable format IREE embeds in the VM module for it
TARGETS = {
    "llvm-cpu host": (TargetDevice("d", "llvm-cpu", cpu="host"), b"embedded-elf-"),
    "llvm-cpu generic": (TargetDevice("d", "llvm-cpu", cpu="generic"), b"embedded-elf-"),
    "llvm-cpu features": (
        TargetDevice("d", "llvm-cpu", cpu="generic", cpu_features="+avx2,+fma"),
        b"embedded-elf-",
    ),
    "vmvx": (TargetDevice("d", "vmvx"), b"vmvx-bytecode-fb"),
    "cuda default (sm_80)": (TargetDevice("d", "cuda"), b"cuda-nvptx-fb"),
    "cuda sm_89": (TargetDevice("d", "cuda", arch="sm_89"), b"cuda-nvptx-fb"),
    "vulkan-spirv": (TargetDevice("d", "vulkan-spirv"), b"vulkan-spirv-fb"),
    "rocm gfx942": (TargetDevice("d", "rocm", arch="gfx942"), b"rocm-hsaco-fb"),
    "metal-spirv": (TargetDevice("d", "metal-spirv"), b"metal-msl-fb"),
}


@pytest.fixture(scope="module")
def imported_mlp() -> ImportedGraph:
    return import_graph(MLP, input_type="auto", module_name="mlp", scope="mlp.mlp")


@pytest.mark.parametrize("name", TARGETS)
def test_target_compiles_the_example_mlp(imported_mlp, name):
    device, executable_format = TARGETS[name]
    compiled = compile_imported(imported_mlp.module_bytecode, phase="input", devices=[device])
    assert executable_format in compiled.vmfb
    assert set(compiled.signatures) == {"hidden", "forward"}
    assert str(compiled.signatures["forward"].describe()) == (
        "(input0: float32[input0.0, 16]) -> (output0: float32[output0.0, 8])"
    )
    # The VM bytecode loads without the device (a CPU-only machine can inspect a CUDA .mln).
    module = rt.VmModule.copy_buffer(rt.VmInstance(), compiled.vmfb)
    assert module.name == "mlp"


def test_cuda_defaults_to_sm_80_and_arch_is_settable():
    assert "--iree-cuda-target=sm_80" in target_flags([TargetDevice("gpu", "cuda")])
    assert "--iree-cuda-target=sm_86" in target_flags([TargetDevice("gpu", "cuda", arch="sm_86")])


def test_sm_90_is_refused_with_the_fix():
    # IREE 3.13's CUDA table has no sm_90: the compiler would fail deep in codegen.
    with pytest.raises(CompileError, match=r'arch sm_90 .*use arch = "sm_80"'):
        target_flags([TargetDevice("gpu", "cuda", arch="sm_90")])


def test_rocm_needs_a_chip():
    with pytest.raises(CompileError, match="rocm target needs arch"):
        target_flags([TargetDevice("gpu", "rocm")])
    assert "--iree-rocm-target=gfx942" in target_flags([TargetDevice("g", "rocm", arch="gfx942")])


def test_several_devices_are_named_with_one_ordinal_per_kind():
    flags = target_flags(
        [TargetDevice("cpu"), TargetDevice("gpu", "cuda"), TargetDevice("cpu2", cpu="host")]
    )
    assert flags[:3] == [
        "--iree-hal-target-device=cpu=local[0]",
        "--iree-hal-target-device=gpu=cuda[0]",
        "--iree-hal-target-device=cpu2=local[1]",
    ]
    assert "--iree-cuda-target=sm_80" in flags


def test_vmvx_runs_on_local_task(tmp_path, mlp_weights):
    """vmvx (IREE's portable VM-interpreted target) is also executed here, not only compiled."""
    (tmp_path / "app.toml").write_text(
        f'[app]\nname = "vmvx"\npackages = ["{MLP.parent}"]\n\n[devices.cpu]\ntarget = "vmvx"\n'
    )
    model = myelin.Instance().load(build(tmp_path / "app.toml", tmp_path / "vmvx.mln").output)
    assert model.variant["devices"][0]["target"] == "vmvx"
    x = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    with model.session() as s:
        np.testing.assert_allclose(
            s.call("forward", x), mlp_reference(mlp_weights, x)[1], rtol=1e-5, atol=1e-5
        )
