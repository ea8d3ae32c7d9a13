"""qdq: PyTorch → TensorRT-ready INT8 Q/DQ models, automatically and explainably.

The public verbs live here. Optional backends (onnxruntime, tensorrt) are imported lazily by the
functions that need them, so ``import qdq`` needs only torch and numpy.

Example:
    >>> import torch, qdq
    >>> qdq.fake_quant(torch.tensor([0.3, -2.0]), amax=1.0)
    tensor([ 0.2992, -1.0079])
"""

from __future__ import annotations

# first: OpenMP's wait policy must be set before torch loads it (qdq._threads)
from qdq import _threads as _threads
from qdq import debug, lint, nn, qat

# imported for what it does on import: it registers the fused kernels' self-check, without which
# qdq.kernels serves no device (any ``import qdq.x`` runs this file first)
from qdq import kernel_check as kernel_check
from qdq._version import __version__
from qdq.accuracy import AutoQuantResult, Sensitivity, auto_quantize, sensitivity
from qdq.api import (
    calibrate,
    calibrate_from,
    calibrate_parts,
    copy_prepared,
    plan_of,
    prepare,
    quantizers_of,
    recompute_amax,
)
from qdq.calib import (
    CalibrationError,
    Calibrator,
    HistogramCalibrator,
    MaxCalibrator,
    make_calibrator,
)
from qdq.config import CalibSpec, Override, QuantConfig, QuantSpec
from qdq.export import ExportError, ExportResult, export_onnx, load_calibration
from qdq.pipeline import QuantizeResult, quantize
from qdq.quant import Quantizer, QuantMode, fake_quant, quantizer_mode, scale_from_amax

__all__ = [
    "AutoQuantResult",
    "CalibSpec",
    "CalibrationError",
    "Calibrator",
    "ExportError",
    "ExportResult",
    "HistogramCalibrator",
    "MaxCalibrator",
    "Override",
    "QuantConfig",
    "QuantMode",
    "QuantSpec",
    "QuantizeResult",
    "Quantizer",
    "Sensitivity",
    "__version__",
    "auto_quantize",
    "calibrate",
    "calibrate_from",
    "calibrate_parts",
    "copy_prepared",
    "debug",
    "export_onnx",
    "fake_quant",
    "lint",
    "load_calibration",
    "make_calibrator",
    "nn",
    "plan_of",
    "prepare",
    "qat",
    "quantize",
    "quantizer_mode",
    "quantizers_of",
    "recompute_amax",
    "scale_from_amax",
    "sensitivity",
]
