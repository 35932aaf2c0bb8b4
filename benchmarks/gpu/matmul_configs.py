"""Matmul 8192^3 kernel configs as PLeX builds, one `.mln` per config (built here, timed there).

    python benchmarks/gpu/matmul_configs.py -o ART        # ART/mm_<config>.mln, ART/mm_configs.json

Each build is benchmarks/gpu/kernels (the H200 benchmark's graph: `matmul` with dynamic M) on
the Triton kernel library with one `kernel-config` entry for the shape `matmul f16->f16 M=?
N=8192 K=8192`, written as a tuning package (the tuning database's own form,
myelin.kernels._space.kernel_entry), so every candidate runs through exactly the path a tuned
build takes. The library's own config is the first. `kernels_h200.py --configs ART/mm_configs.json`
times them interleaved with torch in one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from myelin.kernels import choose_matmul_config
from myelin.kernels._space import kernel_entry, violations
from myelin.kernels._triton import MatmulConfig

HERE = Path(__file__).resolve().parent
SHAPE = {"op": "matmul", "dtype": "f16", "out_dtype": "f16", "m": None, "n": 8192, "k": 8192}
# Next to the library's config (128x256x64, 8 warps, 3 stages, groups of 8, persistent TMA):
# the same tile without persistence (the library's config before), and the persistent kernel's
# open knobs (group size; 128x128 tiles, which fit 4 stages beside the TMA store's C tile).
CANDIDATES = (
    {"persistent": False},
    {"group_m": 16},
    {"group_m": 4},
    {"block_n": 128, "num_stages": 4},
)


def build_tuned(entries: dict, graph_package: Path, name: str, tuning: Path, out: Path) -> None:
    """Build `graph_package` on the kernel library with `entries` (kernel_entry records) as a
    tuning package of its own in `tuning`: the path a tuned build takes (gemv_configs.py too)."""
    from plex.builder import build
    from plex.tune._database import SCHEMA

    tuning.mkdir(parents=True)
    (tuning / "tuning.json").write_text(json.dumps({"schema": SCHEMA, "entries": entries}))
    (tuning / "plex.toml").write_text(
        f'[package]\nname = "{name}"\n\n[tuning.hopper]\ntarget = "cuda"\nkernels = "tuning.json"\n'
    )
    app = tuning / "app.toml"
    app.write_text(
        f'[app]\nname = "{name.replace("_", "-")}"\npackages = ["{graph_package}", "{tuning}"]\n\n'
        '[devices.hopper]\ntarget = "cuda"\nkernels = "triton"\n\n'
        '[[variant]]\nname = "hopper"\ndevices = ["hopper"]\n\n'
        f'[myelin]\ntuning = "{name}:hopper"\n'
    )
    build(app, out)


def build_one(config: MatmulConfig, out: Path, work: Path) -> None:
    entry = kernel_entry(
        SHAPE["op"], SHAPE["dtype"], SHAPE["out_dtype"], SHAPE["m"], SHAPE["n"], SHAPE["k"],
        config, arch="sm_90a", triton="3.9.0", iree="3.13.0",
    )  # fmt: skip
    build_tuned({"c": entry}, HERE / "kernels", "mm_config", work / config.name, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    library = choose_matmul_config("f16", "f16", False, None, 8192, 8192)
    configs = [library] + [dataclasses.replace(library, **c) for c in CANDIDATES]
    listing = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in configs:
            why = violations(config, None, 8192, 8192)
            if why:
                raise SystemExit(f"{config.name}: {why[0]}")
            out = args.out / f"mm_{config.name}.mln"
            build_one(config, out, Path(tmp))
            listing.append({"name": config.name, "mln": out.name, "library": config == library})
            print(f"built {out}")
    (args.out / "mm_configs.json").write_text(json.dumps(listing, indent=1))


if __name__ == "__main__":
    main()
