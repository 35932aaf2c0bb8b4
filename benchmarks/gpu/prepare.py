"""Build, on this machine, every .mln the GPU run needs, into benchmarks/gpu/artifacts/.

    python benchmarks/gpu/prepare.py

The GPU machine has no IREE compiler: it gets these files (and the cp312 iree-base-runtime wheel
in .whl/) and runs benchmarks/gpu/run_on_device.sh. The folder ignores itself in git (it holds a
`.gitignore` of `*`), so it travels to the device only when named in `carry`:

    carry: [".whl", "benchmarks/gpu/artifacts"]
    command: bash benchmarks/gpu/run_on_device.sh

Artifacts (CUDA code is sm_80 PTX, JIT-compiled by the driver on the H200; CPU code is
`cpu = "generic"` so that it runs on the GPU machine's CPU):
  mlp.mln        examples/mlp, variants `cuda` and `cpu`
  placement.mln  examples/placement/app.toml: `hybrid` (embed, head on CPU; blocks on CUDA), `cpu`
  llama.mln      examples/llama at a small size (when the example exists), variants `cuda`, `cpu`
  decoder.mln    benchmarks/gpu/decoder (float16, batch 8 x 512), variant on CUDA only
  pipeline.mln   examples/pipeline/app.toml: `two_gpus` (the decoder's halves on cuda[0] and
                 cuda[1]), `one_gpu`, `cpu`
  dlpack.mln     benchmarks/gpu/dlpack: device results in MyeLiN's memory (`cuda`, `cpu`)
  q4kernel.mln   benchmarks/gpu/q4kernel: q4 weights through the q4 Hopper kernel (needs Triton)
  artifacts.json what was built, with sizes and the IREE version
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "benchmarks" / "gpu" / "artifacts"
sys.path.insert(0, str(REPO))
from benchmarks.gpu_suite import TRAVEL_LIMIT, tree_bytes  # noqa: E402

CUDA_AND_CPU = """\
[devices.gpu]
target = "cuda"

[devices.host]
target = "llvm-cpu"
cpu = "generic"

[[variant]]
name = "cuda"
devices = ["gpu"]

[[variant]]
name = "cpu"
devices = ["host"]
"""

# examples/llama's Config at a size that travels (float32: ~2M parameters, 8 MB).
SMALL_LLAMA = dict(vocab=1024, dim=256, layers=2, heads=4, kv_heads=2, ffn=704, max_len=64)


def write_app(folder: Path, name: str, package: Path, devices: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    app = folder / "app.toml"
    app.write_text(f'[app]\nname = "{name}"\npackages = ["{package}"]\n\n{devices}')
    return app


def small_llama_package(folder: Path) -> Path | None:
    """A copy of examples/llama whose graph source builds SMALL_LLAMA (same model code)."""
    example = REPO / "examples" / "llama"
    if not (example / "model.py").is_file():
        return None
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shutil.copy(example / "model.py", folder / "model.py")
    (folder / "small.py").write_text(
        textwrap.dedent(f"""\
        from model import Config, entrypoints


        def build() -> dict:
            return entrypoints(Config(**{SMALL_LLAMA!r}))
        """)
    )
    toml = (example / "plex.toml").read_text()
    if 'source = "model.py:build"' not in toml:
        raise SystemExit("examples/llama/plex.toml no longer names model.py:build; update me")
    (folder / "plex.toml").write_text(toml.replace("model.py:build", "small.py:build"))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ARTIFACTS)
    parser.add_argument("--skip", nargs="*", default=[], help="artifact names not to build")
    args = parser.parse_args(argv)

    from plex.builder import build
    from plex.builder.versions import versions

    out: Path = args.out.resolve()  # paths are printed relative to the repository
    out.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text("*\n")
    apps = out / "apps"
    jobs: dict[str, Path] = {
        "mlp": write_app(apps / "mlp", "mlp-gpu", REPO / "examples" / "mlp", CUDA_AND_CPU),
        "placement": REPO / "examples" / "placement" / "app.toml",
        "pipeline": REPO / "examples" / "pipeline" / "app.toml",
        "dlpack": REPO / "benchmarks" / "gpu" / "dlpack" / "app.toml",
        "q4kernel": REPO / "benchmarks" / "gpu" / "q4kernel" / "app.toml",
        "decoder": write_app(
            apps / "decoder",
            "decoder",
            REPO / "benchmarks" / "gpu" / "decoder",
            '[devices.gpu]\ntarget = "cuda"\n',
        ),
    }
    llama = small_llama_package(apps / "llama_small")
    if llama is not None:
        jobs["llama"] = write_app(apps / "llama", "llama-small", llama, CUDA_AND_CPU)
    else:
        print("examples/llama is not there: no llama.mln")
    record = {"iree": versions(), "built": time.strftime("%Y-%m-%d %H:%M:%S"), "files": {}}
    for name, app in jobs.items():
        if name in args.skip:
            continue
        target = out / f"{name}.mln"
        result = build(app, target)
        print(f"{target.relative_to(REPO)}: {target.stat().st_size:,} B in {result.seconds:.0f} s")
        record["files"][target.name] = {
            "app": str(app.relative_to(REPO)),
            "bytes": target.stat().st_size,
            "variants": [v.name for v in result.app.variants],
        }
    (out / "artifacts.json").write_text(json.dumps(record, indent=1))
    wheels = sorted((REPO / ".whl").glob("iree_base_runtime-*-cp312-*.whl"))
    if not wheels:
        print("missing: .whl/iree_base_runtime-3.13.0-cp312-*.whl (see benchmarks/gpu/README.md)")
        return 1
    carried = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    total = carried + wheels[-1].stat().st_size + tree_bytes()
    print(
        f"travelling: {total / 2**20:.1f} MiB of {TRAVEL_LIMIT / 2**20:.0f} MiB (artifacts, "
        "the wheel and the working tree)"
    )
    return 0 if total < TRAVEL_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
