"""What a trusted load's private copy costs: load time and memory of the example MLP widened to
6 MiB of weights (16x32 -> 512x2048), signed, loaded under a trust policy with and without
`private_copy`, and without a trust policy (zero-copy; every section hashed in all three).

    python benchmarks/private_copy.py [--loads 15] [--scale 32]

Each mode runs in fresh interpreters: one for the time (a warm-up load, then `--loads` loads
timed, the median), one for the memory (the device created and the file in the page cache,
then one load and one call, RSS read from /proc/self/status before the load and after the
call: VmRSS and its anonymous, file and shared-memory parts). Prints a markdown table for
docs/security.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MEASURE = textwrap.dedent("""\
    import json, statistics, sys, time
    import numpy as np
    import myelin

    path, pub, mode, loads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    instance = myelin.Instance(trust=pub) if mode != "no trust" else myelin.Instance()
    private = {"trust, private_copy": True, "trust, private_copy=False": False}.get(mode)

    def status():
        fields = {}
        for line in open("/proc/self/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
        return fields

    if loads == 0:  # memory: this process has only the device besides what one load adds
        instance.device_registry.devices_for(["local-task"])
        open(path, "rb").read()  # the file in the page cache, as after any earlier load
        before = status()
        model = instance.load(path, private_copy=private)
        x = np.ones((4, model.entrypoint("forward").signature.inputs[0].shape[1]), np.float32)
        with model.session() as session:
            session.call("forward", x)
        after = status()
        print(json.dumps({k: after[k] - before[k] for k in after}))
    else:
        instance.load(path, private_copy=private).close()  # warm: IREE's first load
        times = []
        for _ in range(loads):
            t0 = time.perf_counter()
            model = instance.load(path, private_copy=private)
            times.append(time.perf_counter() - t0)
            model.close()
        print(json.dumps(statistics.median(times) * 1e3))
""")

MODES = ("no trust", "trust, private_copy=False", "trust, private_copy")


def widened_mlp(folder: Path, scale: int) -> Path:
    """examples/mlp with its input and output dims multiplied by `scale` and its hidden dim by
    2 * `scale` (32: 512 -> 2048 -> 256, 6 MiB of f32 weights), seeded; returns the app.toml."""
    from safetensors.numpy import save_file

    shutil.copytree(REPO / "examples" / "mlp", folder)
    dims = {"16": 16 * scale, "32": 32 * scale * 2, "8": 8 * scale}
    text = (folder / "mlp.mlir").read_text()

    def widen(match: re.Match) -> str:
        parts = match.group(1).split("x")
        return "tensor<" + "x".join(str(dims.get(p, p)) for p in parts) + ">"

    (folder / "mlp.mlir").write_text(re.sub(r"tensor<([0-9?x]+xf32)>", widen, text))
    rng = np.random.default_rng(0)
    d_in, d_hidden, d_out = dims["16"], dims["32"], dims["8"]
    save_file(
        {
            "w1": rng.standard_normal((d_in, d_hidden), dtype=np.float32) / d_in,
            "b1": rng.standard_normal(d_hidden, dtype=np.float32) / 10,
            "w2": rng.standard_normal((d_hidden, d_out), dtype=np.float32) / d_hidden,
            "b2": rng.standard_normal(d_out, dtype=np.float32) / 10,
        },
        str(folder / "params.safetensors"),
    )
    (folder / "plex.lock").unlink(missing_ok=True)
    return folder / "app.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=15)
    parser.add_argument("--scale", type=int, default=32)
    args = parser.parse_args()

    from myelin.mln import MlnReader, generate_key_pair, sign_file
    from tests.conftest import build_app

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        artifact = build_app(widened_mlp(root / "mlp", args.scale), root / "wide.mln")
        private, public = generate_key_pair()
        (root / "k.pem").write_bytes(private)
        (root / "k.pub.pem").write_bytes(public)
        sign_file(artifact, root / "k.pem")
        with MlnReader(artifact) as reader:
            weights = sum(s.length for s in reader.sections.values() if s.kind == "parameter")
            size = reader.file_size
        print(
            f"{platform.node()}: {size / 2**20:.1f} MiB file, {weights / 2**20:.1f} MiB of weights"
        )
        print("| load | load time (median) | RSS after load + 1 call | anon | file | shmem |")
        print("|---|---:|---:|---:|---:|---:|")
        for mode in MODES:

            def measure(loads: int, mode: str = mode) -> object:
                done = subprocess.run(
                    [sys.executable, "-c", MEASURE, str(artifact), str(root / "k.pub.pem"),
                     mode, str(loads)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                return json.loads(done.stdout.strip().splitlines()[-1])

            load_ms = measure(args.loads)
            rss = {k: v / 2**20 for k, v in measure(0).items()}
            print(
                f"| {mode} | {load_ms:.1f} ms | +{rss['VmRSS']:.1f} MiB | "
                f"+{rss['RssAnon']:.1f} | +{rss['RssFile']:.1f} | +{rss['RssShmem']:.1f} |"
            )


if __name__ == "__main__":
    main()
