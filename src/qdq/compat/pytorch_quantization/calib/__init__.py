"""``pytorch_quantization.calib``: :class:`MaxCalibrator` and :class:`HistogramCalibrator`."""

from __future__ import annotations

from qdq.compat.pytorch_quantization.calib.histogram import HistogramCalibrator
from qdq.compat.pytorch_quantization.calib.max import MaxCalibrator

__all__ = ["HistogramCalibrator", "MaxCalibrator"]
