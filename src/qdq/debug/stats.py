"""Error statistics: how far a tensor is from its FP32 reference (SQNR, cosine, relative MSE)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["ErrorStats", "ErrorSums", "Histogram", "finite", "finite_fields"]


@dataclass(frozen=True)
class ErrorStats:
    """How far a tensor ``y`` is from its FP32 reference ``x`` (summed over every element).

    Attributes:
        sqnr_db: 10·log10(Σx² / Σ(x − y)²); ``inf`` when ``y == x``.
        cosine: Σxy / √(Σx²·Σy²).
        rel_mse: Σ(x − y)² / Σx².
        numel: elements compared.

    Example:
        >>> s = ErrorStats.between(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]))
        >>> round(s.sqnr_db, 1), round(s.rel_mse, 4)
        (27.0, 0.002)
    """

    sqnr_db: float
    cosine: float
    rel_mse: float
    numel: int

    @staticmethod
    def between(reference: torch.Tensor, other: torch.Tensor) -> ErrorStats:
        """The error of ``other`` against ``reference``."""
        acc = ErrorSums()
        acc.add(reference, other)
        return acc.stats()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a non-finite number is ``null``)."""
        return finite_fields(self)


@dataclass(frozen=True)
class Histogram:
    """The calibration histogram of ``|x|`` of one quantizer and the amax each method picks.

    ``counts[i]`` counts values in ``[i·bin_width, (i+1)·bin_width)``; ``amax`` is the one in use
    (``method``), ``methods`` the amax of every method the calibrator computes from the same data.
    """

    bin_width: float
    counts: tuple[int, ...]
    observed_max: float
    amax: float
    method: str
    methods: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {**asdict(self), "counts": list(self.counts)}


class ErrorSums:
    """Running Σx², Σy², Σxy, Σ(x−y)² in float64, and the count of clipped reference values."""

    def __init__(self) -> None:
        self.xx = self.yy = self.xy = self.ee = 0.0
        self.numel = self.clipped = 0

    def add(self, x: torch.Tensor, y: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        x64, y64 = x.detach().double().flatten(), y.detach().double().flatten()
        self.xx += float(x64 @ x64)
        self.yy += float(y64 @ y64)
        self.xy += float(x64 @ y64)
        self.ee += float(((x64 - y64) ** 2).sum())
        self.numel += x64.numel()
        if amax is not None and amax.numel() == 1:
            self.clipped += int((x.detach().abs() > amax).sum())

    def stats(self) -> ErrorStats:
        if self.ee == 0.0:
            sqnr = math.inf
        elif self.xx == 0.0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.xx / self.ee)
        norm = math.sqrt(self.xx * self.yy)
        cosine = self.xy / norm if norm > 0 else (1.0 if self.xx == self.yy else 0.0)
        rel = self.ee / self.xx if self.xx > 0 else (0.0 if self.ee == 0 else math.inf)
        return ErrorStats(sqnr, cosine, rel, self.numel)


def finite(value: Any) -> Any:
    """``value``, or ``None`` for a non-finite float (JSON has no inf/NaN)."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def finite_fields(row: Any) -> dict[str, Any]:
    """The fields of dataclass ``row`` as a dict, each through :func:`finite` (JSON-safe)."""
    return {k: finite(v) for k, v in asdict(row).items()}
