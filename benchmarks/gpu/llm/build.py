"""Build the GPU LLM benchmark here: one causal-lm .mln per (family, batch, codec), each stripped
to its skeleton (manifest and compiled module, no weights: benchmarks/gpu/payload.py) so that
every build travels in one device call, and the weights are computed again there.

    python benchmarks/gpu/llm/build.py                            # Llama-2-7B layers, Hopper
    python benchmarks/gpu/llm/build.py --families llama qwen2 --codecs none q4
    python benchmarks/gpu/llm/build.py --size small --target cpu -o /tmp/llm   # check scripts

Per build: the seeded Hugging Face folder (models.py) in a temporary folder, an app with
`frontend = "causal-lm"`, `max_seq` = prompt + new tokens and `max_batch` = the batch timed
(one build per batch: the Generator runs the compiled batch whatever the number of prompts, so a
batch-1 run on a batch-8 build would time 8 sequences), `dtype = "float16"` (the model loaded and
computed in float16, its KV cache float16: `--dtype float32` leaves the line out, for a frontend
without it), weights stored as `--codecs` says (`none`: as the model holds them), for a
CUDA device with `arch = "sm_90a"` and the kernel library (`kernels = "triton-attention"`,
docs/kernels.md), and `prefill_lengths = [512]` (`--prefill-lengths`: a static-length prefill
for the 512-token prompt, whose attention the kernels take; the dynamic one's they cannot,
docs/llm.md). `plex build` runs in a process of its own without the build cache (the
import step would store GBs of weights); its peak memory is recorded. Writes `llm.json` (builds,
times, peak memory, kernel coverage, warnings) beside the skeletons; exits 1 when what travels
(skeletons and scripts) passes 60 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import models  # noqa: E402

from benchmarks.gpu import payload  # noqa: E402

LIMIT_MIB = 60
PROMPT, NEW = 512, 128  # the generation: prompt 512 tokens, 128 new
DEVICES = {
    "cuda": '[devices.hopper]\ntarget = "cuda"\narch = "sm_90a"\n{kernels}',
    "cpu": '[devices.cpu]\ntarget = "llvm-cpu"\n',
}
KERNELS = ("triton-attention", "triton", "none")  # cuda: the device's `kernels`
# Weight storage per codec name: `none` keeps what the frontend exports.
CODECS = {
    "none": "",
    "fp16": '[weights.codec]\n"*" = "fp16"\n',
    "q4": '[weights.codec]\n"*" = "q4"\n',
}
DTYPES = ("float16", "bfloat16", "float32")  # the graph's `dtype`; float32 is the default
PACKAGE = """[package]
name = "llm"
version = "0.1.0"

[graph.lm]
source = "model"
frontend = "causal-lm"
max_seq = {max_seq}
max_batch = {max_batch}
{dtype}{prefill}"""
APP = '[app]\nname = "{name}"\npackages = ["llm"]\ngraphs = ["llm:lm"]\n\n{device}\n{codec}'


def build_name(family: str, batch: int, dtype: str, codec: str) -> str:
    return f"{family}-b{batch}-{dtype}-{codec}"


def build_one(
    family: str,
    size: str,
    layers: int,
    batch: int,
    dtype: str,
    codec: str,
    target: str,
    kernels: str,
    out: Path,
    prefill_lengths: tuple[int, ...] = (PROMPT,),
) -> dict:
    name = build_name(family, batch, dtype, codec)
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="plex-llm-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        models.write_folder(root / "llm" / "model", family, size, layers)
        wrote_s = time.perf_counter() - start
        (root / "llm" / "plex.toml").write_text(
            PACKAGE.format(
                max_seq=PROMPT + NEW,
                max_batch=batch,
                dtype="" if dtype == "float32" else f'dtype = "{dtype}"\n',
                prefill=f"prefill_lengths = {list(prefill_lengths)}\n" if prefill_lengths else "",
            )
        )
        app = root / "app.toml"
        app.write_text(
            APP.format(
                name=f"llm-{name}",
                device=DEVICES[target].format(kernels=f'kernels = "{kernels}"\n'),
                codec=CODECS[codec],
            )
        )
        shutil.copy(app, folder / "app.toml")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p
        )
        mln = root / "lm.mln"
        plex = Path(sys.executable).parent / "plex"
        start = time.perf_counter()
        run = subprocess.run(
            [str(plex), "build", str(app), "-o", str(mln), "--no-cache", "--progress", "plain"],
            env=env,
            capture_output=True,
            text=True,
        )
        build_s = time.perf_counter() - start
        log = run.stdout + run.stderr
        (folder / "build.log").write_text(log)
        if run.returncode:
            raise SystemExit(f"{name}: plex build failed (exit {run.returncode}):\n{log[-3000:]}")
        manifest = payload.strip(mln, folder / "skeleton")
    sites = [s for v in manifest["variants"] for d in v["devices"] for s in d.get("kernels", [])]
    from myelin.kernels import KERNELS_CUDA_ARCH, coverage_line, left_to_codegen

    return {
        "name": name,
        "family": family,
        "size": size,
        "layers": layers,
        "parameters": models.parameter_count(family, size, layers),
        "batch": batch,
        "max_seq": PROMPT + NEW,
        "dtype": dtype,
        "prefill_lengths": list(prefill_lengths),
        "codec": codec,
        "target": target,
        "kernels": kernels if target == "cuda" else None,
        "write_folder_s": round(wrote_s, 1),
        "build_s": round(build_s, 1),
        # the largest child so far: each build is the biggest process it runs
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2),
        "coverage": coverage_line(sites, KERNELS_CUDA_ARCH) if sites else None,
        "left_to_iree": left_to_codegen(sites),
        "warnings": [line for line in log.splitlines() if line.startswith("warning:")],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", type=Path, default=REPO / "benchmarks/gpu/artifacts/llm")
    p.add_argument("--size", choices=("real", "small"), default="real")
    p.add_argument("--target", choices=tuple(DEVICES), default="cuda")
    p.add_argument("--families", nargs="+", choices=tuple(models.FAMILIES), default=["llama"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--dtype", choices=DTYPES, default="float16", help="the graph's dtype")
    p.add_argument("--codecs", nargs="+", choices=tuple(CODECS), default=["none"])
    p.add_argument("--layers", type=int, help="decoder layers (default: 2)")
    p.add_argument("--kernels", choices=KERNELS, default=KERNELS[0], help="cuda: the library")
    p.add_argument(
        "--prefill-lengths",
        nargs="*",
        type=int,
        default=[PROMPT],
        help="the graph's static prefill lengths (none: only the dynamic prefill)",
    )
    args = p.parse_args()
    layers = args.layers or models.DEFAULT_LAYERS[args.size]
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "llm.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    if index.get("size", args.size) != args.size or index.get("target", args.target) != args.target:
        index = {}  # another size or target: start over
    index.update(size=args.size, target=args.target, prompt=PROMPT, new=NEW)
    built = {b["name"]: b for b in index.get("builds", [])}
    for family in args.families:
        for codec in args.codecs:
            for batch in args.batches:
                name = build_name(family, batch, args.dtype, codec)
                print(f"building {name} ({args.size}, {layers} layers, {args.target}) ...")
                sys.stdout.flush()
                built[name] = build_one(
                    family,
                    args.size,
                    layers,
                    batch,
                    args.dtype,
                    codec,
                    args.target,
                    args.kernels,
                    args.out,
                    tuple(args.prefill_lengths),
                )
                b = built[name]
                print(f"  {b['build_s']} s, peak {b['peak_rss_gib']} GiB; {b['coverage']}")
                sys.stdout.flush()
                index["builds"] = list(built.values())
                index_path.write_text(json.dumps(index, indent=1))
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    size += sum(f.stat().st_size for f in HERE.iterdir() if f.is_file())
    print(f"{args.out}: {size / 2**20:.1f} MiB with the scripts (limit {LIMIT_MIB} MiB)")
    return 1 if size > LIMIT_MIB * 2**20 else 0


if __name__ == "__main__":
    sys.exit(main())
