"""The runtimes a case is timed beside (the anchors): each turns the case's torch module and its
inputs (numpy; torch CUDA tensors on a GPU) into a callable returning its first output (numpy, or
a torch tensor where torch put it: the runner copies it to the host for the check only), or says
why it cannot run here. `threads` 0 leaves each runtime its own default (all cores).

An anchor that is not installed is skipped with that reason in the result file, never silently:
the table shows the row as skipped."""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Runner = Callable[..., object]  # returns its first output: numpy, or a tensor where it ran


class AnchorUnavailable(Exception):
    """The anchor cannot run on this machine or for this case; the message says why."""


def _first(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def torch_eager(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """The module as written, under inference_mode, on `device` (the reference of every check);
    each call waits for the GPU, and its first output stays where torch put it."""
    module = module.to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run(*args: np.ndarray) -> torch.Tensor:
        with torch.inference_mode():
            out = _first(module(*(torch.as_tensor(a, device=device) for a in args)))
            sync()
            return out

    return run


def torch_launches(module: torch.nn.Module, device: str, n: int) -> Runner:
    """torch eager's `n` calls launched back to back, then one wait (what torch.utils.benchmark
    times): the anchor of a burst case."""
    module = module.to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run(*args: np.ndarray) -> torch.Tensor:
        with torch.inference_mode():
            tensors = [torch.as_tensor(a, device=device) for a in args]  # no copy where they are
            outs = [_first(module(*tensors)) for _ in range(n)]
            sync()
            return outs[-1]

    return run


def torch_compile(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """torch.compile (inductor, default mode); compiled by the first call, which warm-up takes."""

    if device == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
        raise AnchorUnavailable("torch.compile on the CPU needs a C++ compiler (none on PATH)")
    return torch_eager(torch.compile(module), inputs, device, threads)


def _onnx_file(module: torch.nn.Module, inputs: tuple[np.ndarray, ...]) -> tuple[Path, list[str]]:
    """The module exported with torch.onnx (TorchScript exporter, opset 17, shapes as given),
    once per module and input shapes in a process: every ONNX anchor runs the same file."""
    key = (id(module), tuple(np.shape(a) for a in inputs))
    if key not in _EXPORTS:
        folder = Path(tempfile.mkdtemp(prefix="plex-bench-onnx-"))
        # a 12-layer model's export is ~400 MB: gone with the process, not left in /tmp
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "model.onnx"
        names = [f"input_{i}" for i in range(len(inputs))]
        torch.onnx.export(
            module.cpu(),
            tuple(torch.as_tensor(a).cpu() for a in inputs),
            str(path),
            input_names=names,
            opset_version=17,
            dynamo=False,
        )
        _EXPORTS[key] = (path, names)
    return _EXPORTS[key]


_EXPORTS: dict[tuple, tuple[Path, list[str]]] = {}


def _ort_session(
    module: torch.nn.Module,
    inputs: tuple[np.ndarray, ...],
    device: str,
    threads: int,
    level: str | None,
) -> Runner:
    if importlib.util.find_spec("onnxruntime") is None:
        raise AnchorUnavailable("onnxruntime is not installed (pip install onnxruntime)")
    import onnxruntime as ort

    path, names = _onnx_file(module, inputs)
    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider"] if device.startswith("cuda") else []
    session = ort.InferenceSession(
        str(path), options, providers=[*providers, "CPUExecutionProvider"]
    )

    def run(*args: np.ndarray) -> np.ndarray:
        host = [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        return session.run(None, dict(zip(names, host, strict=True)))[0]

    return run


def onnx_runtime(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """ONNX Runtime as a user gets it: default session options (only the thread count set), on
    the CPU provider (CUDA on a GPU). Its default graph optimization level is already
    ORT_ENABLE_ALL (onnxruntime 1.32), so this and `onnxruntime-all` time the same graph."""
    return _ort_session(module, inputs, device, threads, None)


def onnx_runtime_all(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """ONNX Runtime with every graph optimization asked for explicitly (ORT_ENABLE_ALL)."""
    return _ort_session(module, inputs, device, threads, "ORT_ENABLE_ALL")


def _openvino(
    module: torch.nn.Module,
    inputs: tuple[np.ndarray, ...],
    device: str,
    threads: int,
    precision: str | None,
) -> Runner:
    if device != "cpu":
        raise AnchorUnavailable("the OpenVINO anchor runs on the CPU only")
    if importlib.util.find_spec("openvino") is None:
        raise AnchorUnavailable(
            "openvino is not installed (pip install -e '.[benchmark]': openvino==2026.4.1)"
        )
    import openvino as ov

    path, names = _onnx_file(module, inputs)
    config: dict = {"INFERENCE_NUM_THREADS": threads} if threads else {}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()

    def run(*args: np.ndarray) -> np.ndarray:
        return np.asarray(request.infer(dict(zip(names, args, strict=True)))[0])

    # what the plugin chose: the result file records it beside the row
    run.note = f"inference precision {compiled.get_property('INFERENCE_PRECISION_HINT')}"  # type: ignore[attr-defined]
    return run


def openvino(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """OpenVINO's default CPU plugin on the same ONNX file as ONNX Runtime. On a CPU with
    AVX512-BF16 or AMX its default inference precision is bf16: the reduced-precision anchor."""
    return _openvino(module, inputs, device, threads, None)


def openvino_f32(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """OpenVINO's CPU plugin held to f32 (`INFERENCE_PRECISION_HINT=f32`): the like-for-like
    anchor of an f32 build."""
    return _openvino(module, inputs, device, threads, "f32")


def llama_cpp(
    module: torch.nn.Module, inputs: tuple[np.ndarray, ...], device: str, threads: int
) -> Runner:
    """llama.cpp (llama-cpp-python) on a GGUF file of the same architecture: timing only, its
    weights are its own, so its outputs are not compared. A case names the file as
    `gguf = "path"`; the runner passes it as the module."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise AnchorUnavailable("llama-cpp-python is not installed (pip install llama-cpp-python)")
    if not isinstance(module, (str, Path)) or not Path(module).exists():
        raise AnchorUnavailable("the case names no GGUF file (`gguf = ...`) of this model")
    from llama_cpp import Llama

    llm = Llama(model_path=str(module), n_ctx=2048, n_threads=threads or None, verbose=False)
    tokens = [int(t) for t in inputs[0].reshape(-1)]

    def run(*args: np.ndarray) -> np.ndarray:
        llm.reset()
        llm.eval(tokens)
        return np.asarray(llm.scores[llm.n_tokens - 1])

    return run


# Anchor name in a case file -> (name in the tables, factory, compared with the reference)
ANCHORS: dict[str, tuple[str, Callable[..., Runner], bool]] = {
    "torch": ("torch eager", torch_eager, True),
    "torch.compile": ("torch.compile", torch_compile, True),
    "onnxruntime": ("ONNX Runtime", onnx_runtime, True),
    "onnxruntime-all": ("ONNX Runtime (ORT_ENABLE_ALL)", onnx_runtime_all, True),
    "openvino": ("OpenVINO default", openvino, True),
    "openvino-f32": ("OpenVINO f32", openvino_f32, True),
    "llama.cpp": ("llama.cpp", llama_cpp, False),
}
