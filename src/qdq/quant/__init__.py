"""Quantization primitives (pure functions) and the ``Quantizer`` module."""

from __future__ import annotations

from qdq.quant.block_quantizer import BlockQuantizer, make_quantizer
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
    "BlockQuantizer",
    "QuantMode",
    "Quantizer",
    "ScaleShapeError",
    "StaleStateError",
    "fake_quant",
    "fake_quant_unchecked",
    "make_quantizer",
    "quant_range",
    "quantizer_mode",
    "quantizers_of",
    "scale_from_amax",
]
