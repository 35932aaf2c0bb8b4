"""LLVM's code-layout option for llvm-cpu (myelin.tuning.gate.CODE_LAYOUT_FLAGS): set once per
process at its first llvm-cpu compile, so a kernel's inner loops start on 64-byte lines
wherever the linker puts the kernel (the 6% between MiniLM's int8 and fp32 builds)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from myelin.compiler.pipeline import compile_imported, import_graph
from myelin.compiler.targets import TargetDevice

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp" / "mlp.mlir"
REPO = Path(__file__).resolve().parents[2]

# The MLIR of one f32 matmul large enough that its kernel keeps an FMA loop (not unrolled away).
MATMUL = """
func.func @mm(%a: tensor<?x256xf32>, %b: tensor<256x256xf32>) -> tensor<?x256xf32> {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %m = tensor.dim %a, %c0 : tensor<?x256xf32>
  %e = tensor.empty(%m) : tensor<?x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<?x256xf32>) -> tensor<?x256xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x256xf32>, tensor<256x256xf32>)
      outs(%f : tensor<?x256xf32>) -> tensor<?x256xf32>
  return %r : tensor<?x256xf32>
}
"""


def test_the_first_llvm_cpu_compile_sets_the_layout_option_once_and_keeps_it():
    """The global command line is set by the first llvm-cpu compile, with the layout option and
    no library; later compiles do not set it again (IREE aborts on a second call), and a
    tuning library asked for afterwards is refused with the fix instead."""
    code = """
import iree.compiler.api as api
calls = []
api._initializeGlobalCL = lambda *args: calls.append(args)
from myelin.errors import CompileError
from myelin.tuning.gate import CODE_LAYOUT_FLAGS, LIBRARY_FLAG, process_wide_spec
with process_wide_spec(["--iree-hal-target-device=local"]):
    pass
assert calls == [], calls  # not an llvm-cpu compile: nothing set yet
cpu = ["--iree-hal-local-target-device-backends=llvm-cpu"]
with process_wide_spec(cpu) as (flags, applies_a_spec):
    assert not applies_a_spec
with process_wide_spec(cpu):
    pass
assert calls == [("plex", *CODE_LAYOUT_FLAGS)], calls
try:
    with process_wide_spec([f"{LIBRARY_FLAG}=/x/spec.mlir"]):
        raise SystemExit("not refused")
except CompileError as e:
    assert "another process" in str(e) and "no tuning spec" in str(e), e
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_library_first_sets_the_layout_option_with_it():
    code = """
import iree.compiler.api as api
calls = []
api._initializeGlobalCL = lambda *args: calls.append(args)
from myelin.tuning.gate import CODE_LAYOUT_FLAGS, LIBRARY_FLAG, process_wide_spec
with process_wide_spec([f"{LIBRARY_FLAG}=/x/spec.mlir"]):
    pass
cpu = "--iree-hal-local-target-device-backends=llvm-cpu"
with process_wide_spec([cpu, f"{LIBRARY_FLAG}=/x/spec.mlir"]):
    pass
assert calls == [("plex", *CODE_LAYOUT_FLAGS, f"{LIBRARY_FLAG}=/x/spec.mlir")], calls
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _loop_starts(elf: bytes, tmp_path: Path) -> list[int]:
    """Addresses where the FMA loops of an embedded ELF start (targets of backward jumps whose
    body has a vfmadd)."""
    path = tmp_path / "kernels.so"
    path.write_bytes(elf)
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"^\s*([0-9a-f]+):\s+(.*)$", text, re.MULTILINE)
    ]
    starts = []
    for address, instruction in lines:
        jump = re.match(r"j\w+\s+([0-9a-f]+) <", instruction)
        if jump and int(jump.group(1), 16) < address:
            target = int(jump.group(1), 16)
            body = [i for a, i in lines if target <= a <= address]
            if any(i.startswith("vfmadd") for i in body) and not any(
                re.match(r"j\w+\s+([0-9a-f]+) <", i) for i in body[:-1]
            ):
                starts.append(target)
    return starts


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_a_data_tiled_matmul_kernel_has_its_inner_fma_loops_on_64_byte_lines(tmp_path):
    source = tmp_path / "mm.mlir"
    source.write_text(MATMUL)
    imported = import_graph(source, input_type="auto", module_name="mm", scope="mm.mm")
    device = TargetDevice("d", "llvm-cpu", cpu="znver3", data_tiling=True)
    compiled = compile_imported(imported.module_bytecode, phase="input", devices=[device])
    elf = compiled.vmfb[compiled.vmfb.find(b"\x7fELF") :]
    starts = _loop_starts(elf, tmp_path)
    assert starts, "no FMA loop found in the matmul's kernel"
    assert all(s % 64 == 0 for s in starts), [hex(s) for s in starts]
