"""PP-OCR's RSE-FPN neck in miniature, written from scratch for the tests: the RSE layer
``x + x * hardsigmoid(se(x))`` (a squeeze-excitation gate with a shortcut) and an FPN top-down
``lateral + upsample(top)`` Add (rule P17)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["RSE", "RSEFPN"]


def cbr(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


class RSE(nn.Module):
    """PP-OCR's RSE layer: ``x = conv(ins)``; ``x + x * hardsigmoid(fc2(relu(fc1(pool(x)))))``."""

    def __init__(self, cin: int = 16, c: int = 32) -> None:
        super().__init__()
        self.in_conv = nn.Conv2d(cin, c, 3, 1, 1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, 16, 1)
        self.fc2 = nn.Conv2d(16, c, 1)

    def forward(self, ins: torch.Tensor) -> torch.Tensor:
        x = self.in_conv(ins)
        return x + x * F.hardsigmoid(self.fc2(F.relu(self.fc1(self.pool(x)))))


class RSEFPN(nn.Module):
    """Two RSE laterals, a top-down ``lateral + upsample(top)`` Add, two RSE outputs, Concat."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = cbr(16, 16)
        self.down = cbr(16, 16, stride=2)
        self.lat2, self.lat3 = RSE(), RSE()
        self.out2, self.out3 = RSE(32, 16), RSE(32, 16)
        self.head = nn.Conv2d(32, 16, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c2 = self.stem(x)
        c3 = self.down(c2)
        in2, in3 = self.lat2(c2), self.lat3(c3)
        up = F.interpolate(in3, scale_factor=2.0, mode="nearest")
        p2, p3 = self.out2(in2 + up), self.out3(in3)
        return self.head(torch.cat([p2, F.interpolate(p3, scale_factor=2.0)], 1))
