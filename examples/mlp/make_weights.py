"""Regenerate params.safetensors (seeded, so the file in the repository is reproducible)."""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(0)
tensors = {
    "w1": rng.standard_normal((16, 32), dtype=np.float32) / 4,
    "b1": rng.standard_normal(32, dtype=np.float32) / 10,
    "w2": rng.standard_normal((32, 8), dtype=np.float32) / 6,
    "b2": rng.standard_normal(8, dtype=np.float32) / 10,
}
save_file(tensors, str(Path(__file__).with_name("params.safetensors")))
