"""Issue 17's GEMV kernel configs as PLeX builds, one `.mln` per config (built here, timed there).

    python benchmarks/gpu/gemv_configs.py -o ART   # ART/gemv_<config>.mln, ART/gemv_configs.json

Each build is benchmarks/gpu/tunekern (`gemv_nk`: 1 x 8192 by a 28672 x 8192 weight, x W^T;
`gemv_kn`: by its 8192 x 28672 transpose, x W) on the Triton kernel library with one
`kernel-config` entry per layout, both with the candidate's knobs, written as a tuning package
(the tuning database's own form, myelin.kernels._space.kernel_entry), so every candidate runs
through exactly the path a tuned build takes. The tuned config of
benchmarks/gpu/tunekern_tuned (16x128x256, 8 warps, 3 stages) is the first.
`kernels_h200.py --gemv-configs ART/gemv_configs.json` times them interleaved with torch.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from matmul_configs import build_tuned

from myelin.kernels._space import kernel_entry, violations
from myelin.kernels._triton import MatmulConfig

HERE = Path(__file__).resolve().parent
N, K = 28672, 8192
# (block_m, block_n, block_k, num_warps, num_stages, persistent): the tuned config before the
# sweep; tl.dot configs with less shared memory (2 blocks per SM) or narrower column blocks
# (more of them, so the last wave is a smaller part); the CUDA-core GEMV (block_m 1) at several
# tile widths. The first round (2026-12-02) also had persistent TMA kernels over 448 / 896
# column tiles (16x64x256 w4 s4/s5, 16x32x512 w4 s4, 16x64x128 w4 s6), which the constraints
# allowed then: they lost (benchmarks/history.md), so the constraints refuse them again.
CANDIDATES = (
    (16, 128, 256, 8, 3, False),
    (16, 64, 128, 4, 4, False),
    (16, 128, 128, 8, 3, False),
    (16, 64, 256, 4, 2, False),
    (16, 32, 256, 4, 4, False),
    (16, 64, 256, 4, 4, False),
    (1, 64, 256, 4, 2, False),
    (1, 32, 256, 4, 2, False),
    (1, 128, 128, 4, 2, False),
    (1, 64, 512, 8, 2, False),
    (1, 16, 512, 2, 2, False),
    (1, 128, 256, 8, 2, False),
    # round 2, around the first round's winner (1x128x128, 4 warps)
    (1, 256, 128, 8, 2, False),
    (1, 128, 128, 8, 2, False),
    (1, 256, 64, 4, 2, False),
    (1, 128, 64, 4, 2, False),
    (1, 64, 128, 4, 2, False),
    (1, 64, 128, 2, 2, False),
    (1, 256, 64, 8, 2, False),
    (1, 128, 128, 4, 3, False),
)


def configs(b_transposed: bool) -> list[MatmulConfig]:
    return [
        MatmulConfig("f16", "f16", b_transposed, bm, bn, bk, 1, w, s, persistent=p)
        for bm, bn, bk, w, s, p in CANDIDATES
    ]


def build_one(pair: tuple[MatmulConfig, MatmulConfig], out: Path, work: Path) -> None:
    entries = {}
    for config in pair:
        op = "matmul_transpose_b" if config.b_transposed else "matmul"
        entries[op] = kernel_entry(
            op, "f16", "f16", 1, N, K, config, arch="sm_90a", triton="3.9.0", iree="3.13.0"
        )
    build_tuned(entries, HERE / "tunekern", "gemv_config", work / pair[0].name, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    listing = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, pair in enumerate(zip(configs(True), configs(False), strict=True)):
            for config in pair:
                why = violations(config, 1, N, K)
                if why:
                    raise SystemExit(f"{config.name}: {why[0]}")
            label = pair[0].name.replace("_abt", "")
            out = args.out / f"gemv_{label.removeprefix('plex_matmul_')}.mln"
            if not out.exists():
                build_one(pair, out, Path(tmp))
            listing.append(
                {"name": label, "mln": out.name, "kernels": [c.name for c in pair], "tuned": i == 0}
            )
            print(f"built {out}", flush=True)
    (args.out / "gemv_configs.json").write_text(json.dumps(listing, indent=1))


if __name__ == "__main__":
    main()
