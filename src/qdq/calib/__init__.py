"""Calibrators: collect statistics once, compute amax by any method."""

from __future__ import annotations

from qdq.calib.base import CalibrationError, Calibrator
from qdq.calib.histogram import HistogramCalibrator
from qdq.calib.max import MaxCalibrator
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax
from qdq.config import CalibSpec, QuantSpec

__all__ = [
    "CalibrationError",
    "Calibrator",
    "HistogramCalibrator",
    "MaxCalibrator",
    "entropy_amax",
    "make_calibrator",
    "mse_amax",
    "percentile_amax",
]


def make_calibrator(spec: QuantSpec, calib: CalibSpec) -> Calibrator:
    """Build the calibrator ``calib`` asks for, for a tensor quantized as ``spec``.

    A histogram calibrator optimises for ``spec.format`` (``"mse"`` on the FP8 grid for
    ``"fp8"``, which has no ``"entropy"``); a max calibrator is the same for every format.

    Raises:
        ValueError: a histogram calibrator for a per-channel spec (histograms are per tensor).

    Example:
        >>> make_calibrator(QuantSpec(format="fp8"), CalibSpec())
        HistogramCalibrator(num_bins=2048, fmt='fp8', batches=0, max=0)
    """
    if calib.calibrator == "max":
        return MaxCalibrator(axis=spec.axis)
    if spec.axis is not None:
        raise ValueError(
            f"per-channel quantization (axis={spec.axis}) needs calibrator='max'; "
            "histogram calibrators are per tensor"
        )
    return HistogramCalibrator(calib.num_bins, num_bits=spec.num_bits, fmt=spec.format)
