"""Cross-layer equalization: per-channel ranges moved from an activation into the next weights.

TensorRT quantizes an activation with one scale for the whole tensor. When its channels span very
different ranges, the one scale is set by the widest channels and the narrow ones get only a few
of the 255 levels. On MTCNN's ONet the 256 features before the heads span 0.015 to 2.0 (median
0.14): with amax 2.0 the median feature has nine levels, and that one quantizer costs more box
regression fidelity on face crops than every other quantizer of the network together.

The float model can move those ranges elsewhere without changing what it computes. A *pair* is
a producer layer P (Conv or Linear, or the BatchNorm after it) whose output reaches one or more
consumer layers C (Conv with ``groups=1``, or Linear) only through ops that commute with a
positive per-channel scale: ReLU, LeakyReLU, PReLU, max and average pooling, zero padding,
dropout, identity (``f(x / s) = f(x) / s`` for ``s > 0``, channel by channel). Dividing P's output
channel ``c`` by ``s_c`` (its weight row and bias, or the BatchNorm's weight and bias) and
multiplying input channel ``c`` of every C's weight by ``s_c`` leaves the network's function
unchanged up to float rounding, while the activation the consumers read has channel ranges
``r_c / s_c``. ReLU6, Hardtanh, SiLU, GELU and the like do not commute with a scale (a clip at 6
moves), so a pair never crosses them.

The scale
---------
``s_c = r_c ** alpha / w_c ** (1 - alpha)``, where ``r_c`` is channel ``c``'s largest ``|x|`` at
the consumers' input over the data and ``w_c`` the largest ``|weight|`` of input channel ``c`` over
all consumers (SmoothQuant's rule). With ``alpha = 0.5`` each channel's activation range and
weight range become equal, ``sqrt(r_c * w_c)``; with ``alpha = 1`` every channel gets the same
range and the consumers' weights take all of the spread. The producer's weights are quantized per
output channel, so dividing a whole row by ``s_c`` does not change its quantization at all; the
consumers' per-output-channel weights see columns scaled by ``s_c``, which can cost more than the
activation gains. The scales are normalised so that the activation's largest range stays what it
was; dead channels (``r_c = 0``) and channels no consumer reads (``w_c = 0``) keep ``s_c = 1``.

Only where it helps
-------------------
Moving range into the consumers' weights can cost them more than the activation gains (a
channel's range alone does not say how its consumers' weights quantize). So each pair is tried on
a sample of the consumers' input (the first batches, at most :data:`SAMPLE_VALUES` values): the
consumers' outputs with the input fake-quantized per tensor (amax by ``mse`` from its histogram,
as :func:`qdq.calibrate` does by default) and their weights per output channel (abs-max), against
their float outputs, without and with the scales. A pair is equalized only when its consumers'
relative squared error drops (``guard=False`` equalizes every pair); the others are reported and
left alone. ``alpha`` is not searched per pair: a larger ``alpha`` always looks better on the
sample but amplifies the channels that were narrow there, which other inputs then clip (measured
on MTCNN: ``alpha`` 1 chosen this way lowered the consumers' error 3x on the calibration crops and
the box cosine on the evaluation crops from 0.9964 to 0.9903).

Pairs are found on the recorded graph (:func:`qdq.graph.record.record`) and equalized in forward
order, once; the ranges come from one FP32 pass over the data. Equalization changes the float
weights, so it runs *before* :func:`qdq.prepare` and calibration, on a copy: the user's model is
never modified, and the exported ONNX carries the equalized weights.

Example:
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    >>> with torch.no_grad():
    ...     net[0].weight[:4] *= 50.0  # four wide channels, four narrow ones
    >>> x = torch.randn(16, 3, 12, 12)
    >>> eq = equalize(net, (x[:1],), [x])
    >>> [(r.producer, r.consumers) for r in eq.rows]
    [('0', ('2',))]
    >>> bool(eq.rows[0].spread_after < eq.rows[0].spread_before)
    True
    >>> torch.allclose(eq.model(x), net(x), rtol=1e-4, atol=1e-4)
    True
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.calib.batches import expected_inputs, run_batch
from qdq.calib.histogram import HistogramCalibrator
from qdq.graph.capture import module_path
from qdq.graph.record import record
from qdq.ptq._pairs import Pair, find_pairs, label, weight_of
from qdq.ptq.report import StepReport
from qdq.quant import fake_quant

__all__ = ["DEFAULT_ALPHA", "SAMPLE_VALUES", "EqualizeRow", "Equalized", "equalize"]

DEFAULT_ALPHA = 0.5
#: values of each pair's activation kept to try its scales (whole samples, at least one)
SAMPLE_VALUES = 1 << 20
SETTINGS = {
    "method": "cross-layer equalization",
    "rule": "s = r**alpha / w**(1 - alpha)",
    "guard": "a pair is equalized only when its consumers' INT8 error drops on the sample",
}


@dataclass(frozen=True)
class EqualizeRow:
    """One equalized pair.

    Attributes:
        producer: module path whose output channels were divided (the Conv/Linear, or the
            BatchNorm after it).
        consumers: module paths whose input channels were multiplied.
        through: the ops between them (module paths or function names).
        channels: channels equalized.
        spread_before: the activation's widest channel range over its median one, before.
        spread_after: the same after equalization.
        scale_min / scale_max: the smallest and largest ``s_c`` over the live channels.
        alpha: the ``alpha`` applied; ``None``: left alone (the scales did not lower the
            consumers' error).
        error_before / error_after: the consumers' INT8 output error on the sample (relative
            squared error, see the module docstring) without and with the applied scales.
    """

    producer: str
    consumers: tuple[str, ...]
    through: tuple[str, ...]
    channels: int
    spread_before: float
    spread_after: float
    scale_min: float
    scale_max: float
    alpha: float | None
    error_before: float
    error_after: float

    @property
    def equalized(self) -> bool:
        """Whether scales were applied."""
        return self.alpha is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        d = asdict(self)
        d["consumers"], d["through"] = list(self.consumers), list(self.through)
        return d


@dataclass(frozen=True)
class Equalized(StepReport):
    """What :func:`equalize` returns: the equalized copy and one row per pair, in forward order."""

    model: nn.Module
    rows: tuple[EqualizeRow, ...]
    alpha: float
    guard: bool = True
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "equalize"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("producer", lambda r: r.producer),
        ("channels", lambda r: str(r.channels)),
        ("alpha", lambda r: "-" if r.alpha is None else f"{r.alpha:g}"),
        ("spread", lambda r: f"{r.spread_before:.1f} -> {r.spread_after:.1f}"),
        ("INT8 error", lambda r: f"{r.error_before:.2e} -> {r.error_after:.2e}"),
        ("consumers", lambda r: ", ".join(r.consumers)),
    )

    def summary(self) -> str:
        """One line: pairs equalized, the widest activation spread and the consumers' error."""
        done = [r for r in self.rows if r.equalized]
        if not done:
            found = f"{len(self.rows)} pair(s) found, none improved" if self.rows else "no pair"
            return f"cross-layer equalization: {found}"
        how = f"alpha {self.alpha:g}" + (", where the consumers' error drops" if self.guard else "")
        before = max(r.spread_before for r in done)
        after = max(r.spread_after for r in done)
        err = statistics.geometric_mean(
            max(r.error_after, 1e-30) / max(r.error_before, 1e-30) for r in done
        )
        return (
            f"cross-layer equalization of {len(done)}/{len(self.rows)} pair(s) ({how}): widest "
            f"activation spread {before:.1f}x -> {after:.1f}x, consumers' INT8 error x{err:.2f}"
        )

    def fields(self) -> dict[str, Any]:
        """The method, alpha and whether it was guarded (the model is not JSON)."""
        return {**SETTINGS, "alpha": self.alpha, "guarded": self.guard}


def equalize(
    model: nn.Module,
    example_inputs: Sequence[Any],
    data: Iterable[Any],
    *,
    alpha: float = DEFAULT_ALPHA,
    guard: bool = True,
    num_batches: int | None = None,
    show_progress: bool = False,
) -> Equalized:
    """Cross-layer equalization of a float model (see the module docstring); returns a copy.

    Args:
        model: the float model (never modified).
        example_inputs: positional inputs for one forward (as for :func:`qdq.prepare`).
        data: batches as :func:`qdq.calibrate` takes them; the activation ranges come from them.
        alpha: in ``(0, 1]``: how much of each channel's range moves into the weights (1: all of
            it, every activation channel then has the same range).
        guard: equalize a pair only when its consumers' INT8 error drops on the sample.
        num_batches: use at most this many batches (default: all).
        show_progress: a progress bar over the batches.

    Returns:
        :class:`Equalized`: ``.model`` is the equalized copy (pass it to :func:`qdq.prepare`),
        ``.rows`` one row per pair.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``alpha`` outside ``(0, 1]``, a bad ``num_batches``, or no batch in ``data``.
        CalibrationError: a batch does not fit the model (naming the batch).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        raise ValueError(f"alpha must be a number in (0, 1], got {alpha!r}")
    if num_batches is not None and (
        isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1
    ):
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    work = copy.deepcopy(model)
    graph = record(work, tuple(example_inputs)).graph
    modules = dict(work.named_modules())
    pairs, notes = find_pairs(graph, modules)
    if not pairs:
        return Equalized(work, (), float(alpha), bool(guard), tuple(notes))
    seen = _observe(work, modules, pairs, data, num_batches, show_progress)
    rows = [_apply(modules, p, seen[i], float(alpha), bool(guard)) for i, p in enumerate(pairs)]
    return Equalized(work, tuple(rows), float(alpha), bool(guard), tuple(notes))


# ---------------------------------------------------------------------------- ranges, scales


@dataclass
class _Seen:
    """A pair's consumer input over the data: per-channel ranges and the first samples."""

    dim: int
    ranges: torch.Tensor | None = None
    sample: list[torch.Tensor] | None = None
    values: int = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach()
        d = self.dim % x.dim()
        r = x.abs().amax(dim=[k for k in range(x.dim()) if k != d]).double()
        self.ranges = r if self.ranges is None else torch.maximum(self.ranges, r)
        per_sample = max(1, x[:1].numel())
        room = (SAMPLE_VALUES - self.values) // per_sample
        if self.sample is None:
            self.sample = []
            room = max(room, 1)  # at least one sample
        if room > 0:
            kept = x[:room].clone()
            self.sample.append(kept)
            self.values += kept.numel()


def _observe(
    work: nn.Module,
    modules: dict[str, nn.Module],
    pairs: list[Pair],
    data: Iterable[Any],
    num_batches: int | None,
    show_progress: bool,
) -> list[_Seen]:
    """Per pair, what the first consumer reads over ``data`` (one FP32 pass)."""
    seen = [_Seen(p.channel_dim) for p in pairs]
    handles = [
        modules[module_path(p.consumers[0])].register_forward_pre_hook(
            lambda _, args, s=seen[i]: s.add(args[0])
        )
        for i, p in enumerate(pairs)
    ]
    expected = expected_inputs(work)
    batches = 0
    try:
        with eval_no_grad(work):
            for batch in progress(data, total=num_batches, desc="equalize", enabled=show_progress):
                run_batch(work, batch, batches, expected)
                batches += 1
                if num_batches is not None and batches >= num_batches:
                    break
    finally:
        for h in handles:
            h.remove()
    if batches == 0:
        raise ValueError("equalization saw no batches: the data is empty")
    missing = [
        module_path(p.consumers[0]) for p, s in zip(pairs, seen, strict=True) if not s.sample
    ]
    if missing:
        raise ValueError(f"equalization: layers not called on this data: {missing[:5]}")
    return seen


def _input_channel_max(weight: torch.Tensor) -> torch.Tensor:
    """Largest ``|w|`` per input channel (dimension 1) of a Conv/Linear weight."""
    return weight.detach().abs().transpose(0, 1).reshape(weight.shape[1], -1).amax(dim=1).double()


def _per_channel(s: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """``s`` in ``like``'s dtype, shaped to broadcast along dimension ``dim`` of ``like``."""
    shape = [1] * like.dim()
    shape[dim % like.dim()] = -1
    return s.to(like.dtype).reshape(shape)


def _scales(r: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s_c`` (see the module docstring); 1 where the channel is dead or unread."""
    live = (r > 0) & (w > 0)
    s = torch.ones_like(r)
    if bool(live.any()):
        s[live] = r[live] ** alpha / w[live] ** (1.0 - alpha)
        s[live] *= (r[live] / s[live]).max() / r[live].max()  # the largest range stays
    return s


def _int8_error(
    consumers: list[nn.Module], x: torch.Tensor, dim: int, s: torch.Tensor, ref: list[torch.Tensor]
) -> float:
    """Relative squared error of the consumers' outputs with their input divided by ``s`` and
    fake-quantized per tensor (mse amax), their weights' columns multiplied by ``s`` and
    fake-quantized per output channel (abs-max)."""
    xs = x / _per_channel(s, x, dim)
    cal = HistogramCalibrator()
    cal.collect(xs)
    amax = cal.compute_amax("mse")
    xq = fake_quant(xs, amax) if float(amax) > 0 else xs
    num = den = 0.0
    for c, y in zip(consumers, ref, strict=True):
        weight = weight_of(c).detach()
        ws = weight * _per_channel(s, weight, 1)
        w_amax = ws.abs().reshape(ws.shape[0], -1).amax(dim=1).clamp_min(1e-30)
        wq = fake_quant(ws, w_amax, axis=0)
        yq = torch.func.functional_call(c, {"weight": wq}, (xq,))
        num += float((yq - y).double().pow(2).sum())
        den += float(y.double().pow(2).sum())
    return num / den if den > 0 else 0.0


def _apply(
    modules: dict[str, nn.Module], pair: Pair, seen: _Seen, alpha: float, guard: bool
) -> EqualizeRow:
    consumers = [modules[module_path(c)] for c in pair.consumers]
    assert seen.ranges is not None and seen.sample  # _observe checked both
    r = seen.ranges
    w = torch.stack([_input_channel_max(weight_of(c)) for c in consumers]).amax(dim=0)
    x = torch.cat(seen.sample)
    s = _scales(r, w, alpha)
    with torch.no_grad():
        ref = [c(x) for c in consumers]
        before = _int8_error(consumers, x, pair.channel_dim, torch.ones_like(r), ref)
        after = _int8_error(consumers, x, pair.channel_dim, s, ref)
    chosen: float | None = alpha
    if guard and not after < before:
        chosen, after, s = None, before, torch.ones_like(r)
    if chosen is not None:
        scaled = modules[pair.scaled]
        with torch.no_grad():
            rows = weight_of(scaled)
            rows.div_(_per_channel(s, rows, 0))
            if isinstance(scaled.bias, torch.Tensor):
                scaled.bias.div_(_per_channel(s, scaled.bias, 0))
            for c in consumers:
                columns = weight_of(c)
                columns.mul_(_per_channel(s, columns, 1))
    live = (r > 0) & (w > 0)
    return EqualizeRow(
        producer=pair.scaled,
        consumers=tuple(module_path(c) for c in pair.consumers),
        through=tuple(label(n) for n in pair.through),
        channels=int(r.numel()),
        spread_before=_spread(r[live]),
        spread_after=_spread((r / s)[live]),
        scale_min=float(s[live].min()) if bool(live.any()) else 1.0,
        scale_max=float(s[live].max()) if bool(live.any()) else 1.0,
        alpha=chosen,
        error_before=before,
        error_after=after,
    )


def _spread(r: torch.Tensor) -> float:
    """The widest channel range over the median one (1.0 when there is nothing to compare)."""
    if r.numel() == 0:
        return 1.0
    median = statistics.median(r.tolist())
    return float(r.max()) / median if median > 0 else float("inf")
