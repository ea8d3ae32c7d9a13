"""``pytorch_quantization.calib``: calibrators that collect statistics and compute amax.

:class:`MaxCalibrator` (running absolute maximum), :class:`HistogramCalibrator` (entropy, mse,
percentile on upstream's histogram, or qdq's with ``grid="qdq"``) and :func:`calibrate_weights`.
"""

from __future__ import annotations

from qdq.compat.pytorch_quantization.calib.histogram import HistogramCalibrator, calibrate_weights
from qdq.compat.pytorch_quantization.calib.max import MaxCalibrator

__all__ = ["HistogramCalibrator", "MaxCalibrator", "calibrate_weights"]
