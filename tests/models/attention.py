"""One attention core written out for the FP8 tests: a fused QKV projection, BMM1, softmax,
BMM2 and an output projection (rules F01, F08 and the mixed plan's attention)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TinyAttention"]


class TinyAttention(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(dim=-1)
        return self.proj(probs @ v)
