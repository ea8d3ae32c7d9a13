"""amax from a histogram of ``|x|``: entropy (KL), MSE and percentile, as pure functions.

Every function takes ``counts`` (non-negative integers, one per bin) and ``edges`` (``len(counts)+1``
increasing bin edges starting at 0) and returns a Python float. They are deterministic, vectorised and
never modify their inputs.

* :func:`entropy_amax` — TensorRT/pytorch-quantization KL divergence search. For given options it
  returns the same amax as the reference loop (``reference/peers-and-numerics.md`` §2.4): after
  ``bins[0] = bins[1]``, each candidate ``i`` (from ``start_bin`` to ``len(counts)`` by ``stride``)
  keeps the first ``i`` bins, folds the outliers into bin ``i-1`` (P), merges the first ``i`` bins
  into ``2**(num_bits-1)`` groups and spreads each group's mass evenly over its non-empty bins (Q);
  the amax is ``edges[i*]`` for the *largest* ``i*`` minimising ``KL(P || Q)``. A candidate that
  keeps no mass at all (every count beyond it) has infinite KL here; the reference gets 0/0 = NaN
  there and its ``argmin`` picks it, clipping all data — the one named deviation. Instead of a Python
  loop per candidate, all candidates are evaluated at once from prefix sums of the counts (exact
  integers) and of ``b·log b`` (extended precision), so the cost is O(candidates × groups).
* :func:`mse_amax` — bin-centre MSE search: the mass of each bin sits at its centre and is
  fake-quantized with ONNX numerics; candidates are the bin edges ``edges[start_bin:-1]`` *plus the
  observed maximum* (so 1.0×max is always tried); the first minimum wins. The float64 error of
  every candidate (a count-weighted sum over all bins) is what decides; evaluating it for all
  ~4000 candidates × ~4000 bins is the cost. So every candidate is first bounded cheaply: the
  bins fall into ``qmax + 1`` contiguous runs by their code, and the error follows from suffix
  sums of ``w`` and ``w·c`` at the run boundaries, with a proven bound on how far this is from the
  float64 sum (histograms of one bin width; others are searched exhaustively). Only the
  candidates whose bound reaches the smallest one are evaluated as before, so the result is
  exactly the exhaustive search's, 20-30x faster. With ``fmt="fp8"`` the same search runs on the
  float8 E4M3FN grid (``scale = amax / 448``, each centre rounded by
  :func:`qdq.calib.fp8.fp8_round`): the runs are the 126 positive FP8 levels, their boundaries
  exact (:func:`qdq.calib.fp8.fp8_boundaries`), so only the summation bound remains.
* :func:`percentile_amax` — the right edge of the first bin at which the cumulative count reaches
  ``p`` percent of the total (so at least ``p`` % of the values are ≤ amax).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from qdq.calib.fp8 import FP8_MAX, fp8_boundaries, fp8_levels, fp8_round
from qdq.config import FORMATS

__all__ = ["entropy_amax", "mse_amax", "percentile_amax"]

# Candidates whose KL is within this of the minimum count as tied (the reference breaks exact ties,
# e.g. several candidates with KL == 0, by taking the largest; rounding noise is ~1e-17 here).
_KL_TIE_ATOL = 1e-12
_MSE_CHUNK = 64
_MSE_BLOCK = 512
_MSE_TABLE_MAX = 1 << 13  # edge tables up to 8192 rows x qmax (8 MB for 8 bits)


def _check_hist(counts: npt.ArrayLike, edges: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(counts)
    e = np.asarray(edges, dtype=np.float64)
    if c.ndim != 1 or e.ndim != 1 or e.size != c.size + 1:
        raise ValueError(
            f"need 1-D counts and len(counts)+1 edges, got shapes {c.shape} and {e.shape}"
        )
    if c.size == 0:
        raise ValueError("the histogram is empty")
    if np.any(c < 0):
        raise ValueError("histogram counts must be non-negative")
    return c, e


def entropy_amax(
    counts: npt.ArrayLike,
    edges: npt.ArrayLike,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> float:
    """Return the amax minimising the KL divergence between the clipped and quantized histogram.

    Args:
        counts: bin counts of ``|x|`` (at least ``start_bin`` bins, and two).
        edges: bin edges, ``len(counts) + 1`` of them.
        num_bits: quantization bits; the histogram is merged into ``2**(num_bits-1+unsigned)`` groups.
        unsigned: whether the quantized range is unsigned (doubles the groups).
        start_bin: the smallest candidate (number of bins kept).
        stride: step between candidates.

    Example:
        >>> import numpy as np
        >>> counts = np.round(1e6 * np.exp(-np.arange(2048) / 100)).astype(np.int64)
        >>> entropy_amax(counts, np.arange(2049) / 2048.0)
        0.54150390625
    """
    c, e = _check_hist(counts, edges)
    n = c.size
    if start_bin < 1 or stride < 1:
        raise ValueError(f"start_bin and stride must be >= 1, got {start_bin} and {stride}")
    if n < max(start_bin, 2):
        raise ValueError(
            f"entropy needs at least max(start_bin, 2)={max(start_bin, 2)} bins, got {n}"
        )
    nq = 1 << (num_bits - 1 + int(unsigned))

    b = c.astype(np.int64, copy=True)
    b[0] = b[1]  # the reference suppresses the zero spike
    total = int(b.sum())
    if total == 0:
        raise ValueError("the histogram has no counts")

    zero = np.zeros(1, dtype=np.int64)
    cum = np.concatenate([zero, np.cumsum(b)])  # exact integer prefix sums
    cnz = np.concatenate([zero, np.cumsum(b > 0)])
    ld = np.longdouble
    blogb = np.where(b > 0, b.astype(ld) * np.log(np.maximum(b, 1).astype(ld)), ld(0))
    cum_blogb = np.concatenate([np.zeros(1, dtype=ld), np.cumsum(blogb)])

    cand = np.arange(start_bin, n + 1, stride, dtype=np.int64)  # number of bins kept
    ks = np.arange(nq + 1, dtype=np.int64)
    # group k of candidate i holds bins j with k*i <= nq*j < (k+1)*i
    bounds = (ks[None, :] * cand[:, None] + nq - 1) // nq  # (m, nq+1); last column == i
    s_k = cum[bounds[:, 1:]] - cum[bounds[:, :-1]]
    n_k = cnz[bounds[:, 1:]] - cnz[bounds[:, :-1]]
    # sum_k S_k log(S_k / N_k): float64 is enough here (error ~1e-14 in KL after dividing by T)
    s64 = s_k.astype(np.float64)
    q_terms = (s64 * np.log(np.maximum(s64, 1.0) / np.maximum(n_k, 1))).sum(axis=1).astype(ld)

    c_i = cum[cand]  # mass of the kept bins (== sum of Q)
    tail = total - c_i
    last = cand - 1
    b_last = b[last]
    k_last = (nq * last) // cand
    rows = np.arange(cand.size)
    q_last = s_k[rows, k_last].astype(ld) / np.maximum(n_k[rows, k_last], 1).astype(ld)

    t = ld(total)
    c_ld = np.maximum(c_i, 1).astype(ld)
    log_ratio = np.log(c_ld / t)
    # KL over the kept bins as if P == bins[:i]:  sum_j b_j/T * log(b_j * C_i / (T * Q_j))
    kl = (cum_blogb[cand] - q_terms) / t + (c_ld / t) * log_ratio
    # then move the outlier mass into bin i-1
    p_last = (b_last + tail).astype(ld)
    with np.errstate(divide="ignore", invalid="ignore"):
        new_term = np.where(p_last > 0, p_last / t * (np.log(p_last / q_last) + log_ratio), ld(0))
        old_term = np.where(
            b_last > 0,
            b_last.astype(ld) / t * (np.log(np.maximum(b_last, 1).astype(ld) / q_last) + log_ratio),
            ld(0),
        )
    kl = kl + new_term - old_term
    # P > 0 where Q == 0: infinite. That includes candidates keeping no mass at all (C_i == 0),
    # where the reference computes 0/0 = NaN and np.argmin then *selects* them (clipping all
    # data); this is the one documented deviation from the reference.
    kl = np.where(((b_last == 0) & (tail > 0)) | (c_i == 0), ld(np.inf), kl)

    kl64 = kl.astype(np.float64)
    best = kl64.min()
    tied = (
        np.flatnonzero(kl64 <= best + _KL_TIE_ATOL) if np.isfinite(best) else np.arange(cand.size)
    )
    i_star = int(cand[tied[-1]])
    return float(e[i_star])


def mse_amax(
    counts: npt.ArrayLike,
    edges: npt.ArrayLike,
    *,
    observed_max: float | None = None,
    num_bits: int = 8,
    start_bin: int = 128,
    fmt: str = "int8",
) -> float:
    """Return the amax minimising the mean squared fake-quantization error of the bin centres.

    Candidates, ascending: ``edges[start_bin : len(counts)]`` (right edges of the bins below the top
    one; all of them when there are fewer than ``start_bin`` bins) followed by ``observed_max``
    (default: the last edge), so the plain maximum is always a candidate. Each bin's count is placed
    at its centre, fake-quantized as ONNX does, and the squared errors are count-weighted. Ties go
    to the smallest amax.

    Args:
        counts: bin counts of ``|x|``.
        edges: bin edges, ``len(counts) + 1`` of them, from 0.
        observed_max: the largest ``|x|`` (the last candidate); default the last edge.
        num_bits: the INT8 width (``qmax = 2**(num_bits-1) - 1``); 8 for ``fmt="fp8"``.
        start_bin: the first candidate is ``edges[start_bin]``.
        fmt: ``"int8"`` (``x/scale``, round half to even, saturate at ``qmax``) or ``"fp8"``
            (``scale = amax / 448``, ``x/scale`` rounded to float8 E4M3FN, ties to even,
            saturating at 448; :func:`qdq.calib.fp8.fp8_round`).

    Returns:
        The chosen amax.

    Raises:
        ValueError: a malformed histogram, an unknown ``fmt``, or ``fmt="fp8"`` with another
            ``num_bits`` than 8.

    Example:
        >>> import numpy as np
        >>> counts = np.r_[np.full(1000, 5000), np.zeros(1047), [1]]  # one outlier at 1.0
        >>> mse_amax(counts, np.arange(2049) / 2048.0, observed_max=1.0)
        0.486328125
        >>> # FP8's error is relative to each value: clipping the outlier costs more than range
        >>> mse_amax(counts, np.arange(2049) / 2048.0, observed_max=1.0, fmt="fp8")
        0.83447265625
    """
    c, e = _check_hist(counts, edges)
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "fp8" and num_bits != 8:
        raise ValueError(f"fmt='fp8' is 8-bit float8 E4M3FN, got num_bits={num_bits}")
    n = c.size
    top = float(e[-1]) if observed_max is None else float(observed_max)
    first = start_bin if start_bin < n else 1
    cands = np.concatenate([e[first:n], [top]])
    cands = cands[cands > 0]
    if cands.size == 0:
        return 0.0
    qmax = FP8_MAX if fmt == "fp8" else float(2 ** (num_bits - 1) - 1)
    centers = (e[:-1] + e[1:]) / 2.0
    w = c.astype(np.float64)
    tails = _suffix_sums(w, centers)
    big = cands.size > _MSE_CHUNK
    low = _clipped_too_much(cands, centers, w, qmax, tails, fmt) if big else 0
    rest = cands[low:]
    keep = None
    if rest.size > _MSE_CHUNK:
        if fmt == "fp8":
            keep = _fp8_contenders(rest, centers, w, tails)
        else:
            keep = _mse_contenders(rest, centers, w, qmax, tails)
    if keep is None:
        keep = np.arange(rest.size)
    errs = _mse_errors(rest[keep], centers, w, qmax, fmt)
    return float(rest[keep[int(np.argmin(errs))]])


def _suffix_sums(w: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """``(n + 1, 3)``: ``sum_{i>=j}`` of ``w_i``, ``w_i·c_i`` and ``w_i·c_i²`` for ``j = 0..n``."""
    n = w.size
    tails = np.zeros((n + 1, 3))
    terms = np.empty((n, 3))
    terms[:, 0] = w
    np.multiply(w, centers, out=terms[:, 1])
    np.multiply(terms[:, 1], centers, out=terms[:, 2])
    np.cumsum(terms[::-1], axis=0, out=tails[n - 1 :: -1] if n else tails[:0])
    return tails


def _clipped_too_much(
    cands: np.ndarray,
    centers: np.ndarray,
    w: np.ndarray,
    qmax: float,
    tails: np.ndarray,
    fmt: str = "int8",
) -> int:
    """How many of the (ascending) candidates lose to another one on clipping error alone.

    Every bin centre above a candidate ``a`` saturates to ``a``, so the error of ``a`` is at least
    ``L(a) = sum_{c > a} w·(c - a)²`` (the other terms are squares), which does not increase with
    ``a``. A few candidates are evaluated exactly (:func:`_mse_errors`, the defining values); the
    candidates whose ``L``, less a float slack far above the error of computing it from suffix
    sums (``~ n·u`` of the magnitudes) and of the saturated value ``qmax·scale`` (``~ 2u·a``),
    still exceeds the best of those cannot be the minimum nor tied with it. They are a prefix.
    The same holds on the FP8 grid (``fmt="fp8"``, ``qmax = 448``): it saturates at ``a`` too.
    """
    probes = np.unique(np.linspace(0, cands.size - 1, 9).round().astype(np.intp))
    best = float(_mse_errors(cands[probes], centers, w, qmax, fmt).min())
    t0, t1, t2 = tails[:, 0], tails[:, 1], tails[:, 2]
    j = np.searchsorted(centers, cands, side="right")  # first bin whose centre is above a
    a = cands
    lower = t2[j] - 2.0 * a * t1[j] + a * a * t0[j]
    slack = 1e-9 * (t2[j] + 2.0 * a * t1[j] + a * a * t0[j])
    beaten = (lower - slack) * (1.0 - 1e-9) > best
    if not beaten[0]:
        return 0
    return int(np.argmin(beaten)) if not beaten.all() else int(cands.size - 1)


def _mse_errors(
    cands: np.ndarray, centers: np.ndarray, w: np.ndarray, qmax: float, fmt: str = "int8"
) -> np.ndarray:
    """The float64 error of each candidate: the defining computation (row by row, so the value
    of a candidate does not depend on which other candidates are evaluated with it); on the FP8
    grid with ``fmt="fp8"`` (``qmax`` 448)."""
    errs = np.empty(cands.size)
    for lo in range(0, cands.size, _MSE_CHUNK):
        a = cands[lo : lo + _MSE_CHUNK, None]
        scale = a / qmax
        if fmt == "fp8":
            q = fp8_round(centers[None, :] / scale)
        else:
            q = np.minimum(np.rint(centers[None, :] / scale), qmax)
        errs[lo : lo + _MSE_CHUNK] = ((q * scale - centers[None, :]) ** 2 * w[None, :]).sum(axis=1)
    return errs


def _mse_contenders(
    cands: np.ndarray, centers: np.ndarray, w: np.ndarray, qmax: float, suffix: np.ndarray
) -> np.ndarray | None:
    """Indices of the candidates that may hold the first minimum of :func:`_mse_errors`, for
    bins of one power-of-two width ``d`` (``c_j = (j + 1/2)·d`` exactly, as
    :class:`~qdq.calib.HistogramCalibrator` makes them); ``None`` for other bins.

    For a scale ``s`` the code of bin ``j``, ``rint(c_j / s)`` saturated at ``qmax``, does not
    decrease with ``j``: ``b_k``, the first bin of code ``>= k``, is ``ceil((k - 1/2)·s/d - 1/2)``
    (taken as ``rint((k - 1/2)·s/d)``: the two differ only when a bin centre is on the threshold).
    With suffix sums ``T0[j] = sum_{i>=j} w_i`` and ``T1[j] = sum_{i>=j} w_i·c_i``, the error
    with those codes is, summed by parts over the codes,
    ``s²·sum_k (2k-1)·T0[b_k] - 2s·sum_k T1[b_k] + sum w·c²`` (``k = 1..qmax``). With
    ``W = sum w``, ``M = qmax·s + max c`` and ``u = 2**-53``, it is within

    * ``64·u·W·M²`` of the float64 value of :func:`_mse_errors` with *its* codes (each term
      ``w·(k·s - c)²`` is off by at most ``6u·w·M²``; numpy's pairwise sum adds at most
      ``(19 + log2(n/128))·u <= 32u`` of the sum of the terms for up to 2**20 bins);
    * ``2·δ·s²·W`` of the same with the codes computed in float, ``δ = 16u·(n + 2)·(d/s + 1) +
      8u·qmax``: the float codes and ``b_k`` above can only disagree by one code, for a bin whose
      ``c/s`` lies within ``δ`` of ``k - 1/2``, where the two squared errors differ by at most
      ``2δ·s²``;
    * ``(8(n + 3) + 4·qmax + 64)·u·W·M²`` of its own float64 evaluation here (suffix sums of
      ``n`` non-negative terms, two sums of ``qmax`` terms, the final combination).

    A candidate whose lower bound (twice these bounds below) exceeds the smallest upper bound is
    neither a minimum nor tied with one; the others are returned.
    """
    m, n = cands.size, centers.size
    width = float(centers[0]) * 2.0
    if n > 1 << 20 or not width > 0 or math.frexp(width)[0] != 0.5:  # a power of two: exact c_j
        return None
    if not np.array_equal(centers, (np.arange(n) + 0.5) * width):
        return None
    s = cands / qmax
    ks = np.arange(1.0, qmax + 1.0)

    tails = np.ascontiguousarray(suffix[:, :2])  # T0 and T1 side by side
    a_part, b_part = np.empty(m), np.empty(m)
    weights = np.zeros((2 * ks.size, 2))
    weights[0::2, 0] = 2.0 * ks - 1.0
    weights[1::2, 1] = 1.0
    with np.errstate(over="ignore", invalid="ignore"):  # huge values: evaluated exhaustively
        lo = 0
        table = _edge_table(cands, width, n, qmax)
        if table is not None:  # the edge candidates: their rows are data-independent
            lo = table.shape[0]
            _run_sums(table, tails, weights, a_part[:lo], b_part[:lo])
        block = min(m - lo, _MSE_BLOCK)
        first = np.empty((block, ks.size))
        bound = np.empty((block, ks.size), dtype=np.intp)
        for start in range(lo, m, block):
            k = min(block, m - start)
            f, b = first[:k], bound[:k]
            # rint(y) for ceil(y - 1/2): they differ only at a tie, a bin on the threshold
            np.multiply.outer(s[start : start + k] / width, ks - 0.5, out=f)
            np.minimum(f, n, out=f)
            np.rint(f, out=f)
            np.copyto(b, f, casting="unsafe")
            _run_sums(b, tails, weights, a_part[start : start + k], b_part[start : start + k])
        approx = s * s * a_part - 2.0 * s * b_part + float((w * centers * centers).sum())
        u = float(np.finfo(np.float64).eps) / 2
        total = float(w.sum())
        big_m = qmax * s + centers[-1]
        delta = 16 * u * (n + 2) * (width / s + 1.0) + 8 * u * qmax
        bound_err = (64 + 8 * (n + 3) + 4 * qmax + 64) * u * total * big_m * big_m
        margin = 2.0 * (bound_err + 2.0 * delta * s * s * total)
        # codes may differ by more than one, or the bounds overflow: always evaluated
        safe = (delta < 0.25) & np.isfinite(approx) & np.isfinite(margin)
        if not safe.any():
            return np.arange(m)
        best = np.min((approx + margin)[safe])
        return np.flatnonzero((approx - margin <= best) | ~safe)


def _fp8_contenders(
    cands: np.ndarray, centers: np.ndarray, w: np.ndarray, suffix: np.ndarray
) -> np.ndarray | None:
    """:func:`_mse_contenders` on the FP8 grid: indices of the candidates that may hold the first
    minimum of :func:`_mse_errors` with ``fmt="fp8"`` (``None``: bins not of one power-of-two
    width, searched exhaustively).

    With the positive FP8 levels ``v_1 < ... < v_K`` (``K = 126``, ``v_0 = 0``) and ``b_k`` the
    first bin of level ``>= v_k`` (:func:`~qdq.calib.fp8.fp8_boundaries`: exactly the float64
    codes, so no code can differ), the error is, summed by parts over the levels,
    ``s²·sum_k (v_k² - v_{k-1}²)·T0[b_k] - 2s·sum_k (v_k - v_{k-1})·T1[b_k] + sum w·c²`` (the
    coefficients are exact: FP8 values have 4 significant bits). Its float64 evaluation here is
    within ``(8(n + 3) + 8K + 128)·u·W·M²`` of the real value (suffix sums of ``n`` non-negative
    terms, the ``K``-term sums whose coefficients add up to ``448²`` and ``448``, the final
    combination), and :func:`_mse_errors` within ``64·u·W·M²`` of it (as for INT8), with
    ``M = 448·s + max c``. A candidate whose lower bound (twice these bounds below) exceeds the
    smallest upper bound is neither a minimum nor tied with one; the others are returned.
    """
    n = centers.size
    width = float(centers[0]) * 2.0
    if n > 1 << 20 or not width > 0 or math.frexp(width)[0] != 0.5:
        return None
    if not np.array_equal(centers, (np.arange(n) + 0.5) * width):
        return None
    levels = fp8_levels()
    k = levels.size - 1
    weights = np.zeros((2 * k, 2))
    weights[0::2, 0] = levels[1:] ** 2 - levels[:-1] ** 2
    weights[1::2, 1] = np.diff(levels)
    s = cands / FP8_MAX
    tails = np.ascontiguousarray(suffix[:, :2])  # T0 and T1 side by side
    a_part, b_part = np.empty(cands.size), np.empty(cands.size)
    with np.errstate(over="ignore", invalid="ignore"):  # huge values: evaluated exhaustively
        for lo in range(0, cands.size, _MSE_BLOCK):
            hi = min(lo + _MSE_BLOCK, cands.size)
            bound = fp8_boundaries(s[lo:hi], width, n)
            _run_sums(bound, tails, weights, a_part[lo:hi], b_part[lo:hi])
        approx = s * s * a_part - 2.0 * s * b_part + float((w * centers * centers).sum())
        u = float(np.finfo(np.float64).eps) / 2
        big_m = FP8_MAX * s + centers[-1]
        margin = 2.0 * (64 + 8 * (n + 3) + 8 * k + 128) * u * float(w.sum()) * big_m * big_m
        safe = np.isfinite(approx) & np.isfinite(margin)
        if not safe.any():
            return np.arange(cands.size)
        best = np.min((approx + margin)[safe])
        return np.flatnonzero((approx - margin <= best) | ~safe)


def _edge_table(cands: np.ndarray, width: float, n: int, qmax: float) -> np.ndarray | None:
    """Run boundaries of the leading candidates when they are consecutive bin edges ``i·d``
    (as from :func:`mse_amax` on a calibrator's histogram): rows ``i`` of
    ``rint((k - 1/2)·i/qmax)``, which equals ``rint((k - 1/2)·s/d)`` up to the float error
    the bound allows for (``s/d = i/qmax`` within ``u``), and never exceeds ``i < n``."""
    i0 = cands[0] / width
    count = cands.size - 1
    if count < 1 or n > _MSE_TABLE_MAX or i0 != math.floor(i0):
        return None
    if not np.array_equal(cands[:-1], (np.arange(count) + i0) * width):
        return None
    table = _boundary_table(qmax, 1 << max(n - 1, 1).bit_length())
    return table[int(i0) : int(i0) + count]


@functools.lru_cache(maxsize=8)
def _boundary_table(qmax: float, rows: int) -> np.ndarray:
    ks = np.arange(1.0, qmax + 1.0)
    table = np.rint(np.multiply.outer(np.arange(rows) / qmax, ks - 0.5)).astype(np.intp)
    table.flags.writeable = False
    return table


def _run_sums(
    bound: np.ndarray,
    tails: np.ndarray,
    weights: np.ndarray,
    a_out: np.ndarray,
    b_out: np.ndarray,
) -> None:
    """``a_out = sum_k (2k-1)·T0[b_k]`` and ``b_out = sum_k T1[b_k]`` per row of ``bound``, in
    blocks of rows; ``tails`` holds ``T0`` and ``T1`` side by side (``(n + 1, 2)``), so one
    gather fetches both and one matrix product (``weights``: ``(2·qmax, 2)``, zero where a
    column does not read) sums both."""
    rows, codes = bound.shape
    gathered = np.empty((min(rows, _MSE_BLOCK), codes, 2))
    for lo in range(0, rows, _MSE_BLOCK):
        b = bound[lo : lo + _MSE_BLOCK]
        k = b.shape[0]
        g = gathered[:k]
        np.take(tails, b, axis=0, out=g, mode="clip")  # in range; "clip" skips numpy's buffer
        sums = g.reshape(k, 2 * codes) @ weights
        a_out[lo : lo + k] = sums[:, 0]
        b_out[lo : lo + k] = sums[:, 1]


def percentile_amax(counts: npt.ArrayLike, edges: npt.ArrayLike, percentile: float) -> float:
    """Return the right edge of the first bin where the cumulative count reaches ``percentile`` %.

    Example:
        >>> import numpy as np
        >>> percentile_amax(np.ones(100, dtype=np.int64), np.arange(101.0), 99.0)
        99.0
    """
    c, e = _check_hist(counts, edges)
    p = float(percentile)
    if not 0.0 < p <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    cum = np.cumsum(c.astype(np.int64))
    total = int(cum[-1])
    if total == 0:
        raise ValueError("the histogram has no counts")
    idx = int(np.searchsorted(cum * 100.0 >= p * total, True))
    idx = min(idx, c.size - 1)
    return float(e[idx + 1])
