"""Frontends: turn a framework model (PyTorch, ONNX, JAX) into MLIR that IREE's input pipeline
accepts, with its weights as named parameters rather than inline constants.

A frontend is one module here with a `to_mlir(request) -> FrontendResult` function, registered in
FRONTENDS by name. MLIR and StableHLO files need no frontend: the compiler reads them directly.
Framework imports happen inside each frontend, so a build that uses none of them never loads
torch, onnx or jax.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from myelin.errors import CompileError

# frontend name -> module implementing `to_mlir`
FRONTENDS: dict[str, str] = {
    "torch": "myelin.frontends.torch",
    "onnx": "myelin.frontends.onnx",
    "jax": "myelin.frontends.jax",
    "causal-lm": "myelin.frontends.causal_lm",
}

# the pip extra that installs a frontend's packages, where it is not the frontend's name
_EXTRAS = {"causal-lm": "llm"}

# frontends whose source is read by the compiler directly, and the --iree-input-type to use
DIRECT_INPUT_TYPES: dict[str, str] = {"mlir": "auto", "stablehlo": "stablehlo"}
# what a graph's only function is called unless the manifest says otherwise, in every frontend
DEFAULT_ENTRYPOINT = "forward"


@dataclass(frozen=True)
class FrontendRequest:
    """What the manifest says about one graph."""

    source: Path  # the model file (.onnx, .py, ...)
    symbol: str | None  # for Python sources: the function after ':'
    module_name: str  # the VM module name the graph must get
    scope: str  # parameter scope the frontend must use for weights it externalizes
    entrypoints: tuple[str, ...] | None = None
    # input name -> {dimension index -> dimension name}: dims that must stay dynamic
    dynamic: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    host_fallback: bool = False  # ONNX: nodes IREE cannot lower run on the host
    # causal-lm: KV cache slots per sequence and sequences per call (None: the frontend's default)
    max_seq: int | None = None
    max_batch: int | None = None
    dtype: str | None = None  # causal-lm: compute and KV cache dtype (None: the frontend's)
    # causal-lm: static prompt lengths, each exported as one more entrypoint `prefill_<n>`
    prefill_lengths: tuple[int, ...] | None = None

    def single_entrypoint(self, refusal: str) -> str:
        """The name of a source's one function: the manifest's only entrypoint, else
        DEFAULT_ENTRYPOINT. Several names are refused with `refusal`, whose `{names}` lists them."""
        if not self.entrypoints:
            return DEFAULT_ENTRYPOINT
        if len(self.entrypoints) > 1:
            raise CompileError(refusal.replace("{names}", ", ".join(self.entrypoints)))
        return self.entrypoints[0]


@dataclass
class FrontendResult:
    """MLIR for IREE plus the weights it reads by name.

    `mlir` is MLIR text or bytecode that IREE's input pipeline accepts with `input_type`
    (e.g. "torch", "onnx", "stablehlo"); it refers to weights as
    `#flow.parameter.named<scope::key>` (or `#stream.parameter.named`), whose values are in
    `parameters`.
    """

    mlir: bytes
    input_type: str
    parameters: dict[str, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # input name -> {dimension index -> name} for dynamic dims the source itself names (an ONNX
    # dim_param); the manifest's `dynamic` names win over these.
    dim_names: dict[str, dict[int, str]] = field(default_factory=dict)
    # ONNX host fallback: nodes that run in a host VM module (myelin.frontends._onnx_host)
    host_nodes: tuple = ()
    # function -> input name -> {dimension index -> [largest size, why]}: sizes the source
    # itself bounds (torch.export's derived ranges); the build adds those its IR analysis finds
    dim_limits: dict[str, dict[str, dict[int, list]]] = field(default_factory=dict)


def frontend(name: str) -> Callable[[FrontendRequest], FrontendResult]:
    module_name = FRONTENDS.get(name)
    if module_name is None:
        raise CompileError(
            f"unknown frontend {name!r}; accepted: {', '.join([*DIRECT_INPUT_TYPES, *FRONTENDS])}"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise CompileError(
            f"the {name} frontend needs the '{e.name}' package; install PLeX with the "
            f"'{_EXTRAS.get(name, name)}' extra: pip install -e '.[{_EXTRAS.get(name, name)}]'"
        ) from e
    return module.to_mlir
