"""Encoders and a CNN on the CPU: PLeX as shipped vs torch eager vs ONNX Runtime, batch 1.

    python benchmarks/cpu_models.py [--models minilm bert vit whisper resnet] [--threads 2]
                                    [--rounds 7] [--calls 3] [--untiled]

Each model is built from its Hugging Face transformers config with seeded random weights (the
speed of a dense model does not depend on its values; no download): all-MiniLM-L6-v2's shape (6
layers, 384 wide, 128 tokens), BERT-base (12 layers, 768, 128 tokens), ViT-B/16 (224 x 224: 197
tokens), Whisper-tiny's encoder (80 x 3000 mel frames: 1500 tokens) and ResNet-50 (224 x 224).
PLeX builds each with the default app (`[devices.cpu] target = "llvm-cpu"`, nothing pinned: the
host chooses data tiling); `--untiled` adds a build with `data_tiling = false` to show what that
choice is worth. ONNX Runtime runs the same module exported by torch.onnx (opset 17) with its
default session options (all graph optimizations) and `--threads` intra-op threads.

Runtimes are timed in chunks of `--calls` calls (a runtime's spinning worker threads would slow
whichever runs next), interleaved, the order rotated per round; the table gives each runtime's
median ms per call over the rounds and the median (and min-max) of its per-round ratio against
torch and ORT (> 1: faster than it). The thread count is per process (IREE reads its task
topology once): run the script once per `--threads`. Builds land in the usual build cache, so a
second run builds nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from myelin import hostinfo

HERE = Path(__file__).resolve().parent

# name -> (what it is, input names)
MODELS = {
    "minilm": ("all-MiniLM-L6-v2 shape, seq 128", ("input_ids", "attention_mask")),
    "bert": ("BERT-base, 12 layers, seq 128", ("input_ids", "attention_mask")),
    "vit": ("ViT-B/16, 224x224 (197 tokens)", ("pixel_values",)),
    "whisper": ("Whisper-tiny encoder, 1500 frames", ("input_features",)),
    "resnet": ("ResNet-50 (HF), 224x224", ("pixel_values",)),
}

PACKAGE_MODEL = """
import sys
sys.path.insert(0, {here!r})
from cpu_models import make


def build():
    return make({name!r}, {batch})
"""


class LastHidden(torch.nn.Module):
    """The encoder's last hidden state: one tensor out, as every runtime returns it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs).last_hidden_state


def make(name: str, batch: int = 1) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model `name` with seeded weights, and its inputs at `batch`."""
    import transformers as tf

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    if name in ("minilm", "bert"):
        config = (
            tf.BertConfig(hidden_size=384, num_hidden_layers=6, intermediate_size=1536)
            if name == "minilm"
            else tf.BertConfig()
        )
        model = tf.BertModel(config, add_pooling_layer=False)
        ids = torch.randint(1000, 20000, (batch, 128), generator=generator)
        mask = torch.ones((batch, 128), dtype=torch.int64)
        mask[:, 100:] = 0  # padding, as a real batch has
        inputs: tuple[torch.Tensor, ...] = (ids, mask)
    elif name == "vit":
        model = tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False)
        inputs = (torch.randn((batch, 3, 224, 224), generator=generator),)
    elif name == "whisper":
        config = tf.WhisperConfig(
            d_model=384,
            encoder_layers=4,
            encoder_attention_heads=6,
            encoder_ffn_dim=1536,
            num_mel_bins=80,
        )
        model = tf.WhisperModel(config).get_encoder()
        inputs = (torch.randn((batch, 80, 3000), generator=generator),)
    elif name == "resnet":
        model = tf.ResNetModel(tf.ResNetConfig())
        inputs = (torch.randn((batch, 3, 224, 224), generator=generator),)
    else:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return LastHidden(model).eval(), inputs


def plex_runner(name: str, folder: Path, data_tiling: bool | None) -> tuple[Callable, object]:
    import myelin
    from plex.builder import build

    package = folder / f"{name}_pkg"
    package.mkdir(exist_ok=True)
    (package / "model.py").write_text(PACKAGE_MODEL.format(here=str(HERE), name=name, batch=1))
    (package / "plex.toml").write_text(
        f'[package]\nname = "{name}"\n[graph.{name}]\nsource = "model.py:build"\n'
        'frontend = "torch"\n'
    )
    pinned = "" if data_tiling is None else f"data_tiling = {str(data_tiling).lower()}\n"
    app = folder / f"{name}_{data_tiling}.toml"
    app.write_text(
        f'[app]\nname = "{name}"\npackages = ["{package}"]\n\n'
        f'[devices.cpu]\ntarget = "llvm-cpu"\n{pinned}'
    )
    out = folder / f"{name}_{data_tiling}.mln"
    start = time.perf_counter()
    build(app, out)
    print(f"  built {out.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    model = myelin.Instance().load(out)
    session = model.session()
    forward = session.resolve("forward")
    return (lambda *xs: np.asarray(forward(*xs))), (model, session)


def onnx_runner(name: str, folder: Path, threads: int) -> Callable:
    import onnxruntime as ort

    module, inputs = make(name)
    path = folder / f"{name}.onnx"
    torch.onnx.export(
        module,
        inputs,
        str(path),
        input_names=list(MODELS[name][1]),
        output_names=["last_hidden_state"],
        opset_version=17,
        dynamo=False,
    )
    options = ort.SessionOptions()  # defaults: every graph optimization
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = MODELS[name][1]
    return lambda *xs: session.run(None, dict(zip(names, xs, strict=True)))[0]


def torch_runner(name: str) -> Callable:
    module, _ = make(name)

    def run(*xs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(x) for x in xs)).numpy()

    return run


def chunk_ms(fn: Callable, args: tuple, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e3


def bench(name: str, folder: Path, args: argparse.Namespace) -> list[tuple]:
    runners: dict[str, Callable] = {
        "torch eager": torch_runner(name),
        "ONNX Runtime": onnx_runner(name, folder, args.threads),
    }
    keep = []
    runner, handles = plex_runner(name, folder, None)
    runners["PLeX as shipped"] = runner
    keep.append(handles)
    if args.untiled:
        runner, handles = plex_runner(name, folder, False)
        runners["PLeX, data_tiling = false"] = runner
        keep.append(handles)
    _, inputs = make(name)
    feed = tuple(x.numpy() for x in inputs)
    reference = runners["torch eager"](*feed)
    errors = {}
    for runtime, fn in runners.items():  # warm up and check numerics
        out = fn(*feed)
        errors[runtime] = float(np.abs(out - reference).max() / np.abs(reference).max())
    names = list(runners)
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for runtime in names[r % len(names) :] + names[: r % len(names)]:
            per_round[runtime].append(chunk_ms(runners[runtime], feed, args.calls))
    rows = []
    for runtime in names:
        ratios = [
            [b / t for b, t in zip(per_round[base], per_round[runtime], strict=True)]
            for base in ("torch eager", "ONNX Runtime")
        ]
        rows.append((name, runtime, statistics.median(per_round[runtime]), ratios, errors[runtime]))
    del keep
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--untiled", action="store_true", help="add a data_tiling = false build")
    args = parser.parse_args()
    # before any device exists: IREE reads its task topology when it creates the device
    import iree.runtime as rt

    rt.flags.parse_flags(f"--task_topology_group_count={args.threads}")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cpu-models-") as tmp:
        for name in args.models:
            rows += bench(name, Path(tmp), args)
    cpu = hostinfo.cpu_name()
    print(
        f"# {datetime.date.today()} {cpu}, {os.cpu_count()} CPUs, load {load_before:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, threads {args.threads}, batch 1, torch {torch.__version__}"
    )
    print("| model | runtime | ms/call | vs torch | spread | vs ORT | spread | max err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, runtime, ms, ratios, error in rows:
        cells = " | ".join(
            f"{statistics.median(r):.2f}x | {min(r):.2f}-{max(r):.2f}" for r in ratios
        )
        print(f"| {MODELS[name][0]} | {runtime} | {ms:.1f} | {cells} | {error:.1e} |")


if __name__ == "__main__":
    main()
