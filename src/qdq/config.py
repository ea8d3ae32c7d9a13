"""Frozen configuration dataclasses. Validation raises ``ValueError``/``TypeError`` naming the value."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CALIBRATION_METHODS", "CalibSpec", "QuantSpec"]

CALIBRATION_METHODS = ("max", "entropy", "mse", "percentile")
_CALIBRATORS = ("max", "histogram")


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantized: symmetric signed integers, zero-point 0.

    Attributes:
        num_bits: integer width, 2..8 (TensorRT INT8 uses 8).
        axis: channel axis for per-channel scales (0 for Conv/Linear weights); ``None`` = per tensor.
        narrow_range: saturate to ``[-qmax, qmax]`` (weights may use this; ONNX Q/DQ cannot express
            it, so the exporter only writes it where it cannot change a code).

    Example:
        >>> QuantSpec(axis=0)
        QuantSpec(num_bits=8, axis=0, narrow_range=False)
    """

    num_bits: int = 8
    axis: int | None = None
    narrow_range: bool = False

    def __post_init__(self) -> None:
        bits = _check_int("num_bits", self.num_bits)
        if not 2 <= bits <= 8:
            raise ValueError(f"num_bits must be in 2..8, got {bits}")
        if self.axis is not None:
            _check_int("axis", self.axis)
        if not isinstance(self.narrow_range, bool):
            raise TypeError(f"narrow_range must be a bool, got {type(self.narrow_range).__name__}")


@dataclass(frozen=True)
class CalibSpec:
    """How a quantizer's amax is calibrated.

    Attributes:
        calibrator: ``"histogram"`` (per tensor; any method) or ``"max"`` (per tensor or channel).
        method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"``.
        percentile: used by ``method="percentile"``, in (0, 100].
        num_bins: histogram resolution (a power of two >= 256).

    Example:
        >>> CalibSpec(method="percentile", percentile=99.999).method
        'percentile'
    """

    calibrator: str = "histogram"
    method: str = "entropy"
    percentile: float = 99.99
    num_bins: int = 2048

    def __post_init__(self) -> None:
        if self.calibrator not in _CALIBRATORS:
            raise ValueError(
                f"unknown calibrator {self.calibrator!r}; choose one of {', '.join(_CALIBRATORS)}"
            )
        if self.method not in CALIBRATION_METHODS:
            raise ValueError(
                f"unknown calibration method {self.method!r}; "
                f"choose one of {', '.join(CALIBRATION_METHODS)}"
            )
        if self.calibrator == "max" and self.method != "max":
            raise ValueError(
                f"calibrator='max' only supports method='max', got method={self.method!r}; "
                "use calibrator='histogram' for entropy/mse/percentile"
            )
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)):
            raise TypeError(f"percentile must be a number, got {type(self.percentile).__name__}")
        if not 0.0 < float(self.percentile) <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        bins = _check_int("num_bins", self.num_bins)
        if bins < 256 or bins & (bins - 1):
            raise ValueError(f"num_bins must be a power of two >= 256, got {bins}")

    @classmethod
    def weights(cls) -> CalibSpec:
        """Per-channel abs-max, the TensorRT default for weights."""
        return cls(calibrator="max", method="max")
