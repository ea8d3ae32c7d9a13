"""``pytorch_quantization.optim``: helpers for quantization-aware training (:mod:`.helper`)."""

from __future__ import annotations

from qdq.compat.pytorch_quantization.optim import helper

__all__ = ["helper"]
