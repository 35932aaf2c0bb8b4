"""The example MLP, a MiniLM-shaped BERT and a ViT on the NVIDIA GPU through Vulkan, beside the
same models through CUDA and in torch eager: results checked, times side by side.

Here (the compiler), once, writes benchmarks/gpu/artifacts/vulkan/ (git-ignored; about 35 MiB):

    python benchmarks/gpu/vulkan_models.py prepare

    mlp.mln     examples/mlp, variants `vulkan` (vulkan-spirv, arch "ampere") and `cuda` (sm_80)
    models.mln  benchmarks/gpu/vulkan/: graphs `minilm` and `vit`, the same two variants
    reference.npz  each model's inputs' checksum and its torch eager result on the CPU (float32)

On the GPU machine (python3.12 with torch CUDA and transformers; the cp312 iree-base-runtime
wheel in .whl; the Vulkan loader from .gl, docs/platforms.md; command and carry in
benchmarks/gpu/README.md):

    python3 benchmarks/gpu/vulkan_models.py run [--rounds 50] [--out DIR]

For each model: the `vulkan` and `cuda` variants and torch eager (float32, CUDA) on the same
inputs; each result against the CPU torch reference (max abs error, rtol 1e-3 / atol 1e-3 on
float32: GPU reductions sum in other orders, and TF32 is off in torch here); the median wall time
of one call, result on the device (MyeLiN `output="device"`, torch synchronized), after 5 warm-up
calls. Prints a table and writes vulkan_models.json under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts" / "vulkan"
RTOL = ATOL = 1e-3
WARMUP = 5


def _models_module():
    sys.path.insert(0, str(HERE / "vulkan"))
    import model  # benchmarks/gpu/vulkan/model.py

    return model


def _mlp_input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)


def _mlp_torch(x):
    """examples/mlp in torch: relu(x @ w1 + b1) @ w2 + b2, weights from its safetensors."""
    import torch
    from safetensors.numpy import load_file

    w = {
        k: torch.from_numpy(v).to(x.device)
        for k, v in load_file(str(ROOT / "examples" / "mlp" / "params.safetensors")).items()
    }
    return lambda: torch.relu(x @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]


def prepare() -> None:
    """Build the artifacts and the CPU reference (here, where the compiler is)."""
    import torch

    from plex.builder import build

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    build(HERE / "vulkan" / "mlp.toml", ARTIFACTS / "mlp.mln")
    build(HERE / "vulkan" / "app.toml", ARTIFACTS / "models.mln")
    model = _models_module()
    reference: dict[str, np.ndarray] = {}
    with torch.no_grad():
        x = torch.from_numpy(_mlp_input())
        reference["mlp"] = _mlp_torch(x)().numpy()
        for name in ("minilm", "vit"):
            inputs = getattr(model, f"{name}_inputs")()
            reference[name] = getattr(model, f"{name}_model")()(*inputs).numpy()
            reference[f"{name}_checksum"] = np.array([float(t.double().sum()) for t in inputs])
    np.savez(ARTIFACTS / "reference.npz", **reference)
    total = sum(f.stat().st_size for f in ARTIFACTS.iterdir())
    print(f"{ARTIFACTS}: {total / 2**20:.1f} MiB")
    if total > 40 * 2**20:  # + the runtime wheel (14.4 MiB) + the tree (5 MiB) <= 64 MiB
        sys.exit("over 40 MiB: with the runtime wheel and the tree, over the device call's 64")


def _median_ms(fn, sync, rounds: int) -> float:
    for _ in range(WARMUP):
        fn()
    sync()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def run(rounds: int, out: Path | None) -> int:
    import torch

    import myelin

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as MyeLiN computes it
    model = _models_module()
    reference = np.load(ARTIFACTS / "reference.npz")
    cases = {
        "mlp": ("mlp.mln", "forward", (_mlp_input(),)),
        "minilm": ("models.mln", "minilm.forward", None),
        "vit": ("models.mln", "vit.forward", None),
    }
    instance = myelin.Instance()
    rows, failed = [], False
    for name, (artifact, function, args) in cases.items():
        if args is None:
            tensors = getattr(model, f"{name}_inputs")()
            checksum = np.array([float(t.double().sum()) for t in tensors])
            if not np.allclose(checksum, reference[f"{name}_checksum"]):
                print(f"{name}: this torch draws other inputs than the reference's; skipped")
                failed = True
                continue
            args = tuple(t.numpy() for t in tensors)
        expected = reference[name]
        row: dict = {"model": name}
        for variant in ("vulkan", "cuda"):
            try:
                loaded = instance.load(ARTIFACTS / artifact, variant=variant)
                with loaded.session() as s:
                    on_device = [myelin_input(s, a) for a in args]
                    got = np.asarray(s.call(function, *args))
                    row[f"{variant}_err"] = float(np.abs(got - expected).max())
                    row[f"{variant}_ok"] = bool(np.allclose(got, expected, rtol=RTOL, atol=ATOL))
                    # A call returns once the device is done: nothing more to wait for.
                    row[f"{variant}_ms"] = _median_ms(
                        lambda s=s, f=function, d=on_device: s.call(f, *d, output="device"),
                        lambda: None,
                        rounds,
                    )
            except Exception as e:  # one failing path does not hide the others
                row[f"{variant}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                row[f"{variant}_ok"] = False
            failed |= not row[f"{variant}_ok"]
        with torch.no_grad():
            inputs = tuple(torch.from_numpy(a).cuda() for a in args)
            if name == "mlp":
                call = _mlp_torch(inputs[0])
            else:
                net = getattr(model, f"{name}_model")().cuda()
                call = lambda net=net, inputs=inputs: net(*inputs)  # noqa: E731
            got = call().float().cpu().numpy()
            row["torch_err"] = float(np.abs(got - expected).max())
            row["torch_ms"] = _median_ms(call, torch.cuda.synchronize, rounds)
        rows.append(row)
    _print(rows)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "vulkan_models.json").write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


def myelin_input(session, array: np.ndarray):
    """The input uploaded once, as a device array on the entrypoint's device: the timed calls
    then measure the device work and MyeLiN's call, not the host-to-device copy."""
    import iree.runtime as rt

    return rt.asdevicearray(session.model.hal_device(session.model.device_names[0]), array)


def _print(rows: list[dict]) -> None:
    head = (
        f"{'model':8} {'vulkan ms':>10} {'cuda ms':>9} {'torch ms':>9}  max abs error vs CPU torch"
    )
    print(head)
    for r in rows:
        cells = {
            v: f"{r[f'{v}_ms']:.3f}" if f"{v}_ms" in r else "failed" for v in ("vulkan", "cuda")
        }
        errors = ", ".join(
            f"{v} {r[f'{v}_err']:.1e}{'' if r.get(f'{v}_ok', True) else ' (OUT OF TOLERANCE)'}"
            for v in ("vulkan", "cuda", "torch")
            if f"{v}_err" in r
        )
        times = f"{cells['vulkan']:>10} {cells['cuda']:>9} {r['torch_ms']:>9.3f}"
        print(f"{r['model']:8} {times}  {errors}")
        for v in ("vulkan", "cuda"):
            if f"{v}_error" in r:
                print(f"  {v}: {r[f'{v}_error']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="build the artifacts and the reference (here)")
    run_parser = sub.add_parser("run", help="run on the GPU machine")
    run_parser.add_argument("--rounds", type=int, default=50)
    run_parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare()
        return 0
    return run(args.rounds, args.out)


if __name__ == "__main__":
    sys.exit(main())
