"""Small from-scratch models used by the placement tests (no downloads, random init)."""

from __future__ import annotations

from .yolo import (
    C3,
    SPPF,
    Bottleneck,
    C2f,
    CenterNetStyleNet,
    Conv,
    Detect,
    YoloStyleNet,
)

__all__ = [
    "C3",
    "SPPF",
    "Bottleneck",
    "C2f",
    "CenterNetStyleNet",
    "Conv",
    "Detect",
    "YoloStyleNet",
]
