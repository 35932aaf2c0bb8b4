"""Does a decode step's cost grow with the KV cache's allocated length? (docs/llm.md)

    python benchmarks/llm_kv_cache.py [--max-seq 64 1024 4096] [--filled 16 48] [--steps 40]

Builds one seeded Llama-shaped model (4 layers, hidden 256, 4 heads / 4 KV heads: 8 KiB of
cache per slot and sequence) with each `max_seq`, so the module state holds from 0.5 to 32 MiB
of cache, and times decode steps of the same sequence (prompt + `filled` tokens) on each. If
IREE copied the cache global on every step instead of writing the new slot in place, a step
would grow with max_seq (copying 32 MiB takes milliseconds here); if attention read every
allocated slot, it would grow too. Rounds interleave the builds; the table has the median of
the per-round step medians with their spread (min-max over rounds), the ratio to the smallest
max_seq at the same filling, the bytes each step moves between host and device (token ids and
positions in, the mask in, logits out) and the transient device memory the step allocates,
from the build's own formula over the decode's input shapes (`Model.call_need`): with a copy
of the cache per step that grows with max_seq; with in-place writes only with the tokens held.
The CPU model and the load average before and after are printed with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_model(folder: Path) -> None:
    import torch
    import transformers

    from tests.llm.tiny_models import COMMON, write_tokenizer

    config = transformers.LlamaConfig(
        **COMMON,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    write_tokenizer(folder)


def build(root: Path, model: Path, max_seq: int) -> Path:
    from plex.builder import build as plex_build

    pkg = root / f"lm{max_seq}"
    pkg.mkdir()
    shutil.copytree(model, pkg / "model")
    (pkg / "plex.toml").write_text(
        textwrap.dedent(
            f"""
            [package]
            name = "lm{max_seq}"

            [graph.lm]
            source = "model"
            frontend = "causal-lm"
            max_seq = {max_seq}
            """
        )
    )
    app = root / f"app{max_seq}.toml"
    app.write_text(
        f'[app]\nname = "lm{max_seq}"\npackages = ["lm{max_seq}"]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-task"\ncpu = "host"\n'
    )
    out = root / f"lm{max_seq}.mln"
    plex_build(app, out)
    return out


def step_times(session, filled: int, steps: int) -> list[float]:
    """Prefill `filled` tokens, then time `steps` decode steps from there (restarting the
    sequence whenever it would pass filled + 8, so every step sees about the same length)."""
    times = []
    prompt = np.arange(1, filled + 1, dtype=np.int64)[None]
    positions = np.arange(filled, dtype=np.int64)[None]
    while len(times) < steps:
        session.call("prefill", prompt, positions, np.ones_like(prompt))
        for k in range(8):
            inputs = decode_inputs(filled + k)
            t0 = time.perf_counter()
            session.call("decode", *inputs, output="numpy")
            times.append(time.perf_counter() - t0)
    return times


def decode_inputs(filled: int) -> list[np.ndarray]:
    """A decode step's inputs when the sequence holds `filled` tokens before it."""
    return [np.array([[5]]), np.array([[filled]]), np.ones((1, filled + 1), dtype=np.int64)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seq", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--filled", type=int, nargs="+", default=[16, 48])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import myelin
    from myelin import hostinfo
    from myelin.runtime.generation import Generator

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_model(root / "model")
        built = {}
        for max_seq in args.max_seq:
            t0 = time.perf_counter()
            built[max_seq] = build(root, root / "model", max_seq)
            print(f"built max_seq {max_seq} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        models = {m: myelin.Instance().load(p) for m, p in built.items()}
        generators = {m: Generator(model) for m, model in models.items()}
        load_before = os.getloadavg()
        results: dict[tuple[int, int], list[float]] = {}
        for _ in range(args.rounds):
            for filled in args.filled:
                for max_seq, g in generators.items():
                    times = step_times(g.session, filled, args.steps)
                    results.setdefault((max_seq, filled), []).append(statistics.median(times))
        load_after = os.getloadavg()
        vocab = generators[args.max_seq[0]].vocab
        smallest = min(args.max_seq)
        print(
            f"{hostinfo.cpu_name()}, {os.cpu_count()} cores, local-task; load average "
            f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; {args.rounds} rounds of "
            f"{args.steps} decode steps"
        )
        print(
            "| max_seq | cache (MiB) | filled | decode step (ms, median [min-max]) "
            f"| vs max_seq {smallest} | bytes in+out | transient bytes |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for (max_seq, filled), medians in sorted(results.items()):
            cache = generators[max_seq].cache_bytes / 2**20
            moved = 8 + 8 + 8 * (filled + 1) + 4 * vocab  # ids, position, mask in; logits out
            transient = models[max_seq].call_need("decode", decode_inputs(filled)).transient
            step = statistics.median(medians)
            ratio = step / statistics.median(results[(smallest, filled)])
            print(
                f"| {max_seq} | {cache:.1f} | {filled} | {step * 1e3:.3f} "
                f"[{min(medians) * 1e3:.3f}-{max(medians) * 1e3:.3f}] | {ratio:.2f}x "
                f"| {moved:,} | {transient:,} |"
            )
        for g in generators.values():
            g.close()


if __name__ == "__main__":
    main()
