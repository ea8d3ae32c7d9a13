"""ONNX Runtime ``quantize_static`` rows of ``benchmarks/accuracy.py``, with TensorRT-style options.

Every row quantizes the ``quant_pre_process`` output of the FP32 ONNX with ``QuantFormat.QDQ``,
symmetric S8S8 (``ActivationSymmetric``, ``WeightSymmetric``, ``CalibTensorRangeSymmetric``),
per-channel weights (Conv axis 0, ConvTranspose axis 1), float bias, one Q/DQ pair per weight. The
methods, with their options really applied:

* ``MinMax``;
* ``Percentile`` with ``CalibPercentile=99.99`` (qdq's default percentile), 2048 bins;
* ``Entropy`` with 2048 histogram bins and 128 quantized bins: ``quantize_static`` forwards neither
  ``num_bins`` nor ``num_quantized_bins`` to its calibrator, and with its defaults (128/128) the KL
  search has one candidate, the full range, i.e. MinMax. So the ranges are computed by
  ``create_calibrator(..., extra_options={"num_bins": 2048, "num_quantized_bins": 128})`` and handed
  to ``quantize_static`` as its calibration cache.

Runs in qdq's environment (onnxruntime is a qdq dependency).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from accuracy_table import timed

__all__ = ["METHODS", "preprocess", "quantize"]

METHODS = ("MinMax", "Percentile", "Entropy")
PERCENTILE = 99.99
ENTROPY_BINS = 2048
ENTROPY_QUANTIZED_BINS = 128

#: TensorRT-style options (the same as benchmarks/peers/resnet18_peers.py, plus symmetric ranges)
EXTRA_OPTIONS: dict[str, Any] = {
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    "CalibTensorRangeSymmetric": True,
    "CalibPercentile": PERCENTILE,
    "QuantizeBias": False,
    "AddQDQPairToWeight": True,
    "DedicatedQDQPair": False,
    "ForceQuantizeNoInputCheck": True,
    "QDQOpTypePerChannelSupportToAxis": {"Conv": 0, "ConvTranspose": 1},
}


class _Reader:
    """A ``CalibrationDataReader`` over batches of one input (restartable)."""

    def __init__(self, name: str, calib: np.ndarray, batch: int) -> None:
        self.batches = [{name: calib[i : i + batch]} for i in range(0, len(calib), batch)]
        self.it = iter(self.batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)

    def __len__(self) -> int:
        return len(self.batches)

    def rewind(self) -> None:
        self.it = iter(self.batches)


def _reader(name: str, calib: np.ndarray, batch: int) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(_Reader, CalibrationDataReader):
        pass

    return Reader(name, calib, batch)


def preprocess(fp32: Path, out: Path) -> Path:
    """``quant_pre_process`` (shape inference and ORT's basic optimizations), as ORT recommends."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(fp32), str(out))
    return out


def quantize(pre: Path, out: Path, name: str, calib: np.ndarray, method: str, batch: int) -> float:
    """Quantize ``pre`` into ``out`` by ``method`` (one of :data:`METHODS`); return the seconds
    (of the faster of two runs when under 30 s: :func:`accuracy_table.timed`).

    Raises:
        ValueError: an unknown method.
    """
    from onnxruntime.quantization import QuantFormat, QuantType

    if method not in METHODS:
        raise ValueError(f"unknown ORT method {method!r}; choose from {METHODS}")
    common: dict[str, Any] = {
        "quant_format": QuantFormat.QDQ,
        "per_channel": True,
        "activation_type": QuantType.QInt8,
        "weight_type": QuantType.QInt8,
        "extra_options": EXTRA_OPTIONS,
    }
    return timed(lambda: _quantize(pre, out, name, calib, method, batch, common))[1]


def _quantize(
    pre: Path,
    out: Path,
    name: str,
    calib: np.ndarray,
    method: str,
    batch: int,
    common: dict[str, Any],
) -> None:
    from onnxruntime.quantization import CalibrationMethod, quantize_static

    if method == "Entropy":
        with tempfile.TemporaryDirectory(prefix="ort-entropy-") as tmp:
            cache = _entropy_ranges(pre, Path(tmp), name, calib, batch)
            quantize_static(
                str(pre),
                str(out),
                None,
                calibrate_method=CalibrationMethod.Entropy,
                calibration_cache_path=str(cache),
                **common,
            )
    else:
        quantize_static(
            str(pre),
            str(out),
            _reader(name, calib, batch),
            calibrate_method=getattr(CalibrationMethod, method),
            **common,
        )


def _entropy_ranges(pre: Path, tmp: Path, name: str, calib: np.ndarray, batch: int) -> Path:
    """Entropy ranges with 2048/128 bins, saved as a ``quantize_static`` calibration cache."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.calibrate import save_tensors_data
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    calibrator = create_calibrator(
        pre,
        sorted(set(QLinearOpsRegistry) | set(QDQRegistry)),  # what quantize_static calibrates
        augmented_model_path=str(tmp / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options={
            "symmetric": True,
            "num_bins": ENTROPY_BINS,
            "num_quantized_bins": ENTROPY_QUANTIZED_BINS,
        },
    )
    calibrator.collect_data(_reader(name, calib, batch))
    ranges = calibrator.compute_data()
    cache = tmp / "entropy.json"
    save_tensors_data(ranges, cache, smooth_quant=False)
    return cache
