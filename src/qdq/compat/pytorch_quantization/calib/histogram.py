"""``pytorch_quantization.calib.HistogramCalibrator`` backed by qdq's histogram and methods.

Two grids (``grid=``):

* ``"qdq"`` (default): :class:`qdq.calib.HistogramCalibrator` — power-of-two bins that merge
  exactly when the range grows, so the histogram (hence every amax) is the same however the data
  was batched or ordered; int64 counts.
* ``"upstream"``: upstream's ``torch_hist`` grid, for amax that matches upstream's to the bin: the
  first batch fixes the bin width (``max|x| / num_bins``), later batches that exceed the range
  append bins of that width. The result depends on the first batch.

Entropy is qdq's vectorised reference KL procedure (same amax as upstream on the same histogram).
Percentile on the upstream grid is upstream's: the *left* edge of the first bin where the float64
CDF (``cumsum(counts / total)``) reaches ``percentile / 100``; on qdq's grid it is
:func:`qdq.calib.methods.percentile_amax` (the right edge of that bin: every value at or below amax
is then inside the range). mse depends on the grid: on qdq's grid it is
:func:`qdq.calib.methods.mse_amax` (candidates: bin edges plus the observed max); on the upstream
grid it is upstream's search (candidates: the bin centres from ``start_bin`` on, the count-weighted
error of the fake-quantized centres, first minimum), with qdq's ONNX rounding. Histograms are per
tensor (as upstream).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from qdq.calib import CalibrationError
from qdq.calib import HistogramCalibrator as _QdqHistogram
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax

__all__ = ["HistogramCalibrator"]

GRIDS = ("qdq", "upstream")


class HistogramCalibrator:
    """Histogram of ``|x|``; amax by entropy, mse or percentile (upstream's signature).

    Args:
        num_bits, axis, unsigned: the quantizer's; ``axis`` must be ``None`` (per tensor).
        num_bins: resolution (qdq grid: a power of two >= 256; default 2048).
        grow_method: ``None`` or ``"append"`` (upstream's only implemented one).
        skip_zeros: leave exact zeros out of the histogram.
        torch_hist: accepted for compatibility (``_torch_hist`` too); qdq's grid is the same
            either way, the upstream grid follows upstream's ``torch_hist=True`` path.
        grid: ``"qdq"`` or ``"upstream"`` (module docstring).

    Example:
        >>> cal = HistogramCalibrator(8, None, False)
        >>> cal.collect(torch.linspace(-1, 1, 10001))
        >>> float(cal.compute_amax("percentile", percentile=99.0))
        0.990234375
    """

    def __init__(
        self,
        num_bits: int = 8,
        axis: int | tuple[int, ...] | None = None,
        unsigned: bool = False,
        num_bins: int = 2048,
        grow_method: str | None = None,
        skip_zeros: bool = False,
        torch_hist: bool = False,
        *,
        grid: str = "qdq",
    ) -> None:
        if axis is not None:
            raise ValueError(f"HistogramCalibrator is per tensor: axis must be None, got {axis!r}")
        if grow_method not in (None, "append"):
            raise ValueError(f"grow_method must be None or 'append', got {grow_method!r}")
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
        if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
            raise ValueError(f"num_bins must be an int >= 2, got {num_bins!r}")
        self._num_bits = num_bits
        self._axis = axis
        self._unsigned = unsigned
        self._num_bins = num_bins
        self._skip_zeros = skip_zeros
        self._torch_hist = torch_hist
        self._grid = grid
        self._impl = (
            _QdqHistogram(num_bins, num_bits=num_bits, unsigned=unsigned) if grid == "qdq" else None
        )
        self._counts: torch.Tensor | None = None  # upstream grid: float64 counts
        self._edges: torch.Tensor | None = None

    def collect(self, x: torch.Tensor) -> None:
        """Add one batch to the histogram.

        Raises:
            TypeError: not a floating-point tensor.
            qdq.calib.CalibrationError: NaN or inf values.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"collect needs a floating-point tensor, got {type(x).__name__}")
        x = x.detach()
        if self._skip_zeros:
            x = x[x != 0]
        if self._impl is not None:
            self._impl.collect(x)
            return
        self._collect_upstream_grid(x)

    def _collect_upstream_grid(self, x: torch.Tensor) -> None:
        a = x.abs().to(torch.float32).reshape(-1)
        if a.numel() == 0:
            return
        top = float(a.max())
        if not math.isfinite(top):
            raise CalibrationError("calibration batch contains NaN or inf values")
        if self._edges is None or self._counts is None:
            self._edges = torch.linspace(0, top, self._num_bins + 1)
            self._counts = torch.histc(a, bins=self._num_bins, min=0, max=top).to(torch.float64)
            return
        if top > float(self._edges[-1]):
            width = float(self._edges[1] - self._edges[0])
            nbins = math.ceil(top / width)
            self._edges = torch.arange(0, (nbins + 1) * width, width)[: nbins + 1]
        n = self._edges.numel() - 1
        hist = torch.histc(a, bins=n, min=0, max=float(self._edges[-1])).to(torch.float64)
        hist[: self._counts.numel()] += self._counts
        self._counts = hist

    def reset(self) -> None:
        """Forget everything collected."""
        if self._impl is not None:
            self._impl.reset()
        self._counts = None
        self._edges = None

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, edges)`` of the collected ``|x|`` (numpy copies).

        Raises:
            qdq.calib.CalibrationError: nothing collected.
        """
        if self._impl is not None:
            return self._impl.histogram()
        if self._counts is None or self._edges is None:
            raise CalibrationError("HistogramCalibrator has collected no data: run batches first")
        counts = np.rint(self._counts.numpy()).astype(np.int64)
        return counts, self._edges.to(torch.float64).numpy().copy()

    @property
    def _calib_hist(self) -> torch.Tensor:
        return torch.from_numpy(self.histogram()[0])

    @property
    def _calib_bin_edges(self) -> torch.Tensor:
        return torch.from_numpy(self.histogram()[1])

    def compute_amax(
        self,
        method: str,
        *,
        stride: int = 1,
        start_bin: int = 128,
        percentile: float = 99.99,
    ) -> torch.Tensor | None:
        """amax (a float32 scalar tensor) by ``"entropy"``, ``"mse"``, ``"percentile"`` (or
        ``"max"``, a qdq extension); ``None`` before any data (as :class:`MaxCalibrator`).

        Raises:
            TypeError: an unknown method (as upstream).
            ValueError: a percentile outside (0, 100].
        """
        if method not in ("entropy", "mse", "percentile", "max"):
            raise TypeError(f"unknown calibration method {method!r}: entropy, mse or percentile")
        empty = self._counts is None if self._impl is None else self._impl.num_batches == 0
        if empty:
            return None
        counts, edges = self.histogram()
        observed = self._impl.observed_max if self._impl is not None else float(edges[-1])
        if observed == 0.0 or method == "max":
            value = observed
        elif method == "entropy":
            value = entropy_amax(
                counts, edges, num_bits=self._num_bits, unsigned=self._unsigned,
                start_bin=start_bin, stride=stride,
            )  # fmt: skip
        elif method == "mse" and self._impl is None:
            value = _centre_mse_amax(
                counts, edges, self._num_bits, self._unsigned, start_bin, stride
            )
        elif method == "mse":
            value = mse_amax(
                counts, edges, observed_max=observed, num_bits=self._num_bits, start_bin=start_bin
            )
        elif self._impl is None:
            value = _upstream_percentile_amax(counts, edges, percentile)
        else:
            value = percentile_amax(counts, edges, percentile)
        return torch.tensor(min(value, observed), dtype=torch.float32)

    def __repr__(self) -> str:
        return (
            f"HistogramCalibrator(num_bits={self._num_bits}, num_bins={self._num_bins}, "
            f"skip_zeros={self._skip_zeros}, grid={self._grid!r})"
        )


def _upstream_percentile_amax(counts: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """Upstream's percentile on its grid: the left edge ``edges[idx]`` of the first bin whose
    float64 CDF reaches ``percentile / 100`` (``np.searchsorted``, as upstream computes it)."""
    if not 0.0 < float(percentile) <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    total = counts.sum()
    if total <= 0:
        raise ValueError("the histogram has no counts")
    cdf = np.cumsum(counts / total)
    return float(edges[int(np.searchsorted(cdf, float(percentile) / 100))])


def _centre_mse_amax(
    counts: np.ndarray,
    edges: np.ndarray,
    num_bits: int,
    unsigned: bool,
    start_bin: int,
    stride: int,
) -> float:
    """Upstream's MSE search on its grid: amax candidates are the bin centres ``start_bin``,
    ``start_bin + stride``, ...; each bin's count sits at its centre; the first minimum of the
    mean count-weighted squared fake-quantization error wins (ONNX rounding, float32)."""
    centres = torch.from_numpy((edges[1:] + edges[:-1]) / 2).to(torch.float32)
    weights = torch.from_numpy(counts.astype(np.float64))
    picks = list(range(start_bin, centres.numel(), stride)) or [centres.numel() - 1]
    qmax = (1 << num_bits) - 1 if unsigned else (1 << (num_bits - 1)) - 1
    best, best_err = picks[0], math.inf
    for lo in range(0, len(picks), 64):  # blocks of candidates: (64, bins) at a time
        idx = torch.tensor(picks[lo : lo + 64])
        amax = centres[idx].reshape(-1, 1)
        scale = torch.clamp(amax / qmax, min=2.0**-24 / qmax)
        fq = torch.clamp(torch.round(centres / scale), -qmax - 1, qmax) * scale
        err = ((fq - centres).to(torch.float64) ** 2 * weights).mean(dim=1)
        k = int(torch.argmin(err))
        if float(err[k]) < best_err:
            best, best_err = picks[lo + k], float(err[k])
    return float(centres[best])
