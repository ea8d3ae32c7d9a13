"""Streaming histogram of ``|x|`` with a batch-order-independent grid; amax by any method.

The grid
--------
The histogram covers ``[0, 2**e]`` with ``2 * num_bins`` equal bins, where ``2**e`` is the smallest
power of two at or above the largest ``|x|`` seen so far (never below ``2**-24``). Because both the
range and the bin count are powers of two, the bin width is a power of two, so

* the bin of a value, ``floor(|x| * 2**k)``, is computed exactly in floating point;
* when a batch exceeds the range, the range doubles as often as needed and every ``2**d`` old bins
  merge exactly into one new bin: no count is split, lost or guessed;
* the final histogram depends only on the data, not on how it was batched: one batch or fifty give
  the same counts, hence the same amax for every method.

Since the largest value lies above half the range, at least ``num_bins`` bins span ``[0, max|x|]``;
:meth:`HistogramCalibrator.histogram` returns the bins up to the last non-empty one (``num_bins+1`` to
``2*num_bins`` bins). Counts are int64, so huge tensors lose nothing (a trap of ``torch.histc``
with float32 counts). On a GPU, :func:`qdq.kernels.abs_histogram` bins each batch in one pass on its
own grid (its exponent computed on the device) and the calibrator merges up to 16 such batches with
one read of their maxima: the same counts, without a host synchronisation per batch (a NaN/inf
batch is then reported when it is merged, still by its index). Otherwise: on the CPU
``torch.bincount`` of int32 bin indices over chunks of 2**17 values through reused buffers with one
torch thread, and ``scatter_add_`` into one row per thread (:func:`_scatter_cpu`) with more;
``torch.bincount`` over chunks of 2**24 values on other devices.
The largest ``|x|`` of a batch comes from one ``torch.aminmax`` pass; ``|x|`` itself is never
materialised.

Methods (``compute_amax(method)``; one collection serves them all):

* ``"max"`` — the exact largest ``|x|`` seen;
* ``"entropy"`` — :func:`qdq.calib.methods.entropy_amax` (TensorRT's KL procedure);
* ``"mse"`` — :func:`qdq.calib.methods.mse_amax` (bin-centre MSE; 1.0×max is a candidate);
* ``"percentile"`` — :func:`qdq.calib.methods.percentile_amax` (default 99.99).

Histogram-based amax values are capped at the observed maximum (an amax beyond every observed value
only coarsens the scale).

Below the floor: the grid never goes below ``[0, 2**-24]``, which is also the smallest amax qdq
quantizes with (:data:`qdq.quant.MIN_AMAX`; a smaller one is floored to it, as pytorch-quantization
does; ``2**-24`` is also FP16's smallest subnormal). A tensor whose values all lie at or below it
(vanishing activations: common in networks with random weights, e.g. the squeeze-excitation paths of
MobileNetV3 or YOLO heads, where they reach 1e-10) fills only the first few bins of that grid, too few
for entropy's 128 candidates and too coarse for the others to mean anything. There every method
returns the observed maximum (:attr:`HistogramCalibrator.below_floor`), named as such in the reports:
the scale is the floored one whatever the method, so this changes no quantized value.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from qdq import kernels
from qdq.calib.base import CalibrationError, Calibrator, all_reduce, nonfinite_error
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax

__all__ = ["HistogramCalibrator"]

_MIN_EXP = -24
#: the bottom of the grid's range: every method returns the observed max at or below it
FLOOR = 2.0**_MIN_EXP
_CHUNK = 1 << 24
_CPU_CHUNK = 1 << 17
_SCATTER_CHUNK = 1 << 19
_PARALLEL_MIN = 1 << 16
#: device-binned batches held before they are merged (each: ``grid`` int64 counts)
_PENDING = 16
DEFAULT_PERCENTILE = 99.99


def _ceil_log2(v: float) -> int:
    """Smallest ``e`` with ``2**e >= v`` (exact, for positive finite ``v``)."""
    mant, exp = math.frexp(v)  # v = mant * 2**exp, 0.5 <= mant < 1
    return exp - 1 if mant == 0.5 else exp


class _Scratch(threading.local):
    """Per-thread buffers reused across calls: no fresh pages to fault in per batch."""

    def __init__(self) -> None:
        self.scaled = torch.empty(0)
        self.index = torch.empty(0, dtype=torch.int32)
        self.wide = torch.empty(0, dtype=torch.int64)
        self.ones = torch.empty(0, dtype=torch.int64)

    def _scaled(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        if self.scaled.numel() < n or self.scaled.dtype != dtype:
            self.scaled = torch.empty(max(n, self.scaled.numel()), dtype=dtype)
        return self.scaled[:n]

    def take(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` values of ``dtype`` and ``n`` int32 indices."""
        if self.index.numel() < n:
            self.index = torch.empty(n, dtype=torch.int32)
        return self._scaled(n, dtype), self.index[:n]

    def take_wide(
        self, n: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` values of ``dtype``, ``n`` int64 indices and ``n`` int64 ones."""
        if self.wide.numel() < n:
            self.wide = torch.empty(n, dtype=torch.int64)
            self.ones = torch.ones(n, dtype=torch.int64)
        return self._scaled(n, dtype), self.wide[:n], self.ones[:n]


_SCRATCH = _Scratch()


def _bincount_cpu(
    values: torch.Tensor, factor: float, grid: int, *, signed: bool = True
) -> torch.Tensor:
    """int64 counts of ``floor(|v| * factor)`` over ``grid`` bins (the value ``grid`` counted in
    the last bin); ``signed=False`` promises ``v >= 0`` (no ``abs`` pass). With one torch thread
    (or few values): ``torch.bincount`` over pieces of at most ``_CPU_CHUNK`` values; with more,
    :func:`_scatter_cpu`, which the threads share."""
    threads = torch.get_num_threads()
    if threads > 1 and values.numel() >= _PARALLEL_MIN:
        counts = _scatter_cpu(values, factor, grid, threads, signed)
    else:
        counts = torch.zeros(grid + 1, dtype=torch.int64)
        for start in range(0, values.numel(), _CPU_CHUNK):
            chunk = values[start : start + _CPU_CHUNK]
            scaled, index = _SCRATCH.take(chunk.numel(), chunk.dtype)
            _bin_index(chunk, factor, scaled, index, signed)
            counts += torch.bincount(index, minlength=grid + 1)
    counts[grid - 1] += counts[grid]
    return counts[:grid]


def _bin_index(
    chunk: torch.Tensor, factor: float, scaled: torch.Tensor, index: torch.Tensor, signed: bool
) -> None:
    """``index = floor(|chunk| * factor)`` through the buffer ``scaled``."""
    torch.mul(chunk, factor, out=scaled)  # factor: a power of two, exact
    if signed:
        scaled.abs_()
    index.copy_(scaled)  # truncation == floor for non-negative values


def _scatter_cpu(
    values: torch.Tensor, factor: float, grid: int, rows: int, signed: bool
) -> torch.Tensor:
    """The counts of :func:`_bincount_cpu` (``grid + 1`` of them), binned by all torch threads.

    ``torch.bincount`` runs on one thread. Here each piece of ``_SCATTER_CHUNK`` values is cut into
    ``rows`` runs, one per thread, and each run is counted into its own row of a
    ``rows × (grid + 2)`` table by ``scatter_add_`` (which torch runs in parallel over the rows);
    the rows are summed once at the end. The padding of the last piece up to a multiple of
    ``rows`` goes to column ``grid + 1``, which is dropped. Integer adds: the same counts as the
    serial path, whatever the thread count.
    """
    table = torch.zeros(rows, grid + 2, dtype=torch.int64)
    for start in range(0, values.numel(), _SCATTER_CHUNK):
        chunk = values[start : start + _SCATTER_CHUNK]
        k = chunk.numel()
        run = -(-k // rows)
        scaled, index, ones = _SCRATCH.take_wide(run * rows, chunk.dtype)
        _bin_index(chunk, factor, scaled[:k], index[:k], signed)
        index[k:].fill_(grid + 1)
        table.scatter_add_(1, index.view(rows, run), ones.view(rows, run))
    return table.sum(dim=0)[: grid + 1]


class HistogramCalibrator(Calibrator):
    """Streaming ``|x|`` histogram; compute amax by max, entropy, mse or percentile.

    Args:
        num_bins: resolution: at least this many bins span ``[0, max|x|]``. A power of two, >= 256.
        num_bits: the quantization width the methods optimise for.
        unsigned: quantize to an unsigned range (entropy merges into twice as many groups).

    Example:
        >>> cal = HistogramCalibrator()
        >>> for _ in range(4):
        ...     cal.collect(torch.randn(1000))
        >>> amax = {m: cal.compute_amax(m) for m in ("max", "entropy", "mse", "percentile")}
        >>> bool(amax["entropy"] <= amax["max"])
        True
    """

    methods = ("max", "entropy", "mse", "percentile")

    def __init__(self, num_bins: int = 2048, *, num_bits: int = 8, unsigned: bool = False) -> None:
        super().__init__()
        if isinstance(num_bins, bool) or not isinstance(num_bins, int):
            raise TypeError(f"num_bins must be an int, got {type(num_bins).__name__}")
        if num_bins < 256 or num_bins & (num_bins - 1):
            raise ValueError(f"num_bins must be a power of two >= 256, got {num_bins}")
        if not 2 <= num_bits <= 8:
            raise ValueError(f"num_bits must be in 2..8, got {num_bits}")
        self.num_bins = num_bins
        self.num_bits = num_bits
        self.unsigned = unsigned
        self._grid = 2 * num_bins  # bins over [0, 2**exp]
        self._log2_grid = self._grid.bit_length() - 1
        self._counts: torch.Tensor | None = None
        #: batches binned on the device, not yet merged: (counts, [max, exp], pad lanes, index)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
        self._exp = _MIN_EXP
        self._max = 0.0
        self._numel = 0

    # ---------------------------------------------------------------- collection
    def _collect(self, x: torch.Tensor, index: int) -> None:
        if x.numel() == 0:
            return
        if kernels.usable(x):  # a GPU: one pass, nothing read back until later (module docstring)
            counts, stats, pad = kernels.abs_histogram(x, self._grid)
            self._pending.append((counts, stats, pad, index))
            self._numel += x.numel()
            if len(self._pending) >= _PENDING:
                self._merge_pending()
            return
        self._merge_pending()
        if x.dtype != torch.float32 and x.dtype != torch.float64:
            x = x.to(torch.float32)  # exact for half / bfloat16
        lo, hi = torch.aminmax(x)  # max|x| = max(-min, max), one pass and no copy of x
        batch_max = float(torch.maximum(-lo, hi))
        if not math.isfinite(batch_max):
            raise nonfinite_error(index)
        if self._counts is None:
            self._counts = torch.zeros(self._grid, dtype=torch.int64, device=x.device)
        if batch_max > 0:
            self._grow(max(_ceil_log2(batch_max), _MIN_EXP))
        self._max = max(self._max, batch_max)
        self._numel += x.numel()
        # |value| * 2**(log2_grid - exp) is exact and at most grid (only a value of exactly
        # 2**exp reaches it: counted in the top bin); truncation == floor for non-negative values
        factor = 2.0 ** (self._log2_grid - self._exp)
        if x.device.type == "cpu":
            self._counts += _bincount_cpu(x.reshape(-1), factor, self._grid, signed=bool(lo < 0))
            return
        flat = x.reshape(-1)
        for start in range(0, flat.numel(), _CHUNK):
            idx = flat[start : start + _CHUNK].mul(factor).abs_().to(torch.int32)
            full = torch.bincount(idx, minlength=self._grid + 1)
            full[self._grid - 1] += full[self._grid]
            self._counts += full[: self._grid]

    def _merge_pending(self) -> None:
        """Fold the batches binned on the device (:func:`qdq.kernels.abs_histogram`, each on its
        own grid) into the running histogram: one read of their maxima for all of them, then
        exact merges of ``2**d`` bins, as if each had been binned on the common grid."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        stats = torch.stack([p[1] for p in pending]).cpu().tolist()  # the one synchronisation
        for (_, _, _, index), (top, _) in zip(pending, stats, strict=True):
            if not math.isfinite(top):
                raise nonfinite_error(index)
        if self._counts is None:
            self._counts = torch.zeros(self._grid, dtype=torch.int64, device=pending[0][0].device)
        self._grow(max(int(exp) for _, exp in stats))
        self._max = max(self._max, *(top for top, _ in stats))
        pad = 0
        for (counts, _, lanes, _), (_, exp) in zip(pending, stats, strict=True):
            pad += lanes  # every padding lane was counted in bin 0, which stays bin 0
            shift = self._exp - int(exp)
            if shift == 0:
                self._counts += counts
            elif shift >= self._log2_grid:
                self._counts[0] += counts.sum()
            else:
                self._counts[: self._grid >> shift] += counts.view(-1, 1 << shift).sum(dim=1)
        self._counts[0] -= pad

    def _grow(self, exp: int) -> None:
        """Double the range until it reaches ``2**exp``, merging bins exactly."""
        if exp <= self._exp or self._counts is None:
            return
        self._counts = self._regrid(self._counts, exp - self._exp)
        self._exp = exp

    def _regrid(self, counts: torch.Tensor, shift: int) -> torch.Tensor:
        """``counts`` on a grid ``2**shift`` times as wide (every ``2**shift`` bins merged into
        one, exactly), in place."""
        if shift <= 0:
            return counts
        if shift >= self._log2_grid:
            total = counts.sum()
            counts.zero_()
            counts[0] = total
            return counts
        merged = counts.view(-1, 1 << shift).sum(dim=1)
        counts.zero_()
        counts[: merged.numel()] = merged
        return counts

    def _absorb(self, other: Calibrator) -> None:
        assert isinstance(other, HistogramCalibrator)
        if (other.num_bins, other.num_bits, other.unsigned) != (
            self.num_bins,
            self.num_bits,
            self.unsigned,
        ):
            raise TypeError(
                f"cannot merge a histogram of {other.num_bins} bins / {other.num_bits} bits into "
                f"one of {self.num_bins} bins / {self.num_bits} bits"
            )
        self._merge_pending()
        other._merge_pending()
        if other._counts is not None:
            theirs = other._regrid(other._counts.clone(), self._exp - other._exp)
            if self._counts is None:
                self._counts, self._exp = theirs, max(self._exp, other._exp)
            else:
                self._grow(other._exp)
                self._counts += theirs.to(self._counts.device)
        self._max = max(self._max, other._max)
        self._numel += other._numel

    def _reset(self) -> None:
        self._pending = []
        self._counts = None
        self._exp = _MIN_EXP
        self._max = 0.0
        self._numel = 0

    def _sync(self, group: object) -> None:
        self._merge_pending()
        # the grid is a power of two: grow every rank to the largest range (exact bin merges),
        # then the int64 counts add up to what one process would have counted
        exp = int(all_reduce(torch.tensor([self._exp], dtype=torch.int64), "max", group)[0])
        if self._counts is not None:
            self._grow(exp)
        self._exp = exp
        local = (self._counts if self._counts is not None
                 else torch.zeros(self._grid, dtype=torch.int64))  # fmt: skip
        summed = all_reduce(local, "sum", group)
        seen = int(all_reduce(torch.tensor([0 if self._counts is None else 1]), "sum", group)[0])
        if seen:
            self._counts = summed
        self._max = float(
            all_reduce(torch.tensor([self._max], dtype=torch.float64), "max", group)[0]
        )
        self._numel = int(
            all_reduce(torch.tensor([self._numel], dtype=torch.int64), "sum", group)[0]
        )

    # ---------------------------------------------------------------- results
    @property
    def below_floor(self) -> bool:
        """Whether data was collected and all of it lies at or below :data:`FLOOR` (``2**-24``):
        every method then returns the observed max (see the module docstring)."""
        self._merge_pending()
        return self._numel > 0 and self._max <= FLOOR

    @property
    def observed_max(self) -> float:
        """The largest ``|x|`` collected."""
        self._merge_pending()
        return self._max

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(counts, edges)`` as numpy arrays, up to the last non-empty bin.

        Raises:
            CalibrationError: nothing was collected.
        """
        self._check_has_data()
        self._merge_pending()
        if self._counts is None:
            raise CalibrationError("HistogramCalibrator collected only empty tensors")
        counts = self._counts.cpu().numpy()
        nonzero = np.flatnonzero(counts)
        n = int(nonzero[-1]) + 1 if nonzero.size else 1
        width = 2.0 ** (self._exp - self._log2_grid)
        edges = np.arange(n + 1, dtype=np.float64) * width
        return counts[:n].copy(), edges

    def compute_amax(self, method: str = "max", *, percentile: float | None = None) -> torch.Tensor:
        """Return amax (a float32 scalar tensor on the data's device) by ``method``.

        Args:
            method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"``.
            percentile: for ``"percentile"`` only; default 99.99.

        Raises:
            ValueError: unknown method, or ``percentile`` given for another method / out of (0, 100].
            CalibrationError: no data collected.
        """
        self._check_method(method, percentile)
        counts, edges = self.histogram()
        device = self._counts.device if self._counts is not None else None
        if self._max <= FLOOR or method == "max":
            value = self._max  # below the floor: the scale is floored whatever the method
        elif method == "entropy":
            value = entropy_amax(counts, edges, num_bits=self.num_bits, unsigned=self.unsigned)
        elif method == "mse":
            value = mse_amax(counts, edges, observed_max=self._max, num_bits=self.num_bits)
        else:
            p = DEFAULT_PERCENTILE if percentile is None else percentile
            value = percentile_amax(counts, edges, p)
        return torch.tensor(min(value, self._max), dtype=torch.float32, device=device)

    def __repr__(self) -> str:
        self._merge_pending()
        return (
            f"HistogramCalibrator(num_bins={self.num_bins}, batches={self.num_batches}, "
            f"max={self._max:.6g})"
        )
