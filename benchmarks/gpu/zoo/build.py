"""Build the GPU zoo here, one .mln per model, and strip each to its skeleton (manifest and
compiled module, no weights: payload.py) so the whole zoo travels in one device call.

    python benchmarks/gpu/zoo/build.py                      # real widths, Hopper (arch sm_90a)
    python benchmarks/gpu/zoo/build.py --size small --target cpu -o /tmp/zoo   # check the scripts

Each model is built by `plex build` in a process of its own (the real Llama and Qwen2 hold
1.3-1.4 GB of f16 weights while they are exported), for a CUDA device with `arch = "sm_90a"`:
the kernel library is on by default there (docs/kernels.md). The .mln is deleted once stripped.
Writes `zoo.json` (models, graphs, coverage lines, sizes) beside the skeletons; exits 1 when
everything that travels (skeletons, scripts) passes 60 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
import payload  # noqa: E402

# the zoo the GPU run times: every model of models.py
GPU_MODELS = (
    "llama", "qwen2", "gpt2", "bert", "vit", "whisper_encoder", "timm_vit_base", "timm_resnet50"
)  # fmt: skip
LIMIT_MIB = 60
DEVICES = {
    "cuda": '[devices.hopper]\ntarget = "cuda"\narch = "sm_90a"\n',
    "cpu": '[devices.cpu]\ntarget = "llvm-cpu"\n',
}
APP = '[app]\nname = "zoo-{model}"\npackages = ["{zoo}"]\ngraphs = ["zoo:{graph}"]\n\n{device}'


def build_one(model: str, size: str, target: str, out: Path) -> dict:
    folder = out / model
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    graph = f"{model}_{size}"
    app = folder / "app.toml"
    app.write_text(
        APP.format(model=model, zoo=HERE.as_posix(), graph=graph, device=DEVICES[target])
    )
    env = dict(os.environ)
    shim = REPO / "tests" / "frontends" / "_torchvision_shim"  # timm without torchvision
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), env.get("PYTHONPATH", ""), str(shim)) if p
    )
    mln = folder / f"{graph}.mln"
    start = time.perf_counter()
    plex = Path(sys.executable).parent / "plex"
    run = subprocess.run(
        [str(plex), "build", str(app), "-o", str(mln)], env=env, capture_output=True, text=True
    )
    log = run.stdout + run.stderr
    (folder / "build.log").write_text(log)
    if run.returncode:
        raise SystemExit(f"{model}: plex build failed (exit {run.returncode}):\n{log[-3000:]}")
    manifest = payload.strip(mln, folder / "skeleton")
    mln.unlink()
    (folder / "plex.lock").unlink(missing_ok=True)
    sites = [s for v in manifest["variants"] for d in v["devices"] for s in d.get("kernels", [])]
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line, left_to_codegen

    return {
        "model": model,
        "graph": graph,
        "entry": f"{graph}.forward",
        "target": target,
        "build_s": round(time.perf_counter() - start, 1),
        "coverage": coverage_line(sites, KERNELS_CUDA_ARCH) if sites else None,
        "left_to_iree": left_to_codegen(sites),
        "warnings": [line for line in log.splitlines() if line.startswith("warning:")],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", type=Path, default=REPO / "benchmarks/gpu/artifacts/zoo")
    p.add_argument("--size", choices=("real", "small"), default="real")
    p.add_argument("--target", choices=tuple(DEVICES), default="cuda")
    p.add_argument("--models", nargs="+", default=list(GPU_MODELS))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "zoo.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index.update(size=args.size, target=args.target)
    built = {m["model"]: m for m in index.get("models", [])}
    for model in args.models:
        print(f"building {model} ({args.size}, {args.target}) ...", flush=True)
        built[model] = build_one(model, args.size, args.target, args.out)
        print(f"  {built[model]['build_s']} s; {built[model]['coverage']}", flush=True)
        index["models"] = list(built.values())
        index_path.write_text(json.dumps(index, indent=1))
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    size += sum(f.stat().st_size for f in HERE.iterdir() if f.is_file())
    print(f"{args.out}: {size / 2**20:.1f} MiB with the scripts (limit {LIMIT_MIB} MiB)")
    return 1 if size > LIMIT_MIB * 2**20 else 0


if __name__ == "__main__":
    sys.exit(main())
