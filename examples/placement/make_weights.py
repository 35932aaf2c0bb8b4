"""Regenerate params.safetensors (seeded, so the file in the repository is reproducible)."""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(0)


def normal(*shape: int, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)


tensors = {"embed.table": normal(256, 64, scale=0.5), "head.w": normal(64, 256, scale=0.125)}
for i in range(2):
    tensors[f"blocks.{i}.w1"] = normal(64, 128, scale=0.125)
    tensors[f"blocks.{i}.b1"] = normal(128, scale=0.1)
    tensors[f"blocks.{i}.w2"] = normal(128, 64, scale=0.09)
save_file(tensors, str(Path(__file__).with_name("params.safetensors")))
