"""The float8 E4M3FN grid in float64 numpy, for calibrating on it (issue 49).

:func:`qdq.calib.methods.mse_amax` with ``fmt="fp8"`` scores a candidate amax by fake-quantizing
the histogram's bin centres on the FP8 grid: ``scale = amax / 448``, each centre ``c`` becomes
``fp8_round(c / scale) * scale``. The pieces it needs live here:

* :func:`fp8_round` — round to the nearest E4M3FN value, ties to even, saturating at ±448,
  computed exactly in float64 (the step of a binade is a power of two, so ``rint(y / step) * step``
  rounds once). On float32 inputs it equals torch's ``clamp(-448, 448).to(float8_e4m3fn)`` cast,
  which :func:`qdq.quant.fake_quant` uses; on float64 inputs it rounds once where the cast would
  first round to float32.
* :func:`fp8_levels` — the 127 non-negative finite values, ``0, 2**-9, ..., 448``.
* :func:`fp8_boundaries` — for scales ``s`` and bins of width ``d``, the first bin whose centre
  rounds to each positive level, exactly as :func:`fp8_round` of ``c / s`` computed in float64
  rounds it: the run boundaries of the bounded MSE search.

This module does not import :mod:`qdq.quant` (which imports :mod:`qdq.calib`): its
:data:`FP8_MAX` repeats :data:`qdq.quant.primitives.FP8_MAX`, and a test checks they agree.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

__all__ = ["FP8_MAX", "fp8_boundaries", "fp8_levels", "fp8_round"]

#: The largest finite E4M3FN value (``1.75 * 2**8``): the FP8 ``qmax``, ``scale = amax / 448``.
FP8_MAX = 448.0
_MIN_EXP = -6  # the smallest normal binade [2**-6, 2**-5); below it the step stays 2**-9
_MANTISSA_BITS = 3
_WINDOW = 6  # bins examined around each estimated boundary (the estimate is within +-2)


def fp8_round(y: npt.ArrayLike) -> np.ndarray:
    """Return ``y`` rounded to E4M3FN values in float64: nearest, ties to even, saturating.

    Values beyond ±448 give ±448 (the saturating conversion of ONNX ``QuantizeLinear``); the sign
    of zero is kept. No double rounding: each value is rounded once, from its float64 value.

    Args:
        y: values to round (any shape; converted to float64).

    Returns:
        A float64 array of ``y``'s shape holding E4M3FN values.

    Example:
        >>> fp8_round([0.3, 17.0, 500.0, -2**-11]).tolist()
        [0.3125, 16.0, 448.0, -0.0]
    """
    v = np.asarray(y, dtype=np.float64)
    a = np.minimum(np.abs(v), FP8_MAX)
    _, exp = np.frexp(a)  # a = m * 2**exp with 0.5 <= m < 1: the binade is [2**(exp-1), 2**exp)
    step = np.ldexp(1.0, np.maximum(exp - 1, _MIN_EXP) - _MANTISSA_BITS)
    return np.copysign(np.rint(a / step) * step, v)


@functools.cache
def fp8_levels() -> np.ndarray:
    """Return the 127 non-negative finite E4M3FN values, ascending (``0`` to ``448``; read-only).

    Example:
        >>> v = fp8_levels()
        >>> v.size, float(v[1]), float(v[8]), float(v[-1])
        (127, 0.001953125, 0.015625, 448.0)
    """
    sub = np.arange(8) * 2.0**-9  # 0 and the 7 subnormals
    mant = np.arange(8.0, 16.0)  # 1.mmm as 8..15 eighths
    normal = np.concatenate([mant * 2.0 ** (e - _MANTISSA_BITS) for e in range(_MIN_EXP, 9)])
    levels = np.concatenate([sub, normal[normal <= FP8_MAX]])
    levels.flags.writeable = False
    return levels


@functools.cache
def _thresholds() -> tuple[np.ndarray, np.ndarray]:
    """The midpoints ``m_k`` between consecutive levels ``v_{k-1} < v_k`` (``k = 1..126``) and
    whether a value exactly at ``m_k`` rounds up to ``v_k`` (ties to even)."""
    v = fp8_levels()
    mids = (v[:-1] + v[1:]) / 2.0  # exact: at most 5 significant bits
    up = fp8_round(mids) == v[1:]
    mids.flags.writeable = False
    up.flags.writeable = False
    return mids, up


def fp8_boundaries(scales: np.ndarray, width: float, n: int) -> np.ndarray:
    """Return, per scale and positive level ``v_k``, the first bin whose centre rounds to ``v_k``
    or above.

    Bin ``j`` has the centre ``c_j = (j + 1/2) * width`` (exact for a power-of-two ``width``); its
    level is ``fp8_round(c_j / s)`` with ``c_j / s`` computed in float64. That level does not
    decrease with ``j`` (IEEE division is monotone), so the bins of level ``>= v_k`` are those from
    a boundary ``b_k`` on. ``b_k`` is estimated from ``m_k * s / width`` (within two bins of the
    answer: the estimate's float error is far below one bin, and the rounding of ``c_j / s`` can
    move the switch by one bin) and settled by evaluating the rounding predicate itself on the
    :data:`_WINDOW` bins around it, so the boundaries are exactly those of the float64 codes.

    Args:
        scales: the scales ``s`` (1-D, positive, finite).
        width: the bin width (a power of two).
        n: the number of bins.

    Returns:
        An ``(len(scales), 126)`` intp array of boundaries in ``[0, n]`` (``n``: no bin reaches
        that level), non-decreasing along each row.
    """
    mids, up = _thresholds()
    s = np.asarray(scales, dtype=np.float64)[:, None]
    est = np.floor((s / width) * mids - 0.5)  # bins j > m_k * s / width - 1/2 reach level k
    start = np.clip(est - 2.0, -1.0, float(n))  # -1: every bin may reach the level
    below = np.zeros(est.shape, dtype=np.intp)
    for t in range(_WINDOW):
        j = start + t
        y = ((j + 0.5) * width) / s  # c_j / s, as the defining computation rounds it
        under = (y < mids) | ((y == mids) & ~up)
        below += under & (j >= 0) & (j < n)
    return (np.maximum(start, 0.0).astype(np.intp) + below).astype(np.intp)
