"""``pytorch_quantization.calib.histogram``: :class:`HistogramCalibrator` and
:func:`calibrate_weights`.

Two grids (``grid=``):

* ``"upstream"`` (default): upstream's histogram, count for count. The first batch fixes the bin
  width (``num_bins`` bins over ``[0, max|x|]``, or ``[min|x|, max|x|]`` with
  ``torch_hist=False``, numpy's grid); a later batch past the range appends bins of that width
  (``_num_bins`` grows with them, and stays grown after :meth:`~HistogramCalibrator.reset`, as
  upstream). The amax therefore depends on the first batch. ``torch_hist=True`` counts with
  ``torch.histc`` on the data's device (float32 counts), ``False`` with ``np.histogram`` on the
  CPU (int64 counts). ``compute_amax`` runs upstream's procedures (see ``_amax``).
* ``"qdq"``: :class:`qdq.calib.HistogramCalibrator` — power-of-two bins that merge exactly when
  the range grows, so the histogram (hence every amax) does not depend on how the data was
  batched or ordered; qdq's entropy, mse and percentile (right bin edge), capped at the observed
  maximum; ``"max"`` too. ``num_bins`` must then be a power of two >= 256. Nothing is read
  back from the device while collecting: ``_calib_hist`` / ``_calib_bin_edges`` (int64 counts,
  float64 edges) are filled in by ``compute_amax``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from qdq.calib import HistogramCalibrator as _QdqHistogram
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax
from qdq.compat.pytorch_quantization.calib._amax import (
    _compute_amax_entropy,
    _compute_amax_mse,
    _compute_amax_percentile,
)
from qdq.compat.pytorch_quantization.calib.calibrator import Axis, _Calibrator, abs_if_negative
from qdq.compat.pytorch_quantization.calib.weights import calibrate_weights

__all__ = ["HistogramCalibrator", "calibrate_weights"]

_log = logging.getLogger("qdq.compat")

GRIDS = ("upstream", "qdq")
_METHODS = ("entropy", "mse", "percentile")


class HistogramCalibrator(_Calibrator):
    """Histogram of ``|x|``, collected once; amax by entropy, mse or percentile on demand.

    Args:
        num_bits: the quantization width the methods optimise for (``(4, 3)``: E4M3, mse only).
        axis: must be ``None`` (histograms are per tensor).
        unsigned: the quantizer's range is unsigned (entropy merges into twice as many levels).
        num_bins: bins spanning the first batch (default 2048).
        grow_method: deprecated upstream and ignored (a warning says so).
        skip_zeros: leave exact zeros out of the histogram.
        torch_hist: count with ``torch.histc`` on the data's device (default) rather than
            ``np.histogram`` on the CPU (module docstring).
        grid: ``"upstream"`` (default) or ``"qdq"`` (module docstring).

    Raises:
        NotImplementedError: ``axis`` is not ``None``.
        ValueError: an unknown ``grid``.

    Example:
        >>> cal = HistogramCalibrator(8, None, False)
        >>> cal.collect(torch.arange(100))
        >>> cal.compute_amax("percentile", percentile=90)
        tensor(88.9937)
    """

    def __init__(
        self,
        num_bits: int | tuple[int, int] = 8,
        axis: Axis = None,
        unsigned: bool = False,
        num_bins: int = 2048,
        grow_method: str | None = None,
        skip_zeros: bool = False,
        torch_hist: bool = True,
        *,
        grid: str = "upstream",
    ) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._num_bins = num_bins
        self._skip_zeros = skip_zeros
        self._calib_bin_edges: Any = None  # torch_hist: tensors; else numpy arrays
        self._calib_hist: Any = None
        self._torch_hist = torch_hist
        if axis is not None:
            raise NotImplementedError(
                "Calibrator histogram collection only supports per tensor scaling"
            )
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
        if grow_method is not None:
            _log.warning("grow_method is deprecated. Got %s, ignored!", grow_method)
        self._grid = grid
        self._qdq: _QdqHistogram | None = None
        if grid == "qdq":
            if not isinstance(num_bits, int):
                raise ValueError(f"grid='qdq' takes an integer num_bits, got {num_bits!r}")
            self._qdq = _QdqHistogram(num_bins, num_bits=num_bits, unsigned=unsigned)

    # ---------------------------------------------------------------- collection
    def collect(self, x: torch.Tensor) -> None:
        """Add ``|x|`` (any real dtype, integers too) to the histogram.

        Raises:
            RuntimeError: nothing left to count (an empty tensor, or only zeros with
                ``skip_zeros``).
        """
        x = abs_if_negative(x).float()
        with torch.no_grad():
            if self._qdq is not None:
                self._collect_qdq(x.detach())
            elif self._torch_hist:
                self._collect_torch(x.detach())
            else:
                self._collect_numpy(x.detach().cpu().numpy())

    def _collect_torch(self, x: torch.Tensor) -> None:
        if self._skip_zeros:
            x = x[torch.where(x != 0)]
        _check_not_empty(x.numel(), self._skip_zeros)
        x_max = x.max()
        if self._calib_bin_edges is None and self._calib_hist is None:
            self._calib_hist = torch.histc(x, bins=self._num_bins, min=0, max=x_max)  # type: ignore[arg-type]
            self._calib_bin_edges = torch.linspace(0, x_max, self._num_bins + 1)
            return
        edges = self._calib_bin_edges
        if x_max > edges[-1]:
            width = edges[1] - edges[0]
            self._num_bins = int((x_max / width).ceil().item())
            self._calib_bin_edges = torch.arange(0, x_max + width, width, device=x.device)
        hist = torch.histc(x, bins=self._num_bins, min=0, max=self._calib_bin_edges[-1])
        hist[: self._calib_hist.numel()] += self._calib_hist
        self._calib_hist = hist

    def _collect_numpy(self, x: np.ndarray) -> None:
        if self._skip_zeros:
            x = x[np.where(x != 0)]
        _check_not_empty(x.size, self._skip_zeros)
        if self._calib_bin_edges is None and self._calib_hist is None:
            self._calib_hist, self._calib_bin_edges = np.histogram(x, bins=self._num_bins)
            return
        top = np.max(x)
        edges = self._calib_bin_edges
        if top > edges[-1]:
            width = edges[1] - edges[0]
            # may end one bin past the one holding ``top``, as upstream's grid does
            more = np.arange(edges[-1] + width, top + width, width)
            self._calib_bin_edges = np.hstack((edges, more))
        hist, self._calib_bin_edges = np.histogram(x, bins=self._calib_bin_edges)
        hist[: len(self._calib_hist)] += self._calib_hist
        self._calib_hist = hist

    def _collect_qdq(self, x: torch.Tensor) -> None:
        assert self._qdq is not None
        if self._skip_zeros:
            x = x[x != 0]
        self._qdq.collect(x)  # nothing read back per batch: _calib_hist is set by compute_amax

    def reset(self) -> None:
        """Forget the collected histogram."""
        self._calib_bin_edges = None
        self._calib_hist = None
        if self._qdq is not None:
            self._qdq.reset()

    # ---------------------------------------------------------------- amax
    def compute_amax(
        self, method: str, *, stride: int = 1, start_bin: int = 128, percentile: float = 99.99
    ) -> torch.Tensor | None:
        """amax by ``method`` from the collected histogram; ``None`` before any data.

        Args:
            method: ``"entropy"``, ``"mse"`` or ``"percentile"`` (``"max"`` too on qdq's grid).
            stride: candidate step of entropy and mse (upstream grid).
            start_bin: first candidate bin of entropy and mse (upstream grid).
            percentile: for ``"percentile"``, in [0, 100].

        Returns:
            A 0-dim tensor: float32 (the default dtype) on the CPU for entropy and percentile, on
            the histogram's device for mse.

        Raises:
            TypeError: an unknown method ("Unknown calibration method ...").
            ValueError: ``percentile`` outside [0, 100].
        """
        if self._qdq is not None:
            return self._compute_amax_qdq(method, percentile)
        if isinstance(self._calib_hist, torch.Tensor):
            device = self._calib_hist.device
            hist = self._calib_hist.to(torch.int64).cpu().numpy()
            edges = self._calib_bin_edges.cpu().numpy()
        else:
            device, hist, edges = torch.device("cpu"), self._calib_hist, self._calib_bin_edges
        if method == "entropy":
            if not isinstance(self._num_bits, int):
                raise TypeError(
                    f"entropy needs an integer num_bits, got {self._num_bits}: "
                    "use mse or percentile for E4M3"
                )
            return _compute_amax_entropy(
                hist, edges, self._num_bits, self._unsigned, stride, start_bin
            )
        if method == "mse":
            return _compute_amax_mse(
                hist, edges, self._num_bits, self._unsigned, stride, start_bin, device=device
            )
        if method == "percentile":
            return _compute_amax_percentile(hist, edges, percentile)
        raise TypeError(f"Unknown calibration method {method}")

    def _compute_amax_qdq(self, method: str, percentile: float) -> torch.Tensor | None:
        assert self._qdq is not None
        if method not in (*_METHODS, "max"):
            raise TypeError(f"Unknown calibration method {method}")
        if method == "percentile" and not 0 <= percentile <= 100:
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        if self._qdq.num_batches == 0:
            return None
        counts, edges = self._qdq.histogram()
        self._calib_hist, self._calib_bin_edges = torch.from_numpy(counts), torch.from_numpy(edges)
        observed = self._qdq.observed_max
        num_bits = int(self._num_bits)  # type: ignore[arg-type]
        if observed == 0.0 or method == "max":
            value = observed
        elif method == "entropy":
            value = entropy_amax(counts, edges, num_bits=num_bits, unsigned=self._unsigned)
        elif method == "mse":
            value = mse_amax(counts, edges, observed_max=observed, num_bits=num_bits)
        else:
            value = percentile_amax(counts, edges, percentile)
        return torch.tensor(min(value, observed), dtype=torch.float32)

    # ---------------------------------------------------------------- printing
    def __str__(self) -> str:
        edges = self._calib_bin_edges
        if edges is None:
            text = "None"
        else:
            text = f"[{float(edges[0]):.3f}, ..., {float(edges[-1]):.3f}]({len(edges)})"
        return f"HistogramCalibrator(calib_bin_edges={text})"

    def __repr__(self) -> str:
        grid = "" if self._grid == "upstream" else f" grid={self._grid!r}"
        return (
            f"HistogramCalibrator({super().__repr__()} calib_bin_edges={self._calib_bin_edges}"
            f" calib_hist={self._calib_hist}{grid})"
        )


def _check_not_empty(size: int, skip_zeros: bool) -> None:
    if size == 0:
        what = "only zeros (skip_zeros=True)" if skip_zeros else "an empty tensor"
        raise RuntimeError(f"HistogramCalibrator.collect got {what}: nothing to count")
