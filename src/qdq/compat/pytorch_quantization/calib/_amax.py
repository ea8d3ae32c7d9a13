"""amax from a collected histogram by upstream's three procedures, value for value.

``(calib_hist, calib_bin_edges)`` are numpy arrays on upstream's grid (``counts``, ``edges`` with
one more entry). Each function returns what upstream's does, including its ties, NaN and inf:

* :func:`_compute_amax_entropy` — TensorRT's KL search: for every candidate ``i`` (bins kept,
  ``start_bin``, ``start_bin + stride``, ...) the first ``i`` bins (the clipped mass added to the
  last) are compared with their merge into ``2**(num_bits - 1 + unsigned)`` levels; the *last*
  minimum wins and amax is the left edge ``edges[i]``. Bin 0 is replaced by bin 1 first (in place
  on the caller's array, as upstream). The KL divergence is computed as ``scipy.stats.entropy``
  does, with the C library's ``log`` (numpy's own vectorised ``log`` can differ in the last bit,
  which can move the minimum), so scipy is not needed.
* :func:`_compute_amax_mse` — amax candidates are the bin centres from ``start_bin`` on; each
  centre is fake-quantized with the candidate (``fake_tensor_quant``, or ``scaled_e4m3`` for
  ``num_bits=(4, 3)``) and the count-weighted mean squared error is taken in float32; the *first*
  minimum wins. Runs on ``device`` (the histogram's; upstream always uses CUDA).
* :func:`_compute_amax_percentile` — the left edge ``edges[idx]`` of the first bin whose float64
  CDF reaches ``percentile / 100``.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

__all__ = ["_compute_amax_entropy", "_compute_amax_mse", "_compute_amax_percentile"]

_log = logging.getLogger("qdq.compat")
_libm_log = np.frompyfunc(math.log, 1, 1)  # the C library's log, element by element


def _rel_entr_sum(pk: np.ndarray, qk: np.ndarray) -> float:
    """``scipy.stats.entropy(pk, qk)``: both normalised to sum 1, then the sum of
    ``pk * log(pk / qk)`` (0 where ``pk == 0 <= qk``, inf where ``pk > 0 == qk``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        q = qk / np.sum(qk)
        p = pk / np.sum(pk)
        vec = np.where((p == 0) & (q >= 0), 0.0, np.inf)
        both = (p > 0) & (q > 0)
        if both.any():
            ratio = p[both] / q[both]
            vec[both] = p[both] * _libm_log(ratio).astype(np.float64)
        vec[np.isnan(p) | np.isnan(q)] = np.nan
    return float(np.sum(vec))


def _merged_density(bins: np.ndarray, i: int, nbins: int) -> np.ndarray:
    """The first ``i`` bins merged into ``nbins`` levels and spread back evenly over the non-empty
    bins of each level (empty bins stay 0), in float64."""
    level = np.digitize(np.arange(i), np.linspace(0, i, num=nbins + 1)) - 1
    level[bins[:i] == 0] = -1
    kept = level != -1
    sums = np.bincount(level[kept], weights=bins[:i][kept], minlength=nbins).astype(np.float64)
    members = np.bincount(level[kept], minlength=nbins)
    per_bin = np.divide(sums, members, out=sums.copy(), where=members > 0)
    density = np.zeros(i, dtype=np.float64)
    density[kept] = per_bin[level[kept]]
    return density


def _compute_amax_entropy(
    calib_hist: np.ndarray | None,
    calib_bin_edges: np.ndarray | None,
    num_bits: int,
    unsigned: bool,
    stride: int = 1,
    start_bin: int = 128,
) -> torch.Tensor | None:
    """amax that minimises the KL divergence of the clipped, merged histogram (module docstring).

    Returns:
        A 0-dim tensor of the default dtype, or ``None`` when nothing was collected.

    Raises:
        RuntimeError: the merged counts lose data ("Count mismatch!", a histogram that is not
            counts).
    """
    if calib_bin_edges is None and calib_hist is None:
        return None
    assert calib_hist is not None and calib_bin_edges is not None
    bins = calib_hist[:]  # a view: upstream changes the caller's bin 0 too
    bins[0] = bins[1]
    total = np.sum(bins)
    nbins = 1 << (num_bits - 1 + int(unsigned))
    divergences = []
    for i in range(start_bin, len(bins) + 1, stride):
        density = _merged_density(bins, i, nbins)
        clipped = np.sum(bins[i:])
        reference = np.array(bins[:i])
        reference[-1] += clipped
        new_total, old_total = np.sum(density) + clipped, np.sum(reference)
        if round(new_total) != total or round(old_total) != total:
            raise RuntimeError(
                f"Count mismatch! total_counts_new={new_total}, total_counts_old={old_total}, "
                f"total_data={total}"
            )
        divergences.append(_rel_entr_sum(reference, density))
    div = np.array(divergences)
    _log.debug("divergences=%s", div)
    last_argmin = len(div) - 1 - np.argmin(div[::-1])
    return torch.tensor(calib_bin_edges[last_argmin * stride + start_bin].item())


def _fake_quant_centres(
    centers: torch.Tensor, amax: torch.Tensor, num_bits: int | tuple[int, int], unsigned: bool
) -> torch.Tensor:
    # imported here: tensor_quant's package imports calib (no import cycle at load time)
    from qdq.compat.pytorch_quantization.tensor_quant import fake_tensor_quant

    if isinstance(num_bits, int) and num_bits >= 0:
        if num_bits == 0:
            _log.error(
                "num_bits is 0. This will result in the tensor being quantized to all zeros. "
                "This mode should only be used for debugging purposes."
            )
        out: torch.Tensor = fake_tensor_quant(centers, amax, num_bits, unsigned)
        return out
    if num_bits == (4, 3):
        from qdq.compat.pytorch_quantization.tensor_quant import scaled_e4m3

        out = scaled_e4m3(centers, amax, num_bits[0], num_bits[1])
        return out
    raise TypeError("Invalid num_bits. num_bits must be a postivie integer or tuple (4,3).")


def _compute_amax_mse(
    calib_hist: np.ndarray | None,
    calib_bin_edges: np.ndarray | None,
    num_bits: int | tuple[int, int],
    unsigned: bool,
    stride: int = 1,
    start_bin: int = 128,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """amax (a bin centre) that minimises the count-weighted fake-quantization MSE of the centres.

    Args:
        device: where the search runs (default CPU); upstream runs it on CUDA.

    Returns:
        A 0-dim float32 tensor on ``device``, or ``None`` when nothing was collected.

    Raises:
        TypeError: ``num_bits`` neither a non-negative int nor ``(4, 3)``.
        ValueError: no candidate (``start_bin`` past the last bin).
    """
    if calib_bin_edges is None and calib_hist is None:
        return None
    assert calib_hist is not None and calib_bin_edges is not None
    counts = torch.from_numpy(np.asarray(calib_hist)).float().to(device)
    edges = torch.from_numpy(np.asarray(calib_bin_edges)).float().to(device)
    centers = (edges[1:] + edges[:-1]) / 2
    picks = list(range(start_bin, len(centers), stride))
    if not picks:
        raise ValueError(
            f"mse has no amax candidate: start_bin={start_bin} but the histogram has "
            f"{len(centers)} bins"
        )
    mses = []
    for i in picks:
        quant = _fake_quant_centres(centers, centers[i], num_bits, unsigned)
        mses.append(((quant - centers) ** 2 * counts).mean().cpu())
    _log.debug("mses=%s", mses)
    best = int(np.argmin(torch.stack(mses).numpy()))
    return centers[picks[best]]


def _compute_amax_percentile(
    calib_hist: np.ndarray | None, calib_bin_edges: np.ndarray | None, percentile: float
) -> torch.Tensor | None:
    """amax that keeps ``percentile`` percent of the collected values (module docstring).

    Returns:
        A 0-dim tensor of the default dtype, or ``None`` when nothing was collected.

    Raises:
        ValueError: ``percentile`` outside [0, 100] (checked first, as upstream).
    """
    if percentile < 0 or percentile > 100:
        raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
    if calib_bin_edges is None and calib_hist is None:
        return None
    assert calib_hist is not None and calib_bin_edges is not None
    cdf = np.cumsum(calib_hist / calib_hist.sum())
    idx = np.searchsorted(cdf, percentile / 100)
    return torch.tensor(calib_bin_edges[idx].item())
