"""Quantization primitives (pure functions) and the ``Quantizer`` module."""

from __future__ import annotations

from qdq.quant.learned import StaleStateError
from qdq.quant.primitives import (
    MIN_AMAX,
    MIN_SCALE,
    fake_quant,
    fake_quant_unchecked,
    quant_range,
    scale_from_amax,
)
from qdq.quant.quantizer import (
    Quantizer,
    QuantMode,
    ScaleShapeError,
    quantizer_mode,
    quantizers_of,
)

__all__ = [
    "MIN_AMAX",
    "MIN_SCALE",
    "QuantMode",
    "Quantizer",
    "ScaleShapeError",
    "StaleStateError",
    "fake_quant",
    "fake_quant_unchecked",
    "quant_range",
    "quantizer_mode",
    "quantizers_of",
    "scale_from_amax",
]
