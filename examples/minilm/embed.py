"""Sentences -> embeddings with the .mln built from this folder, through MyeLiN.

    plex build examples/minilm/app.toml -o minilm.mln
    python examples/minilm/embed.py minilm.mln                       # the 32 sample sentences
    python examples/minilm/embed.py minilm.mln "A cat." "A kitten."  # your own

Tokenization runs here (the model's own tokenizer.json); the graph does the rest, including
mean pooling and normalization, so the dot product of two embeddings is their cosine similarity.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from model import tokenize  # noqa: E402

import myelin  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mln", type=Path)
    parser.add_argument("sentences", nargs="*")
    args = parser.parse_args()
    sentences = args.sentences or (HERE / "sentences.txt").read_text().splitlines()

    model = myelin.Instance().load(args.mln)
    ids, mask = tokenize(sentences)
    with model.session() as session:
        forward = session.resolve("forward")
        forward(ids, mask)  # the first call also maps weights and warms the thread pool
        start = time.perf_counter()
        embeddings = forward(ids, mask)
        seconds = time.perf_counter() - start
    print(
        f"{len(sentences)} sentences -> {embeddings.shape[1]}-d embeddings "
        f"in {seconds * 1e3:.1f} ms (batch {ids.shape[0]}, {ids.shape[1]} tokens)"
    )

    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -1.0)
    best = np.argsort(similarity, axis=None)[::-1][: min(10, len(sentences)) : 2]
    for flat in best:
        i, j = divmod(int(flat), len(sentences))
        print(f"{similarity[i, j]:.3f}  {sentences[i]!r} ~ {sentences[j]!r}")
    model.close()


if __name__ == "__main__":
    main()
