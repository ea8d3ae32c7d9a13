"""Slow, literal reference implementations of the calibration methods (test oracles only).

``entropy_reference`` follows the TensorRT/pytorch-quantization KL procedure step by step, with a
Python loop per candidate and scipy's ``entropy`` (reference/peers-and-numerics.md §2.4).
``mse_reference`` and ``percentile_reference`` spell out the definitions documented in
``qdq.calib.methods`` one candidate / one bin at a time; ``mse_exhaustive`` is the earlier
vectorised MSE search over every candidate.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import entropy


def entropy_reference(counts, edges, num_bits=8, unsigned=False, start_bin=128, stride=1):
    """Return ``(amax, divergences)`` by the reference KL loop."""
    bins = np.array(counts, dtype=np.int64, copy=True)
    bins[0] = bins[1]
    nq = 1 << (num_bits - 1 + int(unsigned))
    divergences = []
    for i in range(start_bin, len(bins) + 1, stride):
        groups = np.digitize(np.arange(i), np.linspace(0, i, num=nq + 1)) - 1
        groups[bins[:i] == 0] = -1
        q = np.zeros(i, dtype=np.float64)
        for k in range(nq):
            members = groups == k
            n_members = int(members.sum())
            if n_members:
                q[members] = bins[:i][members].sum() / n_members
        p = bins[:i].astype(np.float64)
        p[i - 1] += bins[i:].sum()
        divergences.append(entropy(p, q))
    div = np.array(divergences)
    last_argmin = len(div) - 1 - int(np.argmin(div[::-1]))
    return float(edges[last_argmin * stride + start_bin]), div


def mse_reference(counts, edges, observed_max, num_bits=8, start_bin=128):
    """Bin-centre MSE search, one candidate at a time."""
    qmax = 2 ** (num_bits - 1) - 1
    n = len(counts)
    first = start_bin if start_bin < n else 1
    candidates = [*list(edges[first:n]), observed_max]
    centers = (np.asarray(edges[:-1]) + np.asarray(edges[1:])) / 2.0
    best, best_err = None, np.inf
    for a in candidates:
        if a <= 0:
            continue
        scale = a / qmax
        err = 0.0
        errs = np.empty(n)
        for j in range(n):
            q = min(np.rint(centers[j] / scale), qmax)
            errs[j] = (q * scale - centers[j]) ** 2 * float(counts[j])
        err = errs.sum()
        if err < best_err:
            best, best_err = a, err
    return float(best)


def mse_exhaustive(counts, edges, observed_max=None, num_bits=8, start_bin=128):
    """Bin-centre MSE search evaluating every candidate in float64, 64 candidates at a time: the
    implementation ``qdq.calib.methods.mse_amax`` replaced by a bounded search, kept to check
    that the search returns exactly what it returned."""
    c = np.asarray(counts)
    e = np.asarray(edges, dtype=np.float64)
    n = c.size
    top = float(e[-1]) if observed_max is None else float(observed_max)
    first = start_bin if start_bin < n else 1
    cands = np.concatenate([e[first:n], [top]])
    cands = cands[cands > 0]
    if cands.size == 0:
        return 0.0
    qmax = float(2 ** (num_bits - 1) - 1)
    centers = (e[:-1] + e[1:]) / 2.0
    w = c.astype(np.float64)
    errs = np.empty(cands.size)
    for lo in range(0, cands.size, 64):
        a = cands[lo : lo + 64, None]
        scale = a / qmax
        q = np.minimum(np.rint(centers[None, :] / scale), qmax)
        errs[lo : lo + 64] = ((q * scale - centers[None, :]) ** 2 * w[None, :]).sum(axis=1)
    return float(cands[int(np.argmin(errs))])


def percentile_reference(counts, edges, percentile):
    """Walk the bins until the running count reaches ``percentile`` % of the total."""
    total = int(np.sum(counts))
    running = 0
    for j, c in enumerate(counts):
        running += int(c)
        if running * 100.0 >= percentile * total:
            return float(edges[j + 1])
    return float(edges[-1])


def random_histogram(
    rng: np.random.Generator, trial: int
) -> tuple[np.ndarray, np.ndarray, float | None]:
    """``(counts, edges, observed_max)`` of a hard case for the bounded mse searches, by
    ``trial``: dense, sparse, decaying, spiky and huge counts; power-of-two and other bin
    widths, irregular edges; an observed max inside the top bin or none."""
    n = int(rng.integers(2, 4097))
    kind = trial % 6
    if kind == 0:
        counts = rng.integers(0, 1000, n)
    elif kind == 1:
        counts = (rng.random(n) < 0.05) * rng.integers(0, 10**9, n)
    elif kind == 2:
        counts = np.round(1e6 * np.exp(-np.arange(n) / rng.uniform(5, 500))).astype(np.int64)
    elif kind == 3:
        counts = rng.integers(0, 3, n) * (rng.random(n) < 0.5)
    elif kind == 4:
        counts = np.zeros(n, dtype=np.int64)
        counts[rng.integers(0, n, 3)] = rng.integers(1, 10**6, 3)
    else:
        counts = rng.integers(0, 2**62, n)
    width = (2.0 ** int(rng.integers(-30, 10)) / 2048) * (1.0 if trial % 5 else 0.3)
    edges = np.arange(n + 1) * width
    if trial % 7 == 0:
        edges = np.concatenate([[0.0], np.cumsum(rng.random(n) + 1e-3)]) * width
    top = float(edges[-1]) * rng.uniform(0.5, 1.0) if trial % 3 else None
    return counts, edges, top
