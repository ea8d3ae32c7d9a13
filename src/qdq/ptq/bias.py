"""Bias correction: remove the mean output shift that weight quantization adds to each channel.

Quantizing a weight changes a layer's output by ``conv(x, W_q) − conv(x, W)``. Its mean over the
data is, per output channel, a constant shift (large for depthwise convolutions and other layers
with few weights per channel, whose rounding errors do not average out). Bias correction (Nagel et
al. 2019, "Data-Free Quantization Through Weight Equalization and Bias Correction", empirical
variant) adds the opposite of that mean to the layer's bias::

    delta_c = −E[conv(x, W_q) − conv(x, W)]_c      (over samples and spatial positions)

``x`` is the layer's own input **in the INT8 model** — everything upstream quantized, the layer's
input Q/DQ applied — i.e. what the deployed layer reads. So ``delta`` corrects the shift the
weight quantization makes on deployment inputs; it does not try to undo errors made upstream.
All layers are measured in one pass over ``num_batches`` batches (a layer's input is that of the
INT8 model before this pass's corrections; their effect on a downstream layer's input is of second
order). ``W_q`` is the weight as the model quantizes it now, so run :func:`correct_bias` after
:func:`qdq.ptq.adaround.adaround` (AdaRound drops an earlier correction, with a warning).

``delta`` is kept on the weight quantizer (``bias_delta``, see :mod:`qdq.quant.learned`) and added
to the bias only in ``QUANTIZE`` mode and at export, where both exporters fold ``bias + delta`` into
the Conv/Gemm bias initializer. A layer without a bias gets ``delta`` as its bias. The float bias is
never changed: with every quantizer bypassed the model is the FP32 model.

Layers: Conv1d/2d/3d (grouped and depthwise included) and Linear, per call site or functional
(:mod:`qdq.ptq._layers`); a module called several times gets one correction from all its calls.

Example:
    >>> import torch, qdq
    >>> from qdq.ptq.bias import correct_bias
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(),
    ...                           torch.nn.Conv2d(16, 16, 3, groups=16))
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(8, 3, 12, 12) for _ in range(4)]
    >>> _ = qdq.calibrate(m, data, show_progress=False)
    >>> report = correct_bias(m, data)
    >>> [r.name for r in report.rows]
    ['0:weight', '2:weight']
    >>> all(r.sqnr_after_db >= r.sqnr_before_db for r in report.rows)
    True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import quantizers_of
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import Call, Site
from qdq.ptq import _layers
from qdq.ptq._layers import Layer

__all__ = ["BiasCorrection", "BiasRow", "clear_bias_correction", "correct_bias"]

METHOD = "empirical"


@dataclass(frozen=True)
class BiasRow:
    """The correction of one layer.

    Attributes:
        name: the weight quantizer's name (``"layer1.conv1:weight"``).
        quantizer: its module path.
        channels: output channels corrected.
        mean_abs_delta: mean ``|delta|`` over channels.
        max_abs_delta: largest ``|delta|``.
        sqnr_before_db: the layer's output SQNR (``conv(x, W) + b`` vs the INT8 layer on the same
            ``x``) before this correction, over the data used.
        sqnr_after_db: the same with the correction (in-sample).
        added_bias: the layer had no bias; ``delta`` is its bias in the INT8 model.
        calls: calls of the layer per forward.
    """

    name: str
    quantizer: str
    channels: int
    mean_abs_delta: float
    max_abs_delta: float
    sqnr_before_db: float
    sqnr_after_db: float
    added_bias: bool
    calls: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a non-finite number is ``null``)."""
        return {k: _finite(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class BiasCorrection:
    """What :func:`correct_bias` did: one row per corrected layer, in forward order."""

    rows: tuple[BiasRow, ...]
    batches: int
    samples: int
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: layers corrected and the median SQNR gain."""
        if not self.rows:
            return "bias correction: no layer corrected"
        gains = sorted(r.sqnr_after_db - r.sqnr_before_db for r in self.rows)
        median = gains[len(gains) // 2]
        return (
            f"bias correction ({METHOD}) on {len(self.rows)} layers from {self.samples} samples: "
            f"median layer SQNR gain {median:+.2f} dB"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {
            "method": METHOD,
            "batches": self.batches,
            "samples": self.samples,
            "rows": [r.to_dict() for r in self.rows],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """Indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """A table of every layer."""
        width = max([len(r.name) for r in self.rows] + [5])
        lines = [
            self.summary(),
            f"{'layer':<{width}}  {'mean|d|':>9}  {'max|d|':>9}  {'SQNR dB':>8}  {'after':>8}",
        ]
        for r in self.rows:
            flag = "  (bias added)" if r.added_bias else ""
            lines.append(
                f"{r.name:<{width}}  {r.mean_abs_delta:>9.3g}  {r.max_abs_delta:>9.3g}  "
                f"{r.sqnr_before_db:>8.2f}  {r.sqnr_after_db:>8.2f}{flag}"
            )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def correct_bias(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    num_batches: int = 4,
    show_progress: bool = False,
) -> BiasCorrection:
    """Correct the bias of every weighted layer of a calibrated model, in place.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`.
        data: batches as :func:`qdq.calibrate` takes them.
        num_batches: batches to average over.
        show_progress: a progress bar.

    Returns:
        :class:`BiasCorrection`, one row per corrected layer (forward order).

    Raises:
        ValueError: not a prepared call-site model, a quantizer without amax, a bad
            ``num_batches``, or no batch in ``data``.
        qdq.quant.StaleStateError: learned state of a layer no longer fits its weight.
    """
    _layers.check_ready(prepared, "correct_bias")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    layers, notes = _layers.find_layers(prepared)
    index = _layers.index_of(layers)
    sums: dict[str, _ChannelSums] = {}
    order: list[str] = []
    samples = 0

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        out = _layers.invoke(func, applied)
        hit = _layers.lookup(index, key)
        if hit is not None and isinstance(out, torch.Tensor):
            layer, ref = hit
            if layer.path not in sums:
                order.append(layer.path)
            _measure(sums.setdefault(layer.path, _ChannelSums()), layer, ref, func, raw, applied)
        return out

    with eval_no_grad(prepared), _layers.tapped(prepared, tap):
        batches = []
        for batch in progress(
            data, total=num_batches, desc="bias correction", enabled=show_progress
        ):
            batches.append(batch)
            samples += _layers.batch_size(batch)
            _layers.run_batches(prepared, [batch])
            if len(batches) >= num_batches:
                break
    if not batches:
        raise ValueError("correct_bias saw no batches: the data is empty")
    by_path = {layer.path: layer for layer in layers}
    settings = {"method": METHOD, "num_batches": len(batches), "samples": samples,
                "input": "int8"}  # fmt: skip
    rows = []
    for path in order:
        layer, s = by_path[path], sums[path]
        rows.append(_apply(layer, s, settings, max(1, s.calls // len(batches))))
    unreached = [layer.name for layer in layers if layer.path not in sums]
    if unreached:
        notes.append(f"{len(unreached)} layer(s) were not called on this data: {unreached[:5]}")
    return BiasCorrection(tuple(rows), len(batches), samples, tuple(notes))


def clear_bias_correction(prepared: nn.Module) -> list[str]:
    """Remove every bias correction from ``prepared``; return the quantizer paths it was on."""
    cleared = []
    for path, q in quantizers_of(prepared).items():
        if q.has_bias_delta:
            q.clear_learned("bias_correction")
            cleared.append(path)
    return cleared


class _ChannelSums:
    """Per output channel: count, Σe, Σe² of ``e = conv(x, W_q) − conv(x, W)``; Σ reference²."""

    def __init__(self) -> None:
        self.count: torch.Tensor | None = None
        self.sum: torch.Tensor | None = None
        self.sq: torch.Tensor | None = None
        self.ref_sq = 0.0
        self.old_delta: torch.Tensor | None = None
        self.added_bias = False
        self.weight: torch.Tensor | None = None
        self.calls = 0

    def add(self, err: torch.Tensor, ref: torch.Tensor, dim: int) -> None:
        e = err.detach().to(torch.float64).movedim(dim, 0).reshape(err.shape[dim], -1)
        count = torch.full((e.shape[0],), float(e.shape[1]), dtype=torch.float64)
        part = (count, e.sum(dim=1).cpu(), (e * e).sum(dim=1).cpu())
        if self.count is None or self.sum is None or self.sq is None:
            self.count, self.sum, self.sq = part
        else:
            self.count, self.sum, self.sq = (
                self.count + part[0],
                self.sum + part[1],
                self.sq + part[2],
            )
        self.ref_sq += float((ref.detach().to(torch.float64) ** 2).sum())


def _measure(
    sums: _ChannelSums, layer: Layer, ref: Any, func: Any, raw: Call, applied: Call
) -> None:
    """The weight-quantization error of one call, on the call's INT8 input."""
    w = _layers.weight_of(raw, ref)
    w_q = _layers.weight_of(applied, ref)
    bias = _layers.bias_of(raw)
    err = _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w_q - w, None))
    reference = _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w, bias))
    sums.add(err, reference, _layers.channel_dim(err, w, layer.family))
    sums.calls += 1
    sums.added_bias = bias is None
    sums.weight = w
    delta = layer.quantizer._buffers.get("bias_delta")
    sums.old_delta = (
        delta.detach().to(torch.float64).cpu() if isinstance(delta, torch.Tensor) else None
    )


def _apply(layer: Layer, sums: _ChannelSums, settings: dict[str, Any], calls: int) -> BiasRow:
    """Set ``delta = −mean(e)`` per channel; the row with the layer's SQNR before and after."""
    assert sums.count is not None and sums.sum is not None and sums.sq is not None
    assert sums.weight is not None
    mean = sums.sum / sums.count
    delta = -mean
    old = sums.old_delta if sums.old_delta is not None else torch.zeros_like(delta)

    def energy(d: torch.Tensor) -> float:  # Σ(e + d)² from the per-channel sums
        assert sums.sq is not None and sums.sum is not None and sums.count is not None
        return float((sums.sq + 2 * d * sums.sum + sums.count * d * d).sum())

    layer.quantizer.set_bias_delta(delta.to(torch.float32), sums.weight, settings)
    return BiasRow(
        name=layer.name,
        quantizer=layer.path,
        channels=int(delta.numel()),
        mean_abs_delta=float(delta.abs().mean()),
        max_abs_delta=float(delta.abs().max()),
        sqnr_before_db=_sqnr(sums.ref_sq, energy(old)),
        sqnr_after_db=_sqnr(sums.ref_sq, max(energy(delta), 0.0)),
        added_bias=sums.added_bias,
        calls=calls,
    )


def _sqnr(signal: float, noise: float) -> float:
    if noise <= 0.0:
        return math.inf
    if signal <= 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None
