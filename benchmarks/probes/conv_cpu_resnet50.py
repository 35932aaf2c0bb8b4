"""ResNet-50 with its convolutions rewritten as the CUDA kernels step rewrites them (im2col +
matmul, myelin.kernels._conv), compiled for llvm-cpu and run here against torch eager.

    python benchmarks/probes/conv_cpu_resnet50.py [--size real|small] [--batch 1]

timm's resnet50 from the GPU zoo (benchmarks/gpu/zoo/models.py: seeded weights, batch-norm
statistics seeded too), imported by PLeX's torch frontend, the input-phase IR normalized with
`normalize_contractions(..., all_convolutions=True)` and compiled from there for the CPU:
  f32: the model in float32, against torch eager in float32
  f16: the zoo's float16 model, against the same f16 weights computed by torch in float32
Prints the largest error relative to the largest logit, and the cosine, for each. (The f16
graph as imported does not compile for llvm-cpu in IREE 3.13, so only its normal form runs.)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SOURCE = """
import importlib.util
import sys

sys.path.insert(0, {shim!r})
spec = importlib.util.spec_from_file_location("gpu_zoo_models", {models!r})
zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zoo)


def resnet50_f16():
    return zoo.timm_resnet50({size!r}, batch={batch})


def resnet50_f32():
    model, inputs = resnet50_f16()
    return model.float(), {{k: v.float() for k, v in inputs.items()}}
"""
PACKAGE = """[package]
name = "resnet"
[graph.resnet50_f32]
source = "source.py:resnet50_f32"
frontend = "torch"
[graph.resnet50_f16]
source = "source.py:resnet50_f16"
frontend = "torch"
"""
APP = '[app]\nname = "resnet"\npackages = ["."]\n[devices.cpu]\ntarget = "llvm-cpu"\n'


def errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    return float(np.abs(got - want).max() / np.abs(want).max()), cosine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="real", choices=["real", "small"])
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    import myelin
    from myelin.compiler.phases import read_phase_file, render_phase_file
    from myelin.kernels import normalize_contractions
    from plex.builder import build

    with tempfile.TemporaryDirectory(prefix="plex-conv-cpu-") as tmp:
        root = Path(tmp)
        (root / "source.py").write_text(
            SOURCE.format(
                shim=str(REPO / "tests" / "frontends" / "_torchvision_shim"),
                models=str(REPO / "benchmarks" / "gpu" / "zoo" / "models.py"),
                size=args.size,
                batch=args.batch,
            )
        )
        (root / "plex.toml").write_text(PACKAGE)
        (root / "app.toml").write_text(APP)
        start = time.perf_counter()
        build(root / "app.toml", root / "ir", compile_to="input")
        normal = []
        for graph in ("resnet50_f32", "resnet50_f16"):
            saved = read_phase_file(root / "ir" / graph / "default" / "01.input.mlir")
            text, counts = normalize_contractions(saved.text, what=graph, all_convolutions=True)
            print(f"{graph}: {counts['convolutions']} convolutions rewritten", flush=True)
            assert "linalg.conv" not in text
            path = root / f"{graph}.normal.mlir"
            path.write_text(render_phase_file(text, saved.fields))
            normal.append(path)
        build(root / "app.toml", root / "normal.mln", resume_from=normal)
        print(f"built in {time.perf_counter() - start:.0f} s", flush=True)

        spec = importlib.util.spec_from_file_location("resnet_source", root / "source.py")
        source = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(source)
        model, inputs = source.resnet50_f16()
        x16 = inputs["x"]
        with torch.no_grad():
            want = model.float()(x16.float()).numpy()  # the f16 weights, in f32
        with myelin.Instance().load(root / "normal.mln") as m, m.session() as s:
            got32 = np.asarray(s.call("resnet50_f32.forward", x16.float().numpy()))
            got16 = np.asarray(s.call("resnet50_f16.forward", x16.numpy()))
    print(f"resnet50 {args.size} batch {args.batch}, logits {want.shape}, vs torch eager in f32:")
    for name, got, limit in (("f32", got32, 1e-4), ("f16", got16, 2e-2)):
        err, cos = errors(got, want)
        verdict = "ok" if err < limit else "FAILED"
        print(f"  {name}: max error {err:.2e} of the largest logit, cosine {cos:.6f} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
