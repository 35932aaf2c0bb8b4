"""What a CUDA call does per call, read from the VM IR of PLeX's own compile (no GPU needed).

IREE's default flags (`--iree-hal-indirect-command-buffers`, `--iree-hal-memoization`, both on
in 3.13) record the command buffer of an entrypoint with static shapes once, when the module
initializes, and replay it per call with `hal.device.queue.execute.indirect` and the call's
buffers as its binding table. An entrypoint whose dispatch grid depends on a dynamic dimension
records a fresh one each call. docs/runtime.md ("Overhead") says what this costs on the H200;
these tests pin the structure so that a flag change that loses the reuse shows here.
"""

from __future__ import annotations

import re

import pytest

from myelin.compiler.options import variant_flags
from myelin.compiler.pipeline import compile_module, import_graph
from myelin.compiler.targets import TargetDevice

SOURCE = b"""
func.func @static(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %e = tensor.empty() : tensor<64x64xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x64xf32>) -> tensor<64x64xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>)
      outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  %r2 = linalg.matmul ins(%r, %b : tensor<64x64xf32>, tensor<64x64xf32>)
      outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r2 : tensor<64x64xf32>
}

func.func @dynamic(%a: tensor<?x64xf32>, %b: tensor<64x64xf32>) -> tensor<?x64xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%m) : tensor<?x64xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x64xf32>) -> tensor<?x64xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x64xf32>, tensor<64x64xf32>)
      outs(%f : tensor<?x64xf32>) -> tensor<?x64xf32>
  return %r : tensor<?x64xf32>
}
"""

CUDA = TargetDevice("gpu", "cuda")


@pytest.fixture(scope="module")
def vm_ir() -> str:
    """The VM IR of SOURCE compiled as a cancellable (async-external) CUDA variant."""
    graph = import_graph(SOURCE, input_type="auto", module_name="m", scope="m.m")
    texts: dict[str, str] = {}
    compile_module(
        graph.module_bytecode,
        phase=graph.phase,
        devices=[CUDA],
        cancellable=True,
        stop_at="vm",
        on_phase=lambda phase, text: texts.__setitem__(phase, text),
    )
    return texts["vm"]


def body(vm_ir: str, name: str) -> str:
    """The text of `vm.func ... @name(` up to its closing brace."""
    start = re.search(rf"vm\.func (?:private )?@{re.escape(name)}\(", vm_ir)
    assert start, f"no vm.func @{name} in the VM IR"
    end = vm_ir.index("\n    }", start.start())
    return vm_ir[start.start() : end]


def test_the_cuda_variant_keeps_iree_command_buffer_reuse_on():
    """PLeX adds no flag that turns the reuse off (either flag set to false would)."""
    flags = variant_flags([CUDA], cancellable=True)
    assert not [f for f in flags if "indirect-command-buffers" in f or "memoization" in f]


def test_a_static_entrypoint_replays_the_command_buffer_recorded_at_init(vm_ir):
    call = body(vm_ir, "static")
    assert "hal.command_buffer.create" not in call
    replay = re.search(
        r"hal\.device\.queue\.execute\.indirect\([^)]*@?(%__static_memoize\w*)", call
    )
    assert replay, "the call does not replay a memoized command buffer"
    init = body(vm_ir, "__init")
    assert "@__static_memoize_apply" in init  # recorded once, when the module initializes
    assert "hal.command_buffer.create" in body(vm_ir, "__static_memoize_apply")


def test_a_dynamic_grid_records_a_command_buffer_per_call(vm_ir):
    """The 8192^3 benchmark's `matmul` (dynamic M) is of this kind: its recording is per call."""
    call = body(vm_ir, "dynamic")
    assert "hal.command_buffer.create" in call
    assert "hal.device.queue.execute(" in call
