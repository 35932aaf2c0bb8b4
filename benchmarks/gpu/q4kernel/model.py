"""The q4 Hopper kernel's GPU check (tests/gpu/test_cuda_q4_kernel.py): two float16 Linear layers
(1024 -> 2816 and back, a contracted size that is no power of two) called alone at batch 8 and
1, so that each q4 kernel's result can be compared with numpy on the decoded weights."""

from __future__ import annotations

import torch
from torch import nn


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(1024, 2816, bias=False)
        self.down = nn.Linear(2816, 1024, bias=False)

    def up_proj(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)

    def down_proj(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(x)


def build() -> dict:
    torch.manual_seed(0)
    model = Layers().half().eval()
    return {
        "up8": (model.up_proj, (torch.zeros(8, 1024, dtype=torch.float16),)),
        "up1": (model.up_proj, (torch.zeros(1, 1024, dtype=torch.float16),)),
        "down8": (model.down_proj, (torch.zeros(8, 2816, dtype=torch.float16),)),
        "down_b8": (model.down_proj, (torch.zeros(8, 1, 2816, dtype=torch.float16),)),
    }
