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
with float32 counts).

Each batch is binned on its own grid and merged into the running histogram **on the device**, up to
:data:`MERGE_EVERY` batches at a time: all regridded to the widest range by one ``scatter_add``
(:meth:`HistogramCalibrator._flush`; a merge costs a fixed number of ops however many batches it
takes), the running exponent, maximum and first bad batch kept as device tensors. Nothing is read back while
collecting, so a GPU never waits for a calibration batch (issue 48: 165 host syncs per batch on
ResNet-50 before, 0 now); the state is read once, when amax is computed (a batch with NaN/inf is
named then, by its index). The binning: on a GPU, :func:`qdq.kernels.abs_histogram` in one fused
pass (a transposed view, an attention operand, copied to dense first); on another device without
the fused kernels, ``index_add_`` into the grid (:func:`_bincount_device`: ``torch.bincount`` reads
its size back). On the CPU, where reading a value back costs nothing (:func:`reads_free`), each
batch's range and sign are read (a non-negative batch skips the ``abs`` pass, and a NaN/inf batch
fails at once): ``torch.bincount`` of int32 bin indices over chunks of 2**17 values through reused
buffers with one torch thread, and ``scatter_add_`` into one row per thread
(:func:`_scatter_cpu`) with more.
The largest ``|x|`` of a batch comes from one ``torch.aminmax`` pass; ``|x|`` itself is never
materialised.

Methods (``compute_amax(method)``; one collection serves them all):

* ``"max"`` — the exact largest ``|x|`` seen;
* ``"entropy"`` — :func:`qdq.calib.methods.entropy_amax` (TensorRT's KL procedure);
* ``"mse"`` — :func:`qdq.calib.methods.mse_amax` (bin-centre MSE; 1.0×max is a candidate);
* ``"percentile"`` — :func:`qdq.calib.methods.percentile_amax` (default 99.99).

The grid is the same for both quantization formats: ``fmt="fp8"`` (float8 E4M3FN, issue 49) only
changes what ``"mse"`` scores (the FP8 grid, ``scale = amax / 448``), and refuses ``"entropy"``
(TensorRT's procedure on 127 integer levels, which has no FP8 meaning). ``max`` and
``percentile`` do not depend on the grid.

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

import functools
import math
import threading

import numpy as np
import torch

from qdq import kernels
from qdq._numerics import HISTOGRAM_MIN_EXP as _MIN_EXP
from qdq.calib.base import CalibrationError, Calibrator, all_reduce, nonfinite_error
from qdq.calib.methods import entropy_amax, mse_amax, percentile_amax
from qdq.config import FORMATS

__all__ = ["HistogramCalibrator"]

# _MIN_EXP, the grid's lowest exponent (-24), is written in qdq._numerics, below this module and
# the fused histogram kernel, which clamps each batch's exponent with the same number
#: the bottom of the grid's range: every method returns the observed max at or below it
FLOOR = 2.0**_MIN_EXP
_CHUNK = 1 << 24
_CPU_CHUNK = 1 << 17
_SCATTER_CHUNK = 1 << 19
_PARALLEL_MIN = 1 << 16
#: batches binned before they are merged into the running histogram (:meth:`_flush`): a merge
#: costs the same few ops for one batch or many, and a pending batch holds ``2 * num_bins`` int64
#: counts on the device (32 KiB by default)
MERGE_EVERY = 16
_NO_BAD = 1 << 62  # above every batch index
DEFAULT_PERCENTILE = 99.99


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
    the last bin; ``v`` finite); ``signed=False`` promises ``v >= 0`` (no ``abs`` pass). With one
    torch thread (or few values): ``torch.bincount`` over pieces of at most ``_CPU_CHUNK``
    values; with more, :func:`_scatter_cpu`, which the threads share."""
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
    chunk: torch.Tensor,
    factor: float | torch.Tensor,
    scaled: torch.Tensor,
    index: torch.Tensor,
    signed: bool,
    grid: int | None = None,
) -> None:
    """``index = floor(|chunk| * factor)`` through the buffer ``scaled``. With ``grid`` the
    values may be non-finite (the device path, which reads nothing back to check): they are
    kept in ``[0, grid]`` and the batch is reported when its statistics are read."""
    torch.mul(chunk, factor, out=scaled)  # factor: a power of two, exact
    if signed:
        scaled.abs_()
    if grid is not None:
        torch.nan_to_num_(scaled, nan=0.0, posinf=float(grid))
        scaled.clamp_(max=grid)
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


def _bincount_device(values: torch.Tensor, factor: torch.Tensor, grid: int) -> torch.Tensor:
    """The counts on a device where reading back waits for it, without the fused kernels:
    ``index_add_`` into the grid (``torch.bincount`` reads its size back), in pieces of
    ``_CHUNK``; ``factor`` a 0-dim tensor on the device, the values possibly non-finite."""
    counts = torch.zeros(grid + 1, dtype=torch.int64, device=values.device)
    for start in range(0, values.numel(), _CHUNK):
        chunk = values[start : start + _CHUNK]
        scaled = torch.empty_like(chunk)
        index = torch.empty(chunk.numel(), dtype=torch.int64, device=values.device)
        _bin_index(chunk, factor, scaled, index, True, grid)
        counts.index_add_(0, index, torch.ones_like(index))
    counts[grid - 1] += counts[grid]
    return counts[:grid]


def reads_free(device: torch.device) -> bool:
    """Whether reading a value back from ``device`` costs nothing: on the CPU the calibrator
    reads ``max|x|`` and the sign of each batch (the range, and no ``abs`` pass over a
    non-negative batch); on any other device nothing is read back while collecting."""
    return device.type == "cpu"


def _ceil_log2(v: float) -> int:
    """Smallest ``e`` with ``2**e >= v`` (exact, for positive finite ``v``)."""
    mant, exp = math.frexp(v)  # v = mant * 2**exp, 0.5 <= mant < 1
    return exp - 1 if mant == 0.5 else exp


def _exponent(top: torch.Tensor) -> torch.Tensor:
    """The smallest ``e >= _MIN_EXP`` with ``2**e >= top`` as an int64 0-dim tensor on ``top``'s
    device, computed there (``_MIN_EXP`` for 0 and for a non-finite ``top``)."""
    mantissa, exp = torch.frexp(top)  # top = mantissa * 2**exp, 0.5 <= mantissa < 1
    e = exp.to(torch.int64) - (mantissa == 0.5).to(torch.int64)
    e = torch.where(torch.isfinite(top) & (top > 0), e, _MIN_EXP)
    return torch.clamp(e, min=_MIN_EXP)


class HistogramCalibrator(Calibrator):
    """Streaming ``|x|`` histogram; compute amax by max, entropy, mse or percentile.

    Args:
        num_bins: resolution: at least this many bins span ``[0, max|x|]``. A power of two, >= 256.
        num_bits: the quantization width the methods optimise for (8 for ``fmt="fp8"``).
        unsigned: quantize to an unsigned range (entropy merges into twice as many groups). INT8
            only.
        fmt: the quantization format the methods optimise for: ``"int8"`` or ``"fp8"`` (float8
            E4M3FN: ``"mse"`` on its grid; ``"entropy"`` refused, see :meth:`compute_amax`).

    Raises:
        TypeError: ``num_bins`` is not an int.
        ValueError: ``num_bins`` not a power of two >= 256, ``num_bits`` out of 2..8, an unknown
            ``fmt``, or ``fmt="fp8"`` with ``num_bits != 8`` or ``unsigned``.

    Example:
        >>> cal = HistogramCalibrator()
        >>> for _ in range(4):
        ...     cal.collect(torch.randn(1000))
        >>> amax = {m: cal.compute_amax(m) for m in ("max", "entropy", "mse", "percentile")}
        >>> bool(amax["entropy"] <= amax["max"])
        True
        >>> fp8 = HistogramCalibrator(fmt="fp8")
        >>> fp8.collect(torch.randn(1000))
        >>> fp8.methods
        ('max', 'mse', 'percentile')
    """

    methods: tuple[str, ...] = ("max", "entropy", "mse", "percentile")

    def __init__(
        self, num_bins: int = 2048, *, num_bits: int = 8, unsigned: bool = False, fmt: str = "int8"
    ) -> None:
        super().__init__()
        if isinstance(num_bins, bool) or not isinstance(num_bins, int):
            raise TypeError(f"num_bins must be an int, got {type(num_bins).__name__}")
        if num_bins < 256 or num_bins & (num_bins - 1):
            raise ValueError(f"num_bins must be a power of two >= 256, got {num_bins}")
        if not 2 <= num_bits <= 8:
            raise ValueError(f"num_bits must be in 2..8, got {num_bits}")
        if fmt not in FORMATS:
            raise ValueError(
                f"unknown quantization format {fmt!r}; choose one of {', '.join(FORMATS)}"
            )
        if fmt == "fp8" and (num_bits != 8 or unsigned):
            raise ValueError(
                "fmt='fp8' is float8 E4M3FN (8 bits, signed): it takes neither "
                f"num_bits={num_bits} nor unsigned={unsigned}"
            )
        self.num_bins = num_bins
        self.num_bits = num_bits
        self.unsigned = unsigned
        self.fmt = fmt
        if fmt == "fp8":  # what the callers may ask for (entropy has no FP8 meaning)
            self.methods = tuple(m for m in type(self).methods if m != "entropy")
        self._grid = 2 * num_bins  # bins over [0, 2**exp]
        self._log2_grid = self._grid.bit_length() - 1
        #: on the data's device, nothing read back while collecting: the counts on the grid of
        #: ``2**exp``, that exponent (int64), the largest |x| (float64) and the index of the first
        #: batch holding NaN/inf (-1: none)
        self._counts: torch.Tensor | None = None
        self._exp_t: torch.Tensor | None = None
        self._max_t: torch.Tensor | None = None
        self._bad_t: torch.Tensor | None = None
        #: the exponent, the largest |x| and the first bad batch (-1: none) read back (``None``:
        #: not since the last batch), and the counts read back (``None``: not since the last batch)
        self._read: tuple[int, float, int] | None = (_MIN_EXP, 0.0, -1)
        self._host_counts: np.ndarray | None = None
        self._numel = 0
        #: batches binned, not merged yet (:meth:`_flush`): counts on their own grid,
        #: ``[max|x|, exponent]`` on the device (float32 from the fused kernel, else float64),
        #: the batch index, and the padding lanes the fused kernel counted in bin 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []

    # ---------------------------------------------------------------- collection
    def _collect(self, x: torch.Tensor, index: int) -> None:
        if x.numel() == 0:
            return
        x = kernels.densified(x)
        pad = 0
        if kernels.usable(x):  # a GPU: one fused pass on the batch's own grid (module docstring)
            counts, stats, pad = kernels.abs_histogram(x, self._grid)
        else:
            if x.dtype != torch.float32 and x.dtype != torch.float64:
                x = x.to(torch.float32)  # exact for half / bfloat16
            lo, hi = torch.aminmax(x)  # max|x| = max(-min, max), one pass and no copy of x
            top = torch.maximum(-lo, hi).to(torch.float64)
            flat = x.reshape(-1)
            if reads_free(x.device):  # the CPU: the range and the sign read back, for free
                batch_max = float(top)
                if not math.isfinite(batch_max):
                    raise nonfinite_error(index)
                e = max(_ceil_log2(batch_max), _MIN_EXP) if batch_max > 0 else _MIN_EXP
                counts = _bincount_cpu(flat, 2.0 ** (self._log2_grid - e), self._grid,
                                       signed=bool(lo < 0))  # fmt: skip
                stats = torch.tensor([batch_max, e], dtype=torch.float64)
            else:
                exp = _exponent(top)
                factor = torch.ldexp(torch.ones((), dtype=x.dtype, device=x.device),
                                     self._log2_grid - exp)  # fmt: skip
                counts = _bincount_device(flat, factor, self._grid)
                stats = torch.stack([top, exp.to(torch.float64)])
        self._numel += x.numel()
        self._read, self._host_counts = None, None
        if self._pending and index != self._pending[-1][2] + 1:
            self._flush()  # an empty batch came between: the pending indices stay consecutive
        self._pending.append((counts, stats, index, pad))
        if len(self._pending) >= MERGE_EVERY:
            self._flush()

    def _flush(self) -> None:
        """Merge the pending batches into the running histogram on the device, all at once: about
        20 kernels however many batches (issue 48: merging each batch as it came cost 30 ops per
        batch and quantizer), nothing read back. The batches' counts and the running ones are
        regridded to the widest range by one ``scatter_add`` (exactly: ``2**d`` bins into one),
        the padding lanes the fused kernel counted in bin 0 (which every regrid keeps in bin 0)
        subtracted; the maximum and the exponent come from the finite batches only, and the
        first batch holding NaN/inf is kept to be named when the state is read."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        device = (self._counts if self._counts is not None else pending[0][0]).device
        rows = [c for c, _, _, _ in pending]
        stats = torch.stack([s.to(device) for _, s, _, _ in pending]).to(torch.float64)
        top = stats[:, 0]
        finite = top < math.inf  # max|x| >= 0: false for NaN and inf alike
        # a bad batch's exponent may be NaN: replaced before the conversion
        exps = torch.where(finite, stats[:, 1], float(_MIN_EXP)).to(torch.int64)
        # the batch indices are consecutive (_collect): an arange plus the first, computed on
        # the device (a tensor of host numbers would be a copy the device waits for)
        index = torch.arange(len(pending), device=device) + pending[0][2]
        bad = torch.where(finite, _NO_BAD, index).min()
        top = torch.where(finite, top, 0.0).max()
        bad = torch.where(bad == _NO_BAD, -1, bad)
        self._merge(rows, exps, top, bad, pad=sum(p for _, _, _, p in pending))

    def _merge(
        self,
        rows: list[torch.Tensor],
        exps: torch.Tensor,
        top: torch.Tensor,
        bad: torch.Tensor,
        pad: int = 0,
    ) -> None:
        """Add histograms (``rows``, each on the grid of ``2**exps[i]``, with their finite
        maximum ``top`` and first bad batch ``bad``, -1 for none) to the running one on the
        device, the running one as one more row: all regridded to the widest range by one
        ``scatter_add`` (exactly: ``2**d`` bins into one), ``pad`` lanes taken from bin 0 (which
        every regrid keeps in bin 0), nothing read back."""
        running = self._counts
        device = (running if running is not None else rows[0]).device
        rows = [r.to(device) for r in rows]
        exps, top, bad = exps.to(device), top.to(device), bad.to(device)
        if running is not None:
            assert self._exp_t is not None and self._max_t is not None
            assert self._bad_t is not None
            rows.insert(0, running)
            exps = torch.cat([self._exp_t.reshape(1), exps])
            top = torch.maximum(self._max_t, top)
            bad = torch.where(self._bad_t >= 0, self._bad_t, bad)
        wider = exps.max()
        counts = self._regrid(torch.stack(rows), wider - exps)
        if pad:
            counts[0] -= pad
        self._counts, self._exp_t, self._max_t, self._bad_t = counts, wider, top, bad

    def _regrid(self, counts: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """``counts`` (one row of ``grid`` bins, or ``[n, grid]``: their sum) on a grid ``2**shift``
        times as wide (``shift >= 0`` int64 on the device, 0-dim or one per row: bins
        ``[k·2**s, (k+1)·2**s)`` into bin ``k``, all into bin 0 past the grid's size), by one
        ``scatter_add`` on the device."""
        bins = _bins(self._grid, counts.device)
        target = bins >> torch.clamp(shift, 0, self._log2_grid).reshape(-1, 1)
        out = torch.zeros(self._grid, dtype=counts.dtype, device=counts.device)
        return out.scatter_add_(0, target.reshape(-1), counts.reshape(-1))

    def _host(self) -> tuple[int, float]:
        """The exponent and the largest |x| (one read back from the device, kept until the next
        batch; none when :func:`qdq.calib.batched.read_back` read them already).

        Raises:
            CalibrationError: a batch held NaN or inf (naming the first one).
        """
        self._flush()
        if self._read is None:
            assert self._exp_t is not None and self._max_t is not None and self._bad_t is not None
            exp, top, bad = torch.stack([self._exp_t.to(torch.float64), self._max_t,
                                         self._bad_t.to(torch.float64)]).tolist()  # fmt: skip
            self._read = (int(exp), top, int(bad))
        exp, top, bad = self._read
        if bad >= 0:
            raise nonfinite_error(bad)
        return exp, top

    def _pending_reads(self, method: str) -> list[torch.Tensor]:
        self._flush()
        if self._counts is None:
            return []
        parts = []
        if self._read is None:
            assert self._exp_t is not None and self._max_t is not None and self._bad_t is not None
            device = self._counts.device
            top = self._max_t.to(device=device, dtype=torch.float64).reshape(1)
            parts.append(torch.cat([self._exp_t.to(device, torch.int64).reshape(1),
                                    top.view(torch.int64),  # its bits: read back exactly
                                    self._bad_t.to(device, torch.int64).reshape(1)]))  # fmt: skip
        if method != "max" and self._host_counts is None:
            parts.append(self._counts.to(torch.int64))
        return parts

    def _receive_reads(self, values: list[np.ndarray]) -> None:
        rest = values
        if self._read is None:
            state, rest = values[0], values[1:]
            top = float(state[1:2].view(np.float64)[0])
            self._read = (int(state[0]), top, int(state[2]))
        if rest:
            self._host_counts = rest[0]

    def _absorb(self, other: Calibrator) -> None:
        assert isinstance(other, HistogramCalibrator)
        if (other.num_bins, other.num_bits, other.unsigned, other.fmt) != (
            self.num_bins,
            self.num_bits,
            self.unsigned,
            self.fmt,
        ):
            raise TypeError(
                f"cannot merge a histogram of {other.num_bins} bins / {other.num_bits} bits / "
                f"{other.fmt} into one of {self.num_bins} bins / {self.num_bits} bits / {self.fmt}"
            )
        self._flush()
        other._flush()
        if other._counts is not None:
            assert other._exp_t is not None and other._max_t is not None
            assert other._bad_t is not None
            self._merge([other._counts], other._exp_t.reshape(1), other._max_t, other._bad_t)
        self._numel += other._numel

    def _reset(self) -> None:
        self._pending = []
        self._counts = self._exp_t = self._max_t = self._bad_t = None
        self._read, self._host_counts = (_MIN_EXP, 0.0, -1), None
        self._numel = 0

    def _sync(self, group: object) -> None:
        # the grid is a power of two: grow every rank to the largest range (exact bin merges),
        # then the int64 counts add up to what one process would have counted
        own_exp, own_max = self._host()
        exp = int(all_reduce(torch.tensor([own_exp], dtype=torch.int64), "max", group)[0])
        local = torch.zeros(self._grid, dtype=torch.int64)
        if self._counts is not None:
            shift = torch.tensor(exp - own_exp, device=self._counts.device)
            local = self._regrid(self._counts, shift)
        summed = all_reduce(local, "sum", group)
        seen = int(all_reduce(torch.tensor([0 if self._counts is None else 1]), "sum", group)[0])
        top = float(all_reduce(torch.tensor([own_max], dtype=torch.float64), "max", group)[0])
        self._numel = int(
            all_reduce(torch.tensor([self._numel], dtype=torch.int64), "sum", group)[0]
        )
        if seen:
            device = summed.device
            self._counts = summed
            self._exp_t = torch.tensor(exp, dtype=torch.int64, device=device)
            self._max_t = torch.tensor(top, dtype=torch.float64, device=device)
            self._bad_t = torch.tensor(-1, dtype=torch.int64, device=device)
            self._read, self._host_counts = None, None

    # ---------------------------------------------------------------- results
    @property
    def below_floor(self) -> bool:
        """Whether data was collected and all of it lies at or below :data:`FLOOR` (``2**-24``):
        every method then returns the observed max (see the module docstring)."""
        return self._numel > 0 and self._host()[1] <= FLOOR

    @property
    def observed_max(self) -> float:
        """The largest ``|x|`` collected."""
        return self._host()[1]

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(counts, edges)`` as numpy arrays, up to the last non-empty bin.

        Raises:
            CalibrationError: nothing was collected, or a batch held NaN or inf.
        """
        self._check_has_data()
        self._flush()
        if self._counts is None:
            raise CalibrationError("HistogramCalibrator collected only empty tensors")
        exp, _ = self._host()
        if self._host_counts is None:
            self._host_counts = self._counts.cpu().numpy()
        counts = self._host_counts
        nonzero = np.flatnonzero(counts)
        n = int(nonzero[-1]) + 1 if nonzero.size else 1
        width = 2.0 ** (exp - self._log2_grid)
        edges = np.arange(n + 1, dtype=np.float64) * width
        return counts[:n].copy(), edges

    def compute_amax(self, method: str = "max", *, percentile: float | None = None) -> torch.Tensor:
        """Return amax (a float32 scalar tensor on the data's device) by ``method``.

        Args:
            method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"``.
            percentile: for ``"percentile"`` only; default 99.99.

        Raises:
            ValueError: unknown method, or ``percentile`` given for another method / out of (0, 100].
            CalibrationError: no data collected; or ``"entropy"`` asked of an FP8 calibrator
                (a :class:`ValueError` too; through a quantizer the message names it).
        """
        if method == "entropy" and self.fmt == "fp8":
            raise CalibrationError(
                "method 'entropy' is TensorRT's KL search over 127 INT8 levels and has no FP8 "
                "meaning; this calibrator is for format 'fp8' (float8 E4M3FN): use 'max', 'mse' "
                "or 'percentile'"
            )
        self._check_method(method, percentile)
        self._check_has_data()
        self._flush()
        if self._counts is None:
            raise CalibrationError("HistogramCalibrator collected only empty tensors")
        device = self._counts.device
        top = self._host()[1]
        if top <= FLOOR or method == "max":
            return torch.tensor(top, dtype=torch.float32, device=device)  # no histogram read
        counts, edges = self.histogram()
        if method == "entropy":
            value = entropy_amax(counts, edges, num_bits=self.num_bits, unsigned=self.unsigned)
        elif method == "mse":
            value = mse_amax(counts, edges, observed_max=top, num_bits=self.num_bits, fmt=self.fmt)
        else:
            p = DEFAULT_PERCENTILE if percentile is None else percentile
            value = percentile_amax(counts, edges, p)
        return torch.tensor(min(value, top), dtype=torch.float32, device=device)

    def __repr__(self) -> str:
        top = "?" if self._read is None else f"{self._read[1]:.6g}"  # no read back for a repr
        fmt = "" if self.fmt == "int8" else f", fmt={self.fmt!r}"
        return (
            f"HistogramCalibrator(num_bins={self.num_bins}{fmt}, batches={self.num_batches}, "
            f"max={top})"
        )


@functools.cache
def _bins_cached(grid: int, device: torch.device) -> torch.Tensor:
    return torch.arange(grid, device=device)


def _bins(grid: int, device: torch.device) -> torch.Tensor:
    """``arange(grid)`` on ``device``, made once per device (not under a tracer)."""
    if torch.compiler.is_compiling():
        return torch.arange(grid, device=device)
    return _bins_cached(grid, device)
