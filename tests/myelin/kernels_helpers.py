"""What the kernel-library tests share: a graph imported from MLIR text, and the dispatches of a
kernelized module once compiled for CUDA to the flow phase (no GPU needed)."""

from __future__ import annotations

import re
from pathlib import Path

from myelin.compiler.pipeline import ImportedGraph, compile_module, import_graph
from myelin.compiler.targets import TargetDevice

# extern: @extern_dispatch_N::@cuda_nvptx_fb::@<kernel>; codegen: @<fn>_dispatch_N::@<name>
_DISPATCH = re.compile(r"flow\.dispatch @(\w+)::(?:@\w+::)?@(\w+)")


def import_mlir(folder: Path, text: str) -> ImportedGraph:
    """`text` as folder/graph.mlir, imported as module `g`."""
    source = folder / "graph.mlir"
    source.write_text(text)
    return import_graph(source, input_type="auto", module_name="g", scope="g")


def flow_dispatches(
    module_bytecode: bytes, functions: list[str]
) -> tuple[str, list[tuple[str, str]]]:
    """(the flow-phase IR of the module compiled for one CUDA device, its dispatches as
    (executable, entry) in IR order: extern dispatches' executables start `extern_dispatch`)."""
    phases: dict[str, str] = {}
    compile_module(
        module_bytecode,
        phase="input",
        devices=[TargetDevice("gpu", target="cuda")],
        functions=functions,
        stop_at="flow",
        on_phase=lambda phase, text: phases.__setitem__(phase, text),
    )
    return phases["flow"], _DISPATCH.findall(phases["flow"])
