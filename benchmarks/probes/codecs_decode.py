"""Latency per weight codec on CPU, side by side in one run: the Llama-style decoder's decode step
(examples/llama), or all-MiniLM-L6-v2 as shipped, with data tiling (examples/minilm, `--model
minilm`: batch 1 and 32, plus the anonymous memory each artifact costs after load and one call).

    python benchmarks/probes/codecs_decode.py [--model llama|minilm] [--codecs fp32,fp16,int8,q4]
                                       [--rounds 12] [--steps 8] [--cpu host] [--mln-dir DIR]
                                       [--kv-on-device] [--control]
                                       [--batches 1 32]

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
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from codec_builds import build_codec

PROMPT = [1, 306, 4658, 278, 6635, 29892]


def decode_step(path: Path, on_device: bool = False):
    """A callable running one decode step of the model at `path` with fixed inputs. With
    `on_device` the KV caches stay device arrays (prefill and decode return them so, as a
    generation loop feeding them back would) and only the logits come back to the host."""
    import myelin

    model = myelin.Instance().load(path)
    session = model.session()
    prefill, decode = session.resolve("prefill"), session.resolve("decode")
    output = "device" if on_device else "numpy"
    logits, k, v = prefill(np.array([PROMPT], dtype=np.int64), output=output)
    logits = np.asarray(logits.to_host()) if on_device else logits
    token = np.array([[int(np.argmax(logits[0]))]], dtype=np.int64)
    pos = np.array([len(PROMPT)], dtype=np.int64)

    def step() -> np.ndarray:
        result = decode(token, pos, k, v, output=output)[0]
        return np.asarray(result.to_host()) if on_device else result

    step.keep = (model, session)  # type: ignore[attr-defined]
    return step


REPO = Path(__file__).resolve().parents[2]
# Run in a fresh process per artifact: anonymous memory (KiB, /proc/self/smaps_rollup) before
# loading and after the first call, so each codec's cost is measured alone; and the time from
# load to the end of the first call (a data-tiled build decodes and packs its weights then).
_MEMORY_PROBE = """
import json, sys, time
import numpy as np
import myelin

def anonymous():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1])

ids, mask = np.load(sys.argv[2]), np.load(sys.argv[3])
before = anonymous()
start = time.perf_counter()
model = myelin.Instance().load(sys.argv[1])
with model.session() as s:
    s.call("forward", ids, mask)
    ready = time.perf_counter() - start
    print(json.dumps({"anonymous_kib": anonymous() - before, "first_call_s": ready}))
"""


def minilm_inputs(folder: Path) -> dict[int, tuple[Path, Path]]:
    """The 32 sentences of examples/minilm tokenized: batch 32 and its first sentence."""
    sys.path.insert(0, str(REPO / "benchmarks" / "probes"))
    from codecs_accuracy import example

    module = example("minilm")
    sentences = (REPO / "examples" / "minilm" / "sentences.txt").read_text().splitlines()
    ids, mask = module.tokenize(sentences)
    paths = {}
    for batch in (1, 32):
        p = (folder / f"ids{batch}.npy", folder / f"mask{batch}.npy")
        np.save(p[0], ids[:batch])
        np.save(p[1], mask[:batch])
        paths[batch] = p
    return paths


# The A/A row of `--control`: fp32's artifact loaded a second time, timed as one more codec.
CONTROL = "fp32 again"


def minilm(codecs: list[str], paths: dict[str, Path], args, folder: Path) -> None:
    """Forward latency at batch 1 and 32 per codec (each runtime timed in chunks of
    `--steps` calls, in a fresh random order per round: worker threads spin a while after a
    call and would slow the next codec, and a fixed rotation gives each codec the same
    predecessor every round), and the anonymous memory of each artifact.

    Next to the wall time, the CPU time of the process per call (all its threads): on this
    shared machine other processes take cores away during a call, which lengthens its wall
    time but not the CPU time the call's work needs. With `--control` the fp32 artifact is
    loaded twice and the second copy is timed as one more codec: its ratio to fp32 is the
    noise floor of the run (the two run the same program on the same bytes), the yardstick
    for the codecs' ratios."""
    import myelin

    inputs = minilm_inputs(folder)
    memory, first_call = {}, {}
    for codec in codecs:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, str(paths[codec]), *map(str, inputs[32])],
            capture_output=True,
            text=True,
            check=True,
        )
        probe = json.loads(out.stdout.strip().splitlines()[-1])
        memory[codec], first_call[codec] = probe["anonymous_kib"] / 1024, probe["first_call_s"]
    if args.control:
        codecs = [*codecs, CONTROL]
        paths = {**paths, CONTROL: paths["fp32"]}
        memory[CONTROL], first_call[CONTROL] = memory["fp32"], first_call["fp32"]
    models = {c: myelin.Instance().load(paths[c]) for c in codecs}
    sessions = {c: m.session() for c, m in models.items()}
    arrays = {b: (np.load(i), np.load(m)) for b, (i, m) in inputs.items()}
    reference = {b: sessions["fp32"].call("forward", *arrays[b]) for b in arrays}
    for codec in codecs:
        out = sessions[codec].call("forward", *arrays[32])
        ref = reference[32]
        cos = (out * ref).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(ref, axis=1)
        print(f"{codec}: batch 32 mean cosine vs fp32 {cos.mean():.6f}", file=sys.stderr)
    print(
        f"\nall-MiniLM-L6-v2 (examples/minilm, data tiling on); {platform.processor() or '?'}, "
        f"{os.cpu_count()} CPUs, local-task; {args.rounds} rounds x {args.steps} calls, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'codec':<10} {'batch':>5} {'median ms':>10} {'spread ms':>17} {'vs fp32':>8} "
        f"{'ratio spread':>13} {'cpu ms':>8} {'cpu vs fp32':>12} {'cpu ratio spread':>17} "
        f"{'anon MiB':>9} {'load+1st s':>10}"
    )
    shuffle = random.Random(0)
    for batch in args.batches:
        per_round: dict[str, list[float]] = {c: [] for c in codecs}
        cpu_round: dict[str, list[float]] = {c: [] for c in codecs}
        for _ in range(args.rounds):
            order = codecs[:]
            shuffle.shuffle(order)
            for codec in order:
                times = []
                cpu_start = time.process_time()
                for _ in range(args.steps):
                    start = time.perf_counter()
                    sessions[codec].call("forward", *arrays[batch])
                    times.append(time.perf_counter() - start)
                cpu_round[codec].append((time.process_time() - cpu_start) / args.steps)
                per_round[codec].append(statistics.median(times))
        for codec in codecs:
            ms = [t * 1e3 for t in per_round[codec]]
            ratios = [t / f for t, f in zip(per_round[codec], per_round["fp32"], strict=True)]
            cpu = [t / f for t, f in zip(cpu_round[codec], cpu_round["fp32"], strict=True)]
            print(
                f"{codec:<10} {batch:>5} {statistics.median(ms):>10.2f} "
                f"{min(ms):>8.2f}-{max(ms):<8.2f} {statistics.median(ratios):>8.2f} "
                f"{min(ratios):>6.2f}-{max(ratios):<6.2f} "
                f"{statistics.median(cpu_round[codec]) * 1e3:>8.2f} "
                f"{statistics.median(cpu):>12.2f} "
                f"{min(cpu):>8.2f}-{max(cpu):<8.2f} {memory[codec]:>9.1f} "
                f"{first_call[codec]:>10.2f}"
            )
        print(f"(batch {batch} done, load {os.getloadavg()[0]:.1f})")
    for s in sessions.values():
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("llama", "minilm"), default="llama")
    parser.add_argument("--codecs", default="fp32,fp16,bf16,int8,q4")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed calls per codec per round")
    parser.add_argument("--cpu", default="host", help="[devices.cpu] cpu of the builds")
    parser.add_argument("--mln-dir", type=Path, help="use <codec>.mln from here (else build)")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 32], choices=(1, 32), help="minilm"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="minilm: time fp32's artifact loaded a second time too (the run's noise floor)",
    )
    parser.add_argument(
        "--kv-on-device",
        action="store_true",
        help="llama: keep the KV caches as device arrays between calls (logits to the host)",
    )
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    assert codecs[0] == "fp32", "the first codec is the reference: fp32"

    folder = args.mln_dir or Path(tempfile.mkdtemp(prefix="codecs-decode-"))
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "" if args.model == "llama" else "minilm_"
    paths = {}
    for codec in codecs:
        path = folder / f"{prefix}{codec.replace(':', '_')}.mln"
        paths[codec] = (
            path if path.exists() else build_codec(args.model, codec, folder, args.cpu, prefix)
        )
    if args.model == "minilm":
        minilm(codecs, paths, args, folder)
        return
    steps = {codec: decode_step(path, args.kv_on_device) for codec, path in paths.items()}
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
        + ("; KV caches on the device" if args.kv_on_device else "")
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
