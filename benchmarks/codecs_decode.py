"""Decode-step latency of the Llama-style decoder (examples/llama) per weight codec, on CPU, in one
run: fp32 vs fp16 vs bf16 vs int8 vs q4.

    python benchmarks/codecs_decode.py [--codecs fp32,fp16,int8,q4] [--rounds 12] [--steps 8]
                                       [--cpu host] [--mln-dir DIR]

Each codec's artifact is built from examples/llama with `[weights.codec] "*" = <codec>` (through
the normal build cache; `--mln-dir` reuses `<codec>.mln` files there). Every model runs the same
prompt through `prefill`, then the timed work is one `decode` step (one token, position 6, the
prompt's KV cache) called again and again with the same inputs. Within a round the codecs take
turns call by call (A B C A B C ..., a fresh random order each round), so drift in the machine's
speed hits all codecs alike. The table reports the median over rounds of each round's median,
the spread (min-max) of the per-round medians, and the ratio to fp32 with its spread over
rounds. A decode step reads every weight once, so it is bound by memory bandwidth: the bytes a
step streams shrink with the codec, the arithmetic grows (the decode runs inside each matmul).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from codec_builds import build_codec

PROMPT = [1, 306, 4658, 278, 6635, 29892]


def decode_step(path: Path):
    """A callable running one decode step of the model at `path` with fixed inputs."""
    import myelin

    model = myelin.Instance().load(path)
    session = model.session()
    prefill, decode = session.resolve("prefill"), session.resolve("decode")
    logits, k, v = prefill(np.array([PROMPT], dtype=np.int64))
    token = np.array([[int(np.argmax(logits[0]))]], dtype=np.int64)
    pos = np.array([len(PROMPT)], dtype=np.int64)

    def step() -> np.ndarray:
        return decode(token, pos, k, v)[0]

    step.keep = (model, session)  # type: ignore[attr-defined]
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", default="fp32,fp16,bf16,int8,q4")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed calls per codec per round")
    parser.add_argument("--cpu", default="host", help="[devices.cpu] cpu of the builds")
    parser.add_argument("--mln-dir", type=Path, help="use <codec>.mln from here (else build)")
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    assert codecs[0] == "fp32", "the first codec is the reference: fp32"

    folder = args.mln_dir or Path(tempfile.mkdtemp(prefix="codecs-decode-"))
    paths = {}
    for codec in codecs:
        path = folder / f"{codec.replace(':', '_')}.mln"
        paths[codec] = path if path.exists() else build_codec("llama", codec, folder, args.cpu)
    steps = {codec: decode_step(path) for codec, path in paths.items()}
    reference = steps["fp32"]()
    for codec, step in steps.items():  # warm up, and show the step's error against fp32
        out = step()
        err = np.abs(out - reference).max() / np.abs(reference).max()
        print(f"{codec}: logits max rel err vs fp32 {err:.2e}", file=sys.stderr)

    per_round: dict[str, list[float]] = {c: [] for c in codecs}
    for _ in range(args.rounds):
        times: dict[str, list[float]] = {c: [] for c in codecs}
        for _ in range(args.steps):
            order = codecs[:]
            random.shuffle(order)
            for codec in order:
                start = time.perf_counter()
                steps[codec]()
                times[codec].append(time.perf_counter() - start)
        for codec in codecs:
            per_round[codec].append(statistics.median(times[codec]))

    from myelin.codecs import bytes_by_codec
    from myelin.mln import MlnReader

    print(
        f"\nLlama-style decoder (examples/llama), one decode step; {platform.processor() or '?'}"
        f", {os.cpu_count()} CPUs, local-task; {args.rounds} rounds x {args.steps} calls"
    )
    print(
        f"{'codec':<10} {'weights':>10} {'median ms':>10} {'spread ms':>16} "
        f"{'vs fp32':>8} {'ratio spread':>14}"
    )
    for codec in codecs:
        with MlnReader(paths[codec], verify=False) as reader:
            weight_bytes = sum(b for b, _ in bytes_by_codec(reader.manifest["parameters"]).values())
        ms = [t * 1e3 for t in per_round[codec]]
        ratios = [t / f for t, f in zip(per_round[codec], per_round["fp32"], strict=True)]
        print(
            f"{codec:<10} {weight_bytes / 2**20:>8.1f}Mi {statistics.median(ms):>10.2f} "
            f"{min(ms):>7.2f}-{max(ms):<7.2f} {statistics.median(ratios):>8.2f} "
            f"{min(ratios):>6.2f}-{max(ratios):<6.2f}"
        )


if __name__ == "__main__":
    main()
