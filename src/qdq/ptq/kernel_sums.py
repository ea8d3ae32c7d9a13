"""Kernel-sum rounding: INT8 weight codes that keep every convolution kernel's sum.

A convolution kernel of ``K > 1`` taps answers a locally constant input with the *sum* of its
taps. Nearest rounding errs by up to half a step on every tap, and those errors add up in the sum.
For a kernel whose taps nearly cancel (an edge or high-pass filter, common in depthwise and stem
convolutions) the rounded kernel then leaks a DC response many times its float one: on
EfficientNet-Lite0, ``_blocks.0._depthwise_conv`` alone (per-channel INT8 weights at 46 dB SQNR)
costs 15 % top-1 agreement this way, and the BatchNorm after it amplifies the leak.

Per output channel and input channel (per kernel), with the quantizer's exact scale ``s`` (never
changed) and ``y = W / s``: start from nearest rounding, then move the ``d`` codes whose rounding
residual ``y - rint(y)`` points most the way of the missing sum by one step, where ``d`` is the
nearest integer to the kernel's total residual. Every code stays the floor or the ceiling of ``y``
(as with AdaRound), the kernel's sum of codes is then within half a step of ``sum(y)``, and among
all such roundings this one adds the least squared weight error (moving a code with residual ``r``
costs ``1 - 2|r|``). Saturated taps (``|y| > qmax``, from a clipping weight amax) are left alone.

No data is needed: one batch only lets the call-site tap find each layer's weight. Linear layers
and ``1x1`` convolutions have no kernel to sum and keep nearest rounding. The codes are stored like
AdaRound's (:meth:`~qdq.quant.Quantizer.set_rounding`), so :func:`qdq.export_onnx` writes them and
the manifest records ``"method": "kernel-sum"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq.debug.stats import ErrorStats, finite_fields
from qdq.ptq import _layers
from qdq.ptq.report import StepReport
from qdq.quant import QuantMode, quant_range, quantizer_mode, scale_from_amax

__all__ = ["KernelSumRow", "KernelSums", "kernel_sum_codes", "kernel_sum_rounding"]

SETTINGS = {"method": "kernel-sum", "unit": "kernel (output channel x input channel)"}


@dataclass(frozen=True)
class KernelSumRow:
    """Kernel-sum rounding of one layer.

    Attributes:
        name: the weight quantizer's name (``"features.0:weight"``).
        quantizer: its module path.
        kernels: kernels (output x input channels) of ``taps`` weights each.
        taps: weights per kernel.
        changed: fraction of codes that differ from nearest rounding (each by one).
        max_sum_error_nearest: the largest ``|sum(codes) - sum(W/s)|`` over the kernels with
            nearest rounding, in quantization steps.
        max_sum_error: the same with kernel-sum rounding (at most 0.5 unless taps saturate).
        weight_sqnr_nearest / weight_sqnr: the weight's SQNR (dB) with each rounding.
    """

    name: str
    quantizer: str
    kernels: int
    taps: int
    changed: float
    max_sum_error_nearest: float
    max_sum_error: float
    weight_sqnr_nearest: float
    weight_sqnr: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a non-finite number, the SQNR of an exact rounding, is ``null``)."""
        return finite_fields(self)


@dataclass(frozen=True)
class KernelSums(StepReport):
    """What :func:`kernel_sum_rounding` did: one row per convolution, in forward order."""

    rows: tuple[KernelSumRow, ...]
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "kernel_sum"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("layer", lambda r: r.name),
        ("taps", lambda r: str(r.taps)),
        ("changed", lambda r: f"{100 * r.changed:.2f}%"),
        ("sum err", lambda r: f"{r.max_sum_error_nearest:.2f} -> {r.max_sum_error:.2f}"),
        ("weight dB", lambda r: f"{r.weight_sqnr_nearest:.1f} -> {r.weight_sqnr:.1f}"),
    )

    def summary(self) -> str:
        """One line: layers rounded, codes changed and the worst kernel-sum error before/after."""
        changed = [r for r in self.rows if r.changed > 0]
        if not changed:
            return f"kernel-sum rounding: no code changed ({len(self.rows)} convolutions)"
        weights = sum(r.kernels * r.taps for r in self.rows)
        moved = sum(r.changed * r.kernels * r.taps for r in self.rows)
        before = max(r.max_sum_error_nearest for r in self.rows)
        after = max(r.max_sum_error for r in self.rows)
        return (
            f"kernel-sum rounding on {len(changed)}/{len(self.rows)} convolutions: "
            f"{100 * moved / weights:.1f}% of codes moved by one; worst kernel-sum error "
            f"{before:.2f} -> {after:.2f} steps"
        )

    def fields(self) -> dict[str, Any]:
        """The method and its unit."""
        return dict(SETTINGS)


def kernel_sum_codes(y: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """Kernel-sum codes of ``y = W / s`` shaped ``(kernels, taps)``: nearest rounding, then the
    fewest, cheapest one-step moves that bring each row's sum of codes within half a step of
    ``y``'s row sum (see the module docstring). Returns float codes of ``y``'s shape.

    Example:
        >>> y = torch.tensor([[0.4, 0.4, 0.4, -1.3]])  # sum -0.1; nearest codes sum to -1
        >>> kernel_sum_codes(y, -127, 127)
        tensor([[ 1.,  0.,  0., -1.]])
    """
    nearest = torch.clamp(torch.round(y), qmin, qmax)
    free = y.abs() <= qmax  # saturated taps are neither counted nor moved
    resid = torch.where(free, y - nearest, torch.zeros_like(y))
    need = torch.round(resid.sum(dim=1, keepdim=True))  # signed number of one-step moves
    # moving a code towards the sum: the residuals of that sign, largest first
    toward = resid * torch.sign(need)
    order = torch.argsort(toward, dim=1, descending=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(y.shape[1], device=y.device).expand_as(order))
    move = (rank < need.abs()) & (toward > 0) & free
    return nearest + torch.sign(need) * move.to(y.dtype)


def kernel_sum_rounding(prepared: nn.Module, data: Iterable[Any]) -> KernelSums:
    """Round every convolution weight of a calibrated model to keep its kernels' sums, in place.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`.
        data: batches as :func:`qdq.calibrate` takes them; only the first one runs, to find each
            layer's weight as the model passes it.

    Returns:
        :class:`KernelSums`, one row per convolution with a kernel of more than one tap.

    Raises:
        ValueError: not a prepared call-site model, a quantizer without amax, or no batch.
    """
    _layers.check_ready(prepared, "kernel-sum rounding")
    first = next(iter(data), None)
    if first is None:
        raise ValueError("kernel-sum rounding saw no batches: the data is empty")
    layers, notes = _layers.find_layers(prepared)
    with eval_no_grad(prepared), quantizer_mode(prepared, QuantMode.BYPASS):
        _layers.survey(prepared, first, layers)  # an FP32 pass: only the weights are wanted
    rows = []
    for layer in sorted((x for x in layers if x.order is not None), key=lambda x: x.order or 0):
        row = _round(layer)
        if row is not None:
            rows.append(row)
    unreached = [x.name for x in layers if x.order is None]
    if unreached:
        notes.append(f"{len(unreached)} layer(s) were not called on this data: {unreached[:5]}")
    return KernelSums(tuple(rows), tuple(notes))


def _round(layer: _layers.Layer) -> KernelSumRow | None:
    weight = layer.weight
    if weight is None or layer.family == "linear" or weight.dim() < 3:
        return None
    taps = weight[0, 0].numel()
    if taps < 2:
        return None
    q = layer.quantizer
    if q.spec.format != "int8":  # FP8 codes: nearest rounding only (kernel sums pick integers)
        return None
    w = weight.detach().to(torch.float32)
    scale = scale_from_amax(q.amax.detach(), q.spec.num_bits).to(w.device)
    s = scale.reshape(-1, *([1] * (w.dim() - 1))) if scale.dim() else scale
    qmin, qmax = quant_range(q.spec.num_bits, q.spec.narrow_range)
    y = w / s  # exactly as the quantizer divides
    kernels = y.reshape(-1, taps)
    nearest = torch.clamp(torch.round(kernels), qmin, qmax)
    codes = kernel_sum_codes(kernels, qmin, qmax)
    changed = float((codes != nearest).float().mean())
    if changed > 0:
        q.set_rounding(codes.reshape(w.shape), weight, dict(SETTINGS))
    return KernelSumRow(
        name=layer.name,
        quantizer=layer.path,
        kernels=int(kernels.shape[0]),
        taps=int(taps),
        changed=changed,
        max_sum_error_nearest=_max_sum_error(nearest, kernels, qmax),
        max_sum_error=_max_sum_error(codes, kernels, qmax),
        weight_sqnr_nearest=ErrorStats.between(w, nearest.reshape(w.shape) * s).sqnr_db,
        weight_sqnr=ErrorStats.between(w, codes.reshape(w.shape) * s).sqnr_db,
    )


def _max_sum_error(codes: torch.Tensor, y: torch.Tensor, qmax: int) -> float:
    free = y.abs() <= qmax
    err = torch.where(free, codes - y, torch.zeros_like(y)).sum(dim=1).abs()
    return float(err.max()) if err.numel() else 0.0
