"""Greedy generation with the Llama-style decoder built from this folder, through MyeLiN.

    plex build examples/llama/app.toml -o llama.mln
    python examples/llama/generate.py llama.mln --steps 32 --check

`prefill` takes the prompt and returns the first logits plus the KV cache; each `decode` call
takes one token, its position and the cache, and returns the next logits and the updated cache.
The weights are seeded random, so the tokens mean nothing; `--check` runs the same greedy loop
in torch eager and compares token ids and logits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from model import Config, eager, generate, make_model  # noqa: E402

import myelin  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mln", type=Path)
    parser.add_argument("--prompt", type=int, nargs="+", default=[1, 306, 4658, 278, 6635, 29892])
    parser.add_argument("--steps", type=int, default=32, help="tokens to generate")
    parser.add_argument("--check", action="store_true", help="compare with torch eager")
    args = parser.parse_args()

    model = myelin.Instance().load(args.mln)
    with model.session() as session:
        prefill, decode = session.resolve("prefill"), session.resolve("decode")
        start = time.perf_counter()
        ids, logits = generate(prefill, decode, args.prompt, args.steps)
        seconds = time.perf_counter() - start
    print(f"prompt {args.prompt}")
    print(f"generated {ids}")
    print(f"{args.steps} tokens in {seconds:.2f} s ({args.steps / seconds:.1f} tokens/s)")
    model.close()

    if args.check:
        want_ids, want_logits = generate(*eager(make_model(Config())), args.prompt, args.steps)
        pairs = zip(logits, want_logits, strict=True)
        err = max(np.abs(a - b).max() / np.abs(b).max() for a, b in pairs)
        print(f"torch eager: same token ids: {ids == want_ids}; max logits rel. error {err:.2e}")


if __name__ == "__main__":
    main()
