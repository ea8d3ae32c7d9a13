"""Bias correction: remove the mean shift quantization adds to each output channel of a layer.

Quantization changes a layer's output by an error whose mean over the data is, per output
channel, a constant shift: large for depthwise convolutions and other layers with few weights per
channel (their rounding errors do not average out), and after ReLU-clipped or otherwise skewed
activations upstream. Bias correction adds the opposite of that mean to the layer's bias. Two
variants (``error=``), both empirical (measured on ``num_batches`` batches):

* ``"output"`` (default; AIMET's empirical bias correction): the whole error of the layer's output
  in the INT8 model against the same output in the FP32 model::

      delta_c = E[conv(x_fp, W) + b]_c − E[conv(x_q, W_q) + b]_c

  ``x_fp`` is the layer's input in the FP32 model (every quantizer bypassed), ``x_q`` in the INT8
  model (upstream quantized and already corrected, the layer's input Q/DQ applied). Layers are
  corrected one after the other in forward order, each on the INT8 model with every upstream
  correction in place: in lockstep passes (:mod:`qdq.ptq._lockstep`), one forward of the INT8
  model and one of its FP32 twin for all the layers (the layer-by-layer path, two forwards per
  layer and batch stopped after the layer, where the passes cannot run). This is the
  error AdaRound's objective measures too, so the two compose.
* ``"weight"`` (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias
  Correction", empirical form): only the error of the weight quantization, on the layer's own
  INT8 input::

      delta_c = −E[conv(x_q, W_q) − conv(x_q, W)]_c

  All layers in one INT8 pass (a layer's input is that of the INT8 model before this pass's
  corrections; their effect downstream is of second order). After AdaRound it undoes part of
  what AdaRound learned (AdaRound's codes deliberately compensate upstream error, which this
  variant counts as weight error and removes): use ``"output"`` there.

Means are over samples and every spatial position. ``W_q`` is the weight as the model quantizes
it now, so run :func:`correct_bias` after :func:`qdq.ptq.adaround.adaround` (AdaRound drops an
earlier correction, with a warning). A second run replaces the correction.

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

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import quantizers_of
from qdq.debug.stats import finite_fields
from qdq.graph.calls import SiteKey
from qdq.graph.runtime import ArgRef, Call, Site
from qdq.ptq import _layers, _lockstep
from qdq.ptq._layers import Layer
from qdq.ptq.report import StepReport
from qdq.quant import QuantMode, quantizer_mode

__all__ = ["BiasCorrection", "BiasRow", "clear_bias_correction", "correct_bias"]

METHOD = "empirical"
#: what a correction removes (see the module docstring)
ERRORS = ("output", "weight")


@dataclass(frozen=True)
class BiasRow:
    """The correction of one layer.

    Attributes:
        name: the weight quantizer's name (``"layer1.conv1:weight"``).
        quantizer: its module path.
        channels: output channels corrected.
        mean_abs_delta: mean ``|delta|`` over channels.
        max_abs_delta: largest ``|delta|``.
        sqnr_before_db: the SQNR of the error the correction targets (``error="output"``: the
            INT8 layer output vs the FP32 model's; ``"weight"``: vs ``conv(x_q, W) + b``) before
            this correction, over the data used.
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
        return finite_fields(self)


@dataclass(frozen=True)
class BiasCorrection(StepReport):
    """What :func:`correct_bias` did: one row per corrected layer, in forward order."""

    rows: tuple[BiasRow, ...]
    batches: int
    samples: int
    notes: tuple[str, ...] = ()
    error: str = "output"

    key: ClassVar[str] = "bias_correction"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("layer", lambda r: r.name),
        ("mean|d|", lambda r: f"{r.mean_abs_delta:.3g}"),
        ("max|d|", lambda r: f"{r.max_abs_delta:.3g}"),
        ("SQNR dB", lambda r: f"{r.sqnr_before_db:.2f}"),
        ("after", lambda r: f"{r.sqnr_after_db:.2f}"),
    )

    def summary(self) -> str:
        """One line: layers corrected and the median SQNR gain."""
        if not self.rows:
            return "bias correction: no layer corrected"
        gains = sorted(r.sqnr_after_db - r.sqnr_before_db for r in self.rows)
        median = gains[len(gains) // 2]
        return (
            f"bias correction ({self.error} error) on {len(self.rows)} layers from {self.samples} samples: "
            f"median layer SQNR gain {median:+.2f} dB"
        )

    def fields(self) -> dict[str, Any]:
        """The method, the error it targets and the data used."""
        return {
            "method": METHOD,
            "error": self.error,
            "batches": self.batches,
            "samples": self.samples,
        }

    def flag(self, row: BiasRow) -> str:
        """Layers without a bias got one."""
        return "  (bias added)" if row.added_bias else ""


def correct_bias(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    num_batches: int = 4,
    error: str = "output",
    show_progress: bool = False,
) -> BiasCorrection:
    """Correct the bias of every weighted layer of a calibrated model, in place.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`.
        data: batches as :func:`qdq.calibrate` takes them (the first ``num_batches`` are kept
            in memory).
        num_batches: batches to average over.
        error: ``"output"`` (the layer's whole output error against FP32, layer by layer) or
            ``"weight"`` (the weight-quantization error on the layer's INT8 input, one pass);
            see the module docstring.
        show_progress: a progress bar.

    Returns:
        :class:`BiasCorrection`, one row per corrected layer (forward order).

    Raises:
        ValueError: not a prepared call-site model, a quantizer without amax, a bad
            ``num_batches`` or ``error``, or no batch in ``data``.
        qdq.quant.StaleStateError: learned state of a layer no longer fits its weight.
    """
    _layers.check_ready(prepared, "correct_bias")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    if error not in ERRORS:
        raise ValueError(f"error must be one of {ERRORS}, got {error!r}")
    batches: list[Any] = []
    for batch in data:
        batches.append(batch)
        if len(batches) >= num_batches:
            break
    if not batches:
        raise ValueError("correct_bias saw no batches: the data is empty")
    samples = sum(_layers.batch_size(b) for b in batches)
    layers, notes = _layers.find_layers(prepared)
    settings = {"method": METHOD, "error": error, "num_batches": len(batches),
                "samples": samples}  # fmt: skip
    if error == "weight":
        sums = _weight_pass(prepared, layers, batches, show_progress)
        rows = [_apply(layer, s, settings, len(batches)) for layer, s in sums]
    else:
        with eval_no_grad(prepared):
            _layers.survey(prepared, batches[0], layers)
        ordered = sorted((x for x in layers if x.order is not None), key=lambda x: x.order or 0)
        ticks = iter(progress(ordered, total=len(ordered), desc="bias correction",
                              enabled=show_progress))  # fmt: skip
        found = _in_lockstep(prepared, ordered, batches, settings, notes, ticks)
        rows = []
        for layer in ordered:  # layer by layer: what the lockstep passes could not do
            if layer.path not in found:
                next(ticks, None)
                found[layer.path] = _corrected(prepared, layer, batches, settings, notes)
            row = found[layer.path]
            if row is not None:
                rows.append(row)
        for _ in ticks:  # close the progress bar
            pass
    done = {r.quantizer for r in rows}
    unreached = [layer.name for layer in layers if layer.path not in done]
    if unreached:
        notes.append(f"{len(unreached)} layer(s) were not called on this data: {unreached[:5]}")
    return BiasCorrection(tuple(rows), len(batches), samples, tuple(notes), error)


def _weight_pass(
    prepared: nn.Module, layers: list[Layer], batches: list[Any], show_progress: bool
) -> list[tuple[Layer, _ChannelSums]]:
    """``error="weight"``: every layer's weight error in one INT8 pass, in forward order."""
    index = _layers.index_of(layers)
    sums: dict[str, tuple[Layer, _ChannelSums]] = {}

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        out = _layers.invoke(func, applied)
        hit = _layers.lookup(index, key)
        if hit is not None and isinstance(out, torch.Tensor):
            layer, ref = hit
            entry = sums.setdefault(layer.path, (layer, _ChannelSums()))
            w, w_q = _layers.weight_of(raw, ref), _layers.weight_of(applied, ref)
            err = _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w_q - w, None))
            bias = _layers.bias_of(raw)
            reference = _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w, bias))
            entry[1].add(err, reference, layer, w, bias)
        return out

    with eval_no_grad(prepared), _layers.tapped(prepared, tap):
        for batch in progress(batches, total=len(batches), desc="bias correction",
                              enabled=show_progress):  # fmt: skip
            _layers.run_batches(prepared, [batch])
    return list(sums.values())


def _corrected(
    prepared: nn.Module,
    layer: Layer,
    batches: list[Any],
    settings: dict[str, Any],
    notes: list[str],
) -> BiasRow | None:
    """Correct one layer on its own (two forwards per batch, each stopped after the layer); a
    note instead of a row when its calls differ between the FP32 and the INT8 forward."""
    sums = _output_error(prepared, layer, batches)
    if sums.count is None:
        notes.append(f"{layer.name}: its calls differ between the FP32 and INT8 runs")
        return None
    return _apply(layer, sums, settings, len(batches))


def _in_lockstep(
    prepared: nn.Module,
    ordered: list[Layer],
    batches: list[Any],
    settings: dict[str, Any],
    notes: list[str],
    ticks: Iterator[Layer],
) -> dict[str, BiasRow | None]:
    """Correct the layers in forward order in lockstep passes (:func:`qdq.ptq._lockstep.passes`):
    the batches joined into one forward of the FP32 twin and one of the INT8 model, each layer
    corrected when the INT8 forward reaches it, its corrected output going on downstream; a
    layer called several times is corrected on its own. Returns the rows of the layers done by
    path (``None``: a note says why not); the caller corrects the others layer by layer."""
    rows: dict[str, BiasRow | None] = {}

    def visit(layer: Layer, ref: ArgRef, fp: _lockstep.Handed, func: Any, raw: Call,
              applied: Call) -> Any:  # fmt: skip
        weight, bias = _layers.weight_of(raw, ref), _layers.bias_of(raw)
        w_q = _layers.weight_of(applied, ref)
        plain = _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w_q, bias))
        sums = _ChannelSums()
        if isinstance(fp.out, torch.Tensor) and plain.shape == fp.out.shape:
            sums.add(plain - fp.out, fp.out, layer, weight, bias)
        next(ticks, None)
        if sums.count is None:
            notes.append(f"{layer.name}: its calls differ between the FP32 and INT8 runs")
            rows[layer.path] = None
            return _layers.invoke(func, applied)
        rows[layer.path] = _apply(layer, sums, settings, 1)
        corrected = layer.quantizer.corrected_bias(bias, weight)
        return _layers.invoke(func, _layers.replace_weight_bias(applied, ref, w_q, corrected))

    def alone(layer: Layer) -> BiasRow | None:
        next(ticks, None)
        return _corrected(prepared, layer, batches, settings, notes)

    _lockstep.passes(prepared, ordered, batches, visit, alone, rows, notes,
                     "corrected one at a time")  # fmt: skip
    return rows


def _output_error(prepared: nn.Module, layer: Layer, batches: list[Any]) -> _ChannelSums:
    """``error="output"``: the layer's INT8 output (its own correction left out) minus its FP32
    output, batch by batch (two forwards, each stopped after the layer's last call)."""
    sums = _ChannelSums()
    with eval_no_grad(prepared):
        for batch in batches:
            with quantizer_mode(prepared, QuantMode.BYPASS):
                fp32 = _outputs(prepared, layer, batch)
            int8 = _outputs(prepared, layer, batch)
            if len(fp32) != len(int8):
                continue
            for (ref, w, bias), (out, _, _) in zip(fp32, int8, strict=True):
                if out.shape == ref.shape:
                    sums.add(out - ref, ref, layer, w, bias)
    return sums


def _outputs(
    prepared: nn.Module, layer: Layer, batch: Any
) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    """``(output, float weight, float bias)`` of each call of ``layer`` on ``batch``; the output
    with the float bias (the layer's own bias correction left out)."""
    index = _layers.index_of([layer])
    seen: list[tuple[torch.Tensor, torch.Tensor, Any]] = []

    def tap(key: SiteKey, site: Site, func: Any, raw: Call, applied: Call) -> Any:
        hit = _layers.lookup(index, key)
        if hit is None:
            return _layers.invoke(func, applied)
        ref = hit[1]
        w, bias = _layers.weight_of(raw, ref), _layers.bias_of(raw)
        plain = _layers.replace_weight_bias(applied, ref, _layers.weight_of(applied, ref), bias)
        seen.append((_layers.invoke(func, plain), w, bias))
        if len(seen) >= layer.calls:
            raise _layers.Stop
        return _layers.invoke(func, applied)

    with _layers.tapped(prepared, tap):
        _layers.run_batches(prepared, [batch])
    return seen


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
        self.ref_sq: torch.Tensor | float = 0.0
        self.old_delta: torch.Tensor | None = None
        self.added_bias = False
        self.weight: torch.Tensor | None = None
        self.calls = 0

    def add(
        self, err: torch.Tensor, ref: torch.Tensor, layer: Layer, weight: torch.Tensor, bias: Any
    ) -> None:
        """Add one call: its error, its FP32 reference output, and the layer's float weight and
        bias as passed to the call."""
        dim = _layers.channel_dim(err, weight, layer.family) % err.dim()
        e = err.detach()
        # float32 reductions over every dimension but the channel's (torch sums in cascades:
        # relative error ~1e-7, where converting the whole output to float64 first cost 4x
        # the time), accumulated over calls in float64 on the model's device; no host sync here
        dims = [d for d in range(e.dim()) if d != dim]
        count = torch.full((e.shape[dim],), float(e.numel() // e.shape[dim]),
                           dtype=torch.float64, device=e.device)  # fmt: skip
        sq = torch.linalg.vector_norm(e, dim=dims).double() ** 2
        part = (count, e.sum(dim=dims).double(), sq)
        if self.count is None or self.sum is None or self.sq is None:
            self.count, self.sum, self.sq = part
        else:
            self.count, self.sum, self.sq = (
                a + b for a, b in zip((self.count, self.sum, self.sq), part, strict=True)
            )
        self.ref_sq = self.ref_sq + torch.linalg.vector_norm(ref.detach()).double() ** 2
        self.added_bias = bias is None
        self.weight = weight
        self.calls += 1
        delta = layer.quantizer._buffers.get("bias_delta")
        self.old_delta = (
            delta.detach().to(torch.float64) if isinstance(delta, torch.Tensor) else None
        )


def _apply(layer: Layer, sums: _ChannelSums, settings: dict[str, Any], batches: int) -> BiasRow:
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
        sqnr_before_db=_sqnr(float(sums.ref_sq), energy(old)),
        sqnr_after_db=_sqnr(float(sums.ref_sq), max(energy(delta), 0.0)),
        added_bias=sums.added_bias,
        calls=max(1, sums.calls // batches),
    )


def _sqnr(signal: float, noise: float) -> float:
    if noise <= 0.0:
        return math.inf
    if signal <= 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)
