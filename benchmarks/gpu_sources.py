"""Model sources of the GPU suite besides the decoder: kernel shapes, the plain Llama block and
the GPU zoo (benchmarks/gpu/zoo/models.py). Each returns (torch module, numpy inputs) as every
source of benchmarks/zoo.py does, and takes its sizes as keyword arguments (a case's `params`):
the GPU sizes by default, a case's `small` table gives the CPU check's.

Everything here is computed from seeds on whichever machine runs it: the kernel and block cases
pass their weights as arguments (nothing to rebuild), and the zoo's weights are drawn per
parameter name with numpy's generator, which gives the same values on any machine, so the GPU
machine rebuilds the very .mln that was built here (benchmarks/gpu/payload.py checks every
section's digest).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SEED = 0
DTYPES = {"float16": np.float16, "float32": np.float32}


def _normal(shape: tuple[int, ...], scale: float, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(DTYPES[dtype])


class _Matmul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class _Linear(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, w)


def matmul(m: int = 8192, n: int = 8192, k: int = 8192, dtype: str = "float16"):
    """A [m, k] x B [k, n], both arguments: the kernel library's large-matmul case."""
    return _Matmul(), (_normal((m, k), 0.05, dtype, 1), _normal((k, n), 0.05, dtype, 2))


def linear(m: int = 1, n: int = 28672, k: int = 8192, dtype: str = "float16"):
    """x [m, k] by a weight stored [n, k] (torch's Linear layout, x W^T): at m = 1 the decode
    GEMV of a Llama-70B-sized FFN, the kernel library's skinny case."""
    return _Linear(), (_normal((m, k), 0.1, dtype, 3), _normal((n, k), 0.1, dtype, 4))


def _plain_block():
    path = REPO / "benchmarks" / "gpu" / "plain_block" / "model.py"
    name = "bench_plain_block"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def plain_block_prefill(**shape: int):
    """The Llama-7B-shaped block as user code writes it, prefill (plain_block/model.py)."""
    block = _plain_block()
    return block.Step("prefill"), block.example_inputs("prefill", block.Shape(**shape))


def plain_block_decode(**shape: int):
    """The same block, one decode step of a batch over a full cache."""
    block = _plain_block()
    return block.Step("decode"), block.example_inputs("decode", block.Shape(**shape))


def _zoo_models():
    """benchmarks/gpu/zoo/models.py, with the tests' torchvision placeholder where torchvision
    does not import (timm imports it; the GPU machine and this one have none)."""
    name = "bench_gpu_zoo"
    if name in sys.modules:
        return sys.modules[name]
    try:
        import torchvision  # noqa: F401
    except Exception:
        for loaded in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[loaded]
        sys.path.insert(0, str(REPO / "tests" / "frontends" / "_torchvision_shim"))
    path = REPO / "benchmarks" / "gpu" / "zoo" / "models.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


class _FirstOutput(torch.nn.Module):
    """A library model called with its inputs by name, returning its first tensor (Hugging
    Face's last hidden state or logits, timm's logits): PLeX exports one positional entrypoint."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs, strict=True)))
        if isinstance(out, torch.Tensor):
            return out
        return next(v for v in out.values() if isinstance(v, torch.Tensor))


def zoo_model(name: str, size: str = "real", dtype: str = "float16", batch: int | None = None):
    """GPU zoo model `name` (models.py: `llama`, `qwen2`, `bert`, ...) at `size`, in float16 as
    models.py builds it, or cast to float32 (the CPU check: IREE 3.13 on llvm-cpu does not
    compile these models' float16 convolutions); `batch` (timm_resnet50 only) other than the
    size's."""
    extra = {} if batch is None else {"batch": batch}
    model, inputs = _zoo_models().MODELS[name](size, **extra)
    if dtype == "float32":
        model = model.float()
        inputs = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    return _FirstOutput(model, tuple(inputs)), tuple(t.numpy() for t in inputs.values())


def _zoo(name: str):
    def source(size: str = "real", dtype: str = "float16", batch: int | None = None):
        return zoo_model(name, size, dtype, batch)

    source.__doc__ = f"benchmarks/gpu/zoo/models.py's `{name}`, float16, seeded by name."
    return source


ZOO = (
    "llama", "qwen2", "gpt2", "bert", "vit", "whisper_encoder", "timm_vit_base", "timm_resnet50"
)  # fmt: skip
SOURCES = {
    "matmul": matmul,
    "linear": linear,
    "plain-block-prefill": plain_block_prefill,
    "plain-block-decode": plain_block_decode,
    **{f"zoo-{name.replace('_', '-')}": _zoo(name) for name in ZOO},
}
