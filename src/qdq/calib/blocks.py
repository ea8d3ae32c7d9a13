"""Weight amax for the block formats (issue 60): ``max`` and ``mse`` on the block grid.

What a weight's amax is depends on the format (:mod:`qdq.quant.blocks`):

* **INT4** (``scale = amax / 7`` per block, or per channel with ``block_size=None``): one amax per
  block, shaped as :func:`qdq.quant.blocks.block_amax` returns it. ``"max"`` is the blocks' own
  abs max (no value clips). ``"mse"`` searches, for every block independently, a clip ratio ``r``
  on :data:`CLIP_GRID` (``1.00, 0.99, ..., 0.50``: 51 ratios, 1.0 first) and keeps
  ``r · block_max`` with the smallest squared error of the block, computed by
  :func:`~qdq.quant.blocks.block_fake_quant` itself (the exported arithmetic, round half to even,
  saturation at ``[-8, 7]``): the search cannot pick a ratio whose error it did not measure. A
  ratio replaces the current best only when its error is strictly smaller, so ties keep the
  larger amax and ``"mse"`` is never worse than ``"max"`` on any block. Clipping under a half of
  the block max is never searched: a ratio that low trades the largest weights of the block for
  the resolution of the rest, and AWQ's clip search (``max_shrink=0.5``) stops there as well.
* **NVFP4** (E4M3 block scales under a float32 per-tensor scale ``gs = amax / (6·448)``): the block
  scales follow from the data by the format's formula; only the per-tensor amax is free. ``"max"``
  is the tensor's abs max (what ModelOpt exports); ``"mse"`` searches the per-tensor amax on the
  same grid of ratios, by the whole tensor's squared error. A smaller per-tensor amax saturates the
  block scales of the largest blocks (``e4m3(min(block_amax / (6·gs), 448))``) and moves every other
  block scale on the E4M3 grid; what that buys is measured in ``benchmarks/int4_weights.py``.
* **MXFP8** (E8M0 power-of-two scales from each block's own max): nothing to search; either
  method returns the tensor's abs max (0-d), which the format does not use.

Errors are summed in float64 (each term is the float32 difference of the fake-quantized and the
original value), so the comparison between ratios does not depend on the summation order.
"""

from __future__ import annotations

import torch

from qdq._validate import normalize_axis
from qdq.quant.blocks import BlockFormat, block_amax, block_fake_quant

__all__ = ["BLOCK_METHODS", "CLIP_GRID", "block_sq_error", "block_weight_amax", "clip_grid"]

#: the methods of :func:`block_weight_amax`
BLOCK_METHODS = ("max", "mse")


def clip_grid(lowest: float = 0.5, step: float = 0.01) -> tuple[float, ...]:
    """Clip ratios from 1.0 down to ``lowest`` by ``step`` (1.0 first; ``lowest`` included when
    the steps reach it), each rounded to 6 decimals so that the grid is the same everywhere.

    Example:
        >>> clip_grid(0.8, 0.1)
        (1.0, 0.9, 0.8)
    """
    if not 0.0 < lowest <= 1.0:
        raise ValueError(f"lowest must be in (0, 1], got {lowest!r}")
    if not 0.0 < step <= 1.0:
        raise ValueError(f"step must be in (0, 1], got {step!r}")
    n = int((1.0 - lowest) / step + 1e-9)
    return tuple(round(1.0 - i * step, 6) for i in range(n + 1))


#: the default ratios of ``method="mse"``: 1.00, 0.99, ..., 0.50
CLIP_GRID = clip_grid()


def block_sq_error(
    w: torch.Tensor, q: torch.Tensor, fmt: BlockFormat, axis: int = -1
) -> torch.Tensor:
    """The squared error ``sum((q - w)**2)`` of each block (float64), in the layout of
    :func:`~qdq.quant.blocks.block_amax` (per channel for INT4 with ``block_size=None``).

    Example:
        >>> from qdq.quant.blocks import INT4
        >>> w = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
        >>> block_sq_error(w, w + 0.5, INT4.with_block_size(2)).tolist()
        [[0.5, 0.5]]
    """
    if q.shape != w.shape:
        raise ValueError(f"q has shape {tuple(q.shape)}, w {tuple(w.shape)}")
    ax = normalize_axis(axis, w.dim())
    assert ax is not None
    d = (q.detach().to(torch.float32) - w.detach().to(torch.float32)).double().square()
    if fmt.block_size is None:
        dims = [i for i in range(w.dim()) if i != ax]
        return d.sum(dim=dims) if dims else d
    return d.unflatten(ax, (-1, fmt.block_size)).sum(dim=ax + 1)


def block_weight_amax(
    w: torch.Tensor,
    fmt: BlockFormat,
    axis: int = -1,
    method: str = "max",
    *,
    grid: tuple[float, ...] = CLIP_GRID,
) -> torch.Tensor:
    """The amax of a weight in the block format ``fmt``, by ``method``.

    Args:
        w: the float weight (``[out, in]`` for a Linear).
        fmt: :data:`~qdq.quant.blocks.INT4` (any block size, or per channel),
            :data:`~qdq.quant.blocks.NVFP4` or :data:`~qdq.quant.blocks.MXFP8`.
        axis: the blocked axis (the reduction axis, ``-1`` for a Linear weight); INT4 per
            channel: the channel axis (``0``).
        method: ``"max"`` (no clipping) or ``"mse"`` (the clip ratio of ``grid`` with the
            smallest squared error, per block for INT4, per tensor for NVFP4; see the module
            docstring).
        grid: the clip ratios tried by ``"mse"``, each in (0, 1]; 1.0 must be one of them.

    Returns:
        float32: INT4: per block, shaped as :func:`~qdq.quant.blocks.block_amax` (per channel:
        ``[w.shape[axis]]``); NVFP4 and MXFP8: 0-d.

    Raises:
        ValueError: an unknown ``method``, a bad ``grid``, NaN/inf in ``w``, a blocked axis that
            is not a multiple of the block size, or ``axis`` out of range.
        TypeError: ``w`` is not a floating-point tensor or ``fmt`` not a ``BlockFormat``.

    Example:
        >>> from qdq.quant.blocks import INT4
        >>> w = torch.tensor([[0.1, 0.2, -0.3, 0.15, 0.05, -0.1, 0.25, 3.0]])
        >>> block_weight_amax(w, INT4.with_block_size(8)).tolist()
        [[3.0]]
        >>> round(float(block_weight_amax(w, INT4.with_block_size(8), method="mse")), 4)
        2.97
    """
    if method not in BLOCK_METHODS:
        raise ValueError(f"method must be one of {BLOCK_METHODS}, got {method!r}")
    ratios = _check_grid(grid)
    bamax = block_amax(w, fmt, axis)  # checks w, fmt, axis and the block size
    if not bool(torch.isfinite(bamax).all()):
        raise ValueError("w holds NaN or inf: no amax to calibrate")
    if fmt.element == "e4m3":  # MXFP8: E8M0 scales from each block's own max
        return bamax.amax()
    if fmt.element == "e2m1":  # NVFP4: the per-tensor amax only
        top = bamax.amax()
        if method == "max":
            return top
        best_top, least = top, _total_error(w, fmt, top, axis)
        for r in ratios[1:]:
            cand = top * r
            total = _total_error(w, fmt, cand, axis)
            if total < least:
                best_top, least = cand, total
        return best_top
    if method == "max":
        return bamax
    best = bamax.clone()
    best_err = block_sq_error(w, block_fake_quant(w.detach(), fmt, bamax, axis), fmt, axis)
    for r in ratios[1:]:
        cand = bamax * r
        err = block_sq_error(w, block_fake_quant(w.detach(), fmt, cand, axis), fmt, axis)
        better = err < best_err
        best = torch.where(better, cand, best)
        best_err = torch.where(better, err, best_err)
    return best


def _total_error(w: torch.Tensor, fmt: BlockFormat, amax: torch.Tensor, axis: int) -> float:
    return float(block_sq_error(w, block_fake_quant(w.detach(), fmt, amax, axis), fmt, axis).sum())


def _check_grid(grid: tuple[float, ...]) -> tuple[float, ...]:
    """``grid`` with 1.0 first (the ``max`` candidate every search starts from)."""
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise TypeError(f"grid must be a sequence of ratios, got {type(grid).__name__}")
    ratios = [float(r) for r in grid]
    if not ratios or any(not 0.0 < r <= 1.0 for r in ratios):
        raise ValueError(f"grid ratios must be in (0, 1], got {list(grid)!r}")
    if 1.0 not in ratios:
        raise ValueError("grid must include 1.0 (the plain max), so the search is never worse")
    return (1.0, *(r for r in ratios if r != 1.0))
