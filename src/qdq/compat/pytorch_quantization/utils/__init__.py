"""``pytorch_quantization.utils``: :func:`reduce_amax` and the logging helper."""

from __future__ import annotations

from qdq.compat.pytorch_quantization.utils import quant_logging
from qdq.compat.pytorch_quantization.utils.reduce_amax import reduce_amax

__all__ = ["quant_logging", "reduce_amax"]
