"""Regenerate params.safetensors (seeded, so the file in the repository is reproducible)."""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(7)
tensors = {
    "w": rng.standard_normal((16, 32), dtype=np.float32) / 4,
    "b_enc": rng.standard_normal(32, dtype=np.float32) / 10,
    "b_dec": rng.standard_normal(16, dtype=np.float32) / 10,
}
save_file(tensors, str(Path(__file__).with_name("params.safetensors")))
