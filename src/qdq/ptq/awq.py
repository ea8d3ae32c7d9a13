"""Activation-aware INT4 weight-only calibration (issue 60): AWQ's clip search, on the layer output.

A Linear ``y = x W^T`` with INT4 weights (blocks along the input channels, ``scale = amax / 7``)
loses ``x (W - Q(W))^T``. How much a weight's error costs depends on the inputs it meets: an error
on an input channel that carries large activations costs more than one on a quiet channel. AWQ
(Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration";
``llm-awq/awq/quantize/auto_clip.py``) therefore chooses each block's clip by the error of the
layer *output*, on a sample of its inputs, instead of by the weight error (:mod:`qdq.calib.blocks`'s
``"mse"``).

The objective
-------------
With ``E = Q(W) - W`` (float64) and ``H = X^T X`` the Gram matrix of the inputs seen (every token,
accumulated by :class:`InputGram`; no sampling), the output error is ``sum_r e_r^T H e_r`` over the
weight's rows ``e_r``: the rows are independent, the blocks within a row are not
(``e_r^T H e_r = sum_g e_rg^T H_gg e_rg + 2 sum_{g<h} e_rg^T H_gh e_rh``). The search:

1. **AWQ's per-block clip** (its ``auto_clip_layer``): each block's amax is ``r · block_max`` for
   the ratio ``r`` of the grid (:data:`qdq.calib.blocks.CLIP_GRID`: 1.00 down to 0.50 by 0.01;
   AWQ's own grid is 1.00 down to 0.55 by 0.05) minimising that block's *own* output error
   ``e_rg^T H_gg e_rg``, the partial sum of the block's inputs, as AWQ measures it. Every candidate
   is quantized by :func:`~qdq.quant.blocks.block_fake_quant`, the exported arithmetic.
2. **Guard**: AWQ ignores the cross terms between blocks, so its choice can make a row's whole
   output error larger than no clipping. Per row, the result keeps whichever of (1) and the plain
   max has the smaller whole error ``e_r^T H e_r`` (ties: the max).
3. **Sweeps** (``sweeps``, default 1): coordinate descent on the whole error. For each block in
   turn, every ratio of the grid is tried with the row's other blocks as they are (the cross terms
   through ``H``); a block's amax changes only when its row's error strictly drops. So the result
   is never worse than the plain max on the objective (up to float64 rounding of the sums).

Per channel (``block_size=None``) a row is one block, so (1) is already exact.

AWQ's scale (``s = mean|x|^alpha`` per input channel, the weight's columns multiplied by ``s`` and
the input divided by it) is measured here (:func:`awq_scale_search`) but not applied to models:
``x / s`` must be folded into whatever produces ``x`` (a LayerNorm's weight and bias, a preceding
Linear's output rows) so that the exported graph has no new op, and that is a graph pass on the
float model before :func:`qdq.prepare` (as :mod:`qdq.ptq.equalize` is for Conv pairs), not a
calibration step. ``benchmarks/int4_weights.py`` measures what it would add to the clip search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from qdq._validate import normalize_axis
from qdq.calib.blocks import CLIP_GRID
from qdq.quant.blocks import BlockFormat, block_amax, block_fake_quant

__all__ = [
    "ALPHA_GRID",
    "AwqScale",
    "InputGram",
    "awq_clip_amax",
    "awq_scale_search",
    "output_error",
    "output_sqnr_db",
]

#: AWQ's scale exponents: 0.00, 0.05, ..., 0.95 (``n_grid=20``); 0 is no scaling
ALPHA_GRID = tuple(i / 20 for i in range(20))


class InputGram:
    """The Gram matrix ``H = X^T X`` (float64) and ``mean |x|`` per channel of a layer's inputs.

    Args:
        features: the input channels (the last axis of every tensor added).

    Example:
        >>> g = InputGram(3)
        >>> g.add(torch.ones(2, 5, 3))
        >>> g.tokens, g.gram[0].tolist(), g.mean_abs.tolist()
        (10, [10.0, 10.0, 10.0], [1.0, 1.0, 1.0])
    """

    def __init__(self, features: int) -> None:
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"features must be an int >= 1, got {features!r}")
        self.features = features
        self.tokens = 0
        self._gram: torch.Tensor | None = None
        self._abs: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        """Accumulate the rows of ``x`` (any leading shape, ``features`` last)."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.features:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; expected {self.features} features last"
            )
        rows = x.detach().reshape(-1, self.features).double()
        if self._gram is None or self._abs is None:
            self._gram = rows.T @ rows
            self._abs = rows.abs().sum(0)
        else:
            self._gram += rows.T @ rows
            self._abs += rows.abs().sum(0)
        self.tokens += rows.shape[0]

    @property
    def gram(self) -> torch.Tensor:
        """``X^T X``, ``[features, features]`` float64."""
        if self._gram is None:
            raise ValueError("InputGram has seen no input")
        return self._gram

    @property
    def mean_abs(self) -> torch.Tensor:
        """``mean |x|`` per channel (AWQ's activation statistic), float64."""
        if self._abs is None:
            raise ValueError("InputGram has seen no input")
        return self._abs / self.tokens


def output_error(w: torch.Tensor, w_q: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``||X W^T - X W_q^T||^2`` per output row, ``e_r^T H e_r`` (float64, ``[out]``).

    Example:
        >>> output_error(torch.ones(2, 2), torch.zeros(2, 2), torch.eye(2)).tolist()
        [2.0, 2.0]
    """
    e = w_q.detach().to(torch.float32).double() - w.detach().to(torch.float32).double()
    return ((e @ gram.to(e)) * e).sum(1)


def output_sqnr_db(w: torch.Tensor, w_q: torch.Tensor, gram: torch.Tensor) -> float:
    """The output SQNR ``10 log10(||X W^T||^2 / ||X (W - W_q)^T||^2)`` in dB (inf: no error).

    Example:
        >>> round(output_sqnr_db(torch.ones(1, 2), torch.full((1, 2), 0.5), torch.eye(2)), 3)
        6.021
    """
    signal = float(output_error(torch.zeros_like(w), w, gram).sum())
    noise = float(output_error(w, w_q, gram).sum())
    return math.inf if noise <= 0.0 else 10.0 * math.log10(signal / noise)


def awq_clip_amax(
    w: torch.Tensor,
    gram: torch.Tensor,
    fmt: BlockFormat,
    axis: int = -1,
    *,
    grid: Sequence[float] = CLIP_GRID,
    sweeps: int = 1,
) -> torch.Tensor:
    """The INT4 amax of a Linear weight minimising the output error on inputs with Gram ``gram``.

    Args:
        w: the float weight ``[out, in]``.
        gram: ``X^T X`` of the layer's inputs, ``[in, in]`` (:class:`InputGram`).
        fmt: an INT4 :class:`~qdq.quant.blocks.BlockFormat` (blocks along ``in``, or per channel).
        axis: the blocked axis (``-1``/``1``); per channel: the channel axis ``0``.
        grid: clip ratios in (0, 1] including 1.0 (default 1.00 ... 0.50 by 0.01).
        sweeps: coordinate-descent passes over the blocks on the whole row error (0: AWQ's
            per-block choice and the guard only; see the module docstring).

    Returns:
        float32 amax shaped as :func:`~qdq.quant.blocks.block_amax` returns it.

    Raises:
        ValueError: not INT4, ``w`` not 2-D, ``axis`` not the input axis (blocks) or the output
            axis (per channel), ``gram`` misshapen, a bad ``grid`` or ``sweeps``, NaN/inf.

    Example:
        >>> from qdq.quant.blocks import INT4
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> w, x = torch.randn(8, 64), torch.randn(256, 64)
        >>> fmt = INT4.with_block_size(32)
        >>> amax = awq_clip_amax(w, x.T.double() @ x.double(), fmt)
        >>> amax.shape
        torch.Size([8, 2])
        >>> h = x.T.double() @ x.double()
        >>> bool(output_error(w, block_fake_quant(w, fmt, amax), h).sum()
        ...      <= output_error(w, block_fake_quant(w, fmt), h).sum())
        True
    """
    ratios = _ratios(grid)
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {sweeps!r}")
    ax = _check(w, gram, fmt, axis)
    del ax
    h = gram.detach().double()
    w32 = w.detach().to(torch.float32)
    bamax = block_amax(w32, fmt, axis)
    if not bool(torch.isfinite(bamax).all()) or not bool(torch.isfinite(h).all()):
        raise ValueError("w or gram holds NaN or inf")

    def err(amax: torch.Tensor) -> torch.Tensor:
        return block_fake_quant(w32, fmt, amax, axis).double() - w32.double()

    if fmt.block_size is None:  # one block per row: the whole row error is the block's own
        best, best_f = bamax.clone(), _row_error(err(bamax), h)
        for r in ratios[1:]:
            cand = bamax * r
            f = _row_error(err(cand), h)
            best, best_f = torch.where(f < best_f, cand, best), torch.minimum(f, best_f)
        return best
    bs = fmt.block_size
    rows, k = w32.shape
    nb = k // bs
    diag = torch.stack([h[g * bs : (g + 1) * bs, g * bs : (g + 1) * bs] for g in range(nb)])

    def own(e: torch.Tensor) -> torch.Tensor:  # each block's own error e_g^T H_gg e_g: [rows, nb]
        eb = e.view(rows, nb, bs)
        return torch.einsum("rgb,gbc,rgc->rg", eb, diag, eb)

    e_max = err(bamax)
    best, best_f = bamax.clone(), own(e_max)
    for r in ratios[1:]:
        cand = bamax * r
        f = own(err(cand))
        best, best_f = torch.where(f < best_f, cand, best), torch.minimum(f, best_f)
    # the guard: per row, AWQ's choice only where it lowers the whole row error
    e_awq = err(best)
    keep = _row_error(e_awq, h) < _row_error(e_max, h)
    amax = torch.where(keep[:, None], best, bamax)
    e = torch.where(keep[:, None], e_awq, e_max)
    for _ in range(sweeps):
        for g in range(nb):
            _sweep_block(w32, fmt, h, diag[g], bamax, amax, e, g, ratios)
    return amax


def _sweep_block(
    w: torch.Tensor,
    fmt: BlockFormat,
    h: torch.Tensor,
    h_gg: torch.Tensor,
    bamax: torch.Tensor,
    amax: torch.Tensor,
    e: torch.Tensor,
    g: int,
    ratios: tuple[float, ...],
) -> None:
    """Block ``g`` of every row to the ratio minimising the row's whole error, the other blocks
    held (``amax`` and ``e`` updated in place). The row error as a function of the block's
    error ``v`` is ``v^T H_gg v + 2 v^T b + const`` with ``b = H_{g,rest} e_rest``."""
    bs = h_gg.shape[0]
    cols = slice(g * bs, (g + 1) * bs)
    e_g = e[:, cols]
    b = e @ h[:, cols] - e_g @ h_gg

    def f(v: torch.Tensor) -> torch.Tensor:
        return ((v @ h_gg) * v).sum(1) + 2.0 * (v * b).sum(1)

    wg = w[:, cols]
    best_a, best_v = amax[:, g : g + 1].clone(), e_g.clone()
    best_f = f(e_g)
    for r in ratios:
        cand = bamax[:, g : g + 1] * r
        v = block_fake_quant(wg, fmt, cand, -1).double() - wg.double()
        fv = f(v)
        better = fv < best_f
        best_a = torch.where(better[:, None], cand, best_a)
        best_v = torch.where(better[:, None], v, best_v)
        best_f = torch.where(better, fv, best_f)
    amax[:, g : g + 1] = best_a
    e[:, cols] = best_v


@dataclass(frozen=True)
class AwqScale:
    """What :func:`awq_scale_search` found.

    Attributes:
        alpha: the exponent chosen (0: no scaling).
        scale: ``s`` per input channel (float32, ``[in]``): the weight's columns are multiplied
            by it and the input divided by it.
        amax: the INT4 amax of the scaled weight ``W · s`` (float32).
        error: the output error ``sum_r e_r^T H e_r`` of ``Q(W · s) / s`` (in-sample).
    """

    alpha: float
    scale: torch.Tensor
    amax: torch.Tensor
    error: float

    def dequantized(self, w: torch.Tensor, fmt: BlockFormat, axis: int = -1) -> torch.Tensor:
        """The effective weight ``Q(W · s) / s`` (what ``x / s`` meets in the folded layer)."""
        s = self.scale.to(w.device)
        return block_fake_quant(w.detach().float() * s, fmt, self.amax, axis) / s


def awq_scale_search(
    w: torch.Tensor,
    stats: InputGram,
    fmt: BlockFormat,
    axis: int = -1,
    *,
    alphas: Sequence[float] = ALPHA_GRID,
    grid: Sequence[float] = CLIP_GRID,
    sweeps: int = 1,
) -> AwqScale:
    """AWQ's per-input-channel scale ``s = mean|x|^alpha`` (normalised to ``sqrt(max·min) = 1``
    as AWQ does), ``alpha`` searched on ``alphas`` by the output error with the plain max amax,
    then the clip search (:func:`awq_clip_amax`) on the scaled weight and the scaled Gram
    ``H / (s s^T)``. ``alpha = 0`` (``s = 1``) is always tried first and kept on ties.

    Measurement only: applying ``s`` to a model needs ``x / s`` folded upstream (module docstring).

    Example:
        >>> from qdq.quant.blocks import INT4
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> stats = InputGram(64)
        >>> stats.add(torch.randn(512, 64) * torch.linspace(0.1, 4.0, 64))
        >>> found = awq_scale_search(torch.randn(16, 64), stats, INT4.with_block_size(32))
        >>> found.scale.shape, found.amax.shape
        (torch.Size([64]), torch.Size([16, 2]))
    """
    if not isinstance(stats, InputGram):
        raise TypeError(f"stats must be an InputGram, got {type(stats).__name__}")
    steps = [float(a) for a in alphas]
    if not steps or any(not 0.0 <= a <= 1.0 for a in steps) or 0.0 not in steps:
        raise ValueError(f"alphas must lie in [0, 1] and include 0, got {list(alphas)!r}")
    h = stats.gram
    _check(w, h, fmt, axis)
    w32 = w.detach().to(torch.float32)
    x_abs = stats.mean_abs.clamp(min=1e-4)
    best: tuple[float, torch.Tensor, float] | None = None
    for a in (0.0, *(a for a in steps if a != 0.0)):
        s = x_abs.pow(a)
        s = (s / (s.max() * s.min()).sqrt()).to(torch.float32)
        eff = block_fake_quant(w32 * s, fmt, None, axis) / s
        f = float(output_error(w32, eff, h).sum())
        if best is None or f < best[2]:
            best = (a, s, f)
    assert best is not None
    alpha, s, _ = best
    s64 = s.double()
    amax = awq_clip_amax(w32 * s, h / (s64[:, None] * s64[None, :]), fmt, axis, grid=grid,
                         sweeps=sweeps)  # fmt: skip
    eff = block_fake_quant(w32 * s, fmt, amax, axis) / s
    return AwqScale(alpha, s, amax, float(output_error(w32, eff, h).sum()))


def _row_error(e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return ((e @ h) * e).sum(1)


def _ratios(grid: Sequence[float]) -> tuple[float, ...]:
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise TypeError(f"grid must be a sequence of ratios, got {type(grid).__name__}")
    ratios = [float(r) for r in grid]
    if not ratios or any(not 0.0 < r <= 1.0 for r in ratios) or 1.0 not in ratios:
        raise ValueError(f"grid ratios must lie in (0, 1] and include 1.0, got {list(grid)!r}")
    return (1.0, *(r for r in ratios if r != 1.0))


def _check(w: torch.Tensor, gram: torch.Tensor, fmt: BlockFormat, axis: int) -> int:
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"fmt must be a BlockFormat, got {type(fmt).__name__}")
    if fmt.element != "int4":
        raise ValueError(f"the AWQ search is for INT4 weights, got format {fmt.name!r}")
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"w must be a Linear weight [out, in], got shape {tuple(w.shape)}")
    ax = normalize_axis(axis, 2)
    assert ax is not None
    want = 0 if fmt.block_size is None else 1
    if ax != want:
        what = "the channel axis 0" if want == 0 else "the input axis 1 (-1)"
        raise ValueError(f"INT4 {'per channel' if want == 0 else 'blocks'}: axis must be {what}, "
                         f"got {axis}")  # fmt: skip
    if not isinstance(gram, torch.Tensor) or gram.shape != (w.shape[1], w.shape[1]):
        shape = tuple(gram.shape) if isinstance(gram, torch.Tensor) else type(gram).__name__
        raise ValueError(f"gram must be [in, in] = {(w.shape[1],) * 2}, got {shape}")
    return ax
