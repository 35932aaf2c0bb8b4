"""Prefill and decode tokens/s of a causal LM on this CPU: PLeX (plex generate's Generator)
against transformers eager `generate`, on the same seeded weights, interleaved.

    python benchmarks/llm_cpu.py [--layers 8] [--hidden 512] [--prompt 128] [--new 128]
                                 [--rounds 3] [--threads 2]

The model is Llama-shaped (8 layers, hidden 512, 8 heads / 4 KV heads, FFN 1408, vocab 32000:
56M parameters, as examples/llama), fp32, built with max_seq = prompt + new. Both sides run
greedy for `--new` tokens from the same `--prompt` random token ids, never stopping at EOS.
transformers: `generate` with its default dynamic cache, `torch.set_num_threads(threads)`;
prefill is timed as one forward over the prompt, decode as (generate time - prefill) / (new - 1).
PLeX: the Generator's own timings (prefill call; decode calls). IREE's local-task driver uses
its own worker threads (one per core here). Prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_model(folder: Path, layers: int, hidden: int) -> None:
    import torch
    import transformers

    from tests.llm.tiny_models import write_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    write_tokenizer(folder)


def build(root: Path, max_seq: int) -> Path:
    from plex.builder import build as plex_build

    (root / "lm" / "plex.toml").write_text(
        textwrap.dedent(
            f"""
            [package]
            name = "lm"

            [graph.lm]
            source = "model"
            frontend = "causal-lm"
            max_seq = {max_seq}
            """
        )
    )
    app = root / "app.toml"
    app.write_text(
        '[app]\nname = "lm"\npackages = ["lm"]\n\n'
        '[devices.cpu]\ntarget = "llvm-cpu"\ndriver = "local-task"\ncpu = "host"\n'
    )
    plex_build(app, root / "lm.mln")
    return root / "lm.mln"


def transformers_run(model, prompt: list[int], new: int) -> tuple[float, float]:
    import torch

    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids, attention_mask=mask)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
        total = time.perf_counter() - t0
    return len(prompt) / prefill, (new - 1) / max(total - prefill, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    import myelin
    from myelin.runtime.generation import Generator

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_model(root / "lm" / "model", args.layers, args.hidden)
        t0 = time.perf_counter()
        mln = build(root, args.prompt + args.new)
        print(f"plex build: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        hf = AutoModelForCausalLM.from_pretrained(
            root / "lm" / "model", local_files_only=True
        ).eval()
        hf.generation_config.eos_token_id = None
        prompt = np.random.default_rng(0).integers(3, 32000, args.prompt).tolist()
        model = myelin.Instance().load(mln)
        rows: dict[str, list[tuple[float, float]]] = {"plex": [], "transformers": []}
        with Generator(model) as generator:
            generator.generate(prompt, max_new_tokens=4, use_eos=False)  # warm up
            for _ in range(args.rounds):
                r = generator.generate(prompt, max_new_tokens=args.new, use_eos=False)
                rows["plex"].append((r.prefill_tokens_per_s, r.decode_tokens_per_s))
                rows["transformers"].append(transformers_run(hf, prompt, args.new))
        model.close()
    params = sum(p.numel() for p in hf.parameters()) / 1e6
    print(
        f"{params:.0f}M-parameter Llama shape, fp32, prompt {args.prompt}, {args.new} new tokens, "
        f"median of {args.rounds}, torch threads {args.threads}"
    )
    print("| | prefill tok/s | decode tok/s |")
    print("|---|---:|---:|")
    for name, values in rows.items():
        prefill = statistics.median(v[0] for v in values)
        decode = statistics.median(v[1] for v in values)
        print(f"| {name} | {prefill:.1f} | {decode:.1f} |")


if __name__ == "__main__":
    main()
