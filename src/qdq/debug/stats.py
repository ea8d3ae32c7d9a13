"""Error statistics: how far a tensor is from its FP32 reference (SQNR, cosine, relative MSE)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["ErrorStats", "ErrorSums", "Histogram", "finite", "finite_fields", "sample_cosines"]

#: samples per chunk of :func:`sample_cosines` (bounds its float64 copies on large outputs)
_CHUNK = 16


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
    """Running Σx², Σy², Σ(x−y)² (float64 accumulators), and the count of clipped reference
    values.

    Each call reduces in the tensors' own precision with torch's norms (cascaded sums: relative
    error ~1e-7, where a float64 copy of both tensors cost most of :func:`qdq.debug.layer_errors`'
    time) and adds the squares in float64. Σxy is not summed: Σ(x−y)² = Σx² + Σy² − 2Σxy gives
    it, and the cosine comes from the accurate difference, ``1 − cos = (Σ(x−y)² − (‖x‖ − ‖y‖)²) /
    (2‖x‖‖y‖)``, so that ``1 − cos`` near 1e-8 is not lost to the rounding of Σxy.
    """

    def __init__(self) -> None:
        self.xx = self.yy = self.ee = 0.0
        self.numel = self.clipped = 0

    @property
    def xy(self) -> float:
        """Σxy, from the other sums."""
        return (self.xx + self.yy - self.ee) / 2

    def add(self, x: torch.Tensor, y: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        a, b = _flat(x), _flat(y)
        norms = [torch.linalg.vector_norm(t).double() for t in (a, b, a - b)]
        xx, yy, ee = (torch.stack(norms) ** 2).tolist()  # one host read per call
        self.xx += xx
        self.yy += yy
        self.ee += ee
        self.numel += a.numel()
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
        if norm > 0:
            gap = (math.sqrt(self.xx) - math.sqrt(self.yy)) ** 2
            cosine = min(1.0, max(-1.0, 1.0 - (self.ee - gap) / (2.0 * norm)))
        else:
            cosine = 1.0 if self.xx == self.yy else 0.0
        rel = self.ee / self.xx if self.xx > 0 else (0.0 if self.ee == 0 else math.inf)
        return ErrorStats(sqnr, cosine, rel, self.numel)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened, in float32 unless it is float64 (half precision and integers widened)."""
    t = t.detach().reshape(-1)
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def finite(value: Any) -> Any:
    """``value``, or ``None`` for a non-finite float (JSON has no inf/NaN)."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def finite_fields(row: Any) -> dict[str, Any]:
    """The fields of dataclass ``row`` as a dict, each through :func:`finite` (JSON-safe)."""
    return {k: finite(v) for k, v in asdict(row).items()}


def sample_cosines(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The cosine of every sample of ``out`` with the same sample of ``reference`` (float64,
    ``(N,)``; samples along dimension 0, each flattened; a ``(N,)`` tensor's samples are scalars).

    Scale-invariant at any magnitude: each sample is divided by its own largest ``|value|`` in
    float64 before ``a·b / (|a|·|b|)``, with no ``eps`` floor (``F.cosine_similarity`` clamps
    the norms at ``eps``, which at magnitudes near 1e-20 and below dominates and gives about 0).
    Two all-zero samples agree (1.0); an all-zero sample against a non-zero one scores 0.0; a
    sample holding NaN or an infinity scores NaN.

    Raises:
        ValueError: the shapes differ.

    Example:
        >>> a = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
        >>> [round(c, 9) for c in sample_cosines(a * 1e-30, a * 2e-30).tolist()]
        [1.0, 1.0]
        >>> sample_cosines(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])).tolist()
        [0.0]
    """
    if out.shape != reference.shape:
        raise ValueError(f"shape {tuple(out.shape)} != reference {tuple(reference.shape)}")
    parts = []
    for i in range(0, len(out), _CHUNK):
        a = _unit_scale(out[i : i + _CHUNK])
        b = _unit_scale(reference[i : i + _CHUNK])
        norms = torch.linalg.vector_norm(a, dim=1) * torch.linalg.vector_norm(b, dim=1)
        cos = ((a * b).sum(dim=1) / norms).clamp(-1.0, 1.0)  # NaN stays NaN
        zero_a, zero_b = (a == 0).all(dim=1), (b == 0).all(dim=1)
        cos = torch.where(zero_a & zero_b, 1.0, torch.where(zero_a ^ zero_b, 0.0, cos))
        parts.append(cos)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _unit_scale(x: torch.Tensor) -> torch.Tensor:
    """Each sample of ``x`` flattened, in float64, divided by its largest ``|value|`` (an
    all-zero sample stays zero; a NaN or an infinity gives NaN)."""
    flat = x.detach().reshape(len(x), -1).double()
    if flat.shape[1] == 0:
        return torch.zeros(len(x), 1, dtype=torch.float64)  # empty samples: two zero vectors
    scale = flat.abs().amax(dim=1, keepdim=True)
    return flat / torch.where(scale > 0, scale, 1.0)
