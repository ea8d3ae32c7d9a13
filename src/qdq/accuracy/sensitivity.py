"""``qdq.sensitivity``: which units (scale groups) cost the most accuracy, worst first.

Two modes, each one model configuration per unit (see :mod:`qdq.accuracy.units`):

* ``"one-off"`` (default): everything INT8 except this unit — how much comes back when only this
  unit stays float (what a fallback gains);
* ``"one-on"``: only this unit INT8 — the damage this unit does on its own.

Two ways to score a configuration:

* no ``metric``: the *proxy* — the model outputs on a few batches of ``data`` against FP32 (the
  same model with every quantizer bypassed, computed once): SQNR, cosine and relative MSE over every
  output tensor. Cheap: one forward per unit and batch;
* ``metric``: the user's own evaluation, ``metric(model) -> float`` (higher is better: accuracy,
  mAP ...), called once per unit with the model configured; ``data`` is then not used.

``damage`` orders the rows (higher: more sensitive). With the proxy it is in relative-MSE units of
the output: one-on, the output error with only this unit INT8; one-off, the part of the full INT8
output error that goes away when this unit is float. With a metric: one-on, FP32 metric minus the
score; one-off, the score minus the full-INT8 metric.

Example:
    >>> import torch, qdq
    >>> conv = torch.nn.Conv2d
    >>> net = torch.nn.Sequential(conv(3, 16, 3), torch.nn.ReLU(), conv(16, 32, 3))
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(4, 3, 12, 12) for _ in range(2)]
    >>> _ = qdq.calibrate(m, data, show_progress=False)
    >>> s = sensitivity(m, data, show_progress=False)
    >>> [r.name for r in s.rows], s.mode
    (['2:input', '0:input'], 'one-off')
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.accuracy.units import Unit, units_of, units_off, units_only
from qdq.api import plan_of, quantizers_of
from qdq.calib.batches import batch_samples, expected_inputs, run_batch
from qdq.debug.stats import ErrorStats, ErrorSums, finite
from qdq.quant import QuantMode, quantizer_mode

__all__ = [
    "MODES",
    "Metric",
    "Sensitivity",
    "SensitivityRow",
    "checked_metric",
    "output_error",
    "sensitivity",
]

MODES = ("one-off", "one-on")
#: the user's evaluation: the model in → a figure out (higher is better)
Metric = Callable[[nn.Module], float]


@dataclass(frozen=True)
class SensitivityRow:
    """One unit's configuration and what it scored.

    Attributes:
        name: the unit (its scale group's leader point).
        owners: the ops the unit covers (what a fallback keeps in float).
        ops: their op kinds.
        quantizers: the unit's quantizer paths.
        score: the configuration's figure: output SQNR in dB (proxy) or the metric.
        damage: how sensitive the unit is (see the module docstring); rows sort by it.
        cosine: output cosine vs FP32 (proxy only).
    """

    name: str
    owners: tuple[str, ...]
    ops: tuple[str, ...]
    quantizers: tuple[str, ...]
    score: float
    damage: float
    cosine: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {
            "name": self.name,
            "owners": list(self.owners),
            "ops": list(self.ops),
            "quantizers": list(self.quantizers),
            "score": finite(self.score),
            "damage": finite(self.damage),
            "cosine": self.cosine,
        }


@dataclass(frozen=True)
class Sensitivity:
    """Result of :func:`sensitivity`: ``rows`` worst (most sensitive) first.

    Attributes:
        mode: ``"one-off"`` or ``"one-on"``.
        scored_by: ``"output_sqnr_db"`` (the proxy) or ``"metric"``.
        fp32: the FP32 figure (proxy: ``inf`` dB).
        int8: the full-INT8 figure.
        rows: one per unit, worst first.
        evaluations: configurations scored (units + baselines).
        seconds: wall time.
        samples: samples behind the proxy (``None`` with a metric).
    """

    mode: str
    scored_by: str
    fp32: float
    int8: float
    rows: tuple[SensitivityRow, ...]
    evaluations: int
    seconds: float
    samples: int | None = None

    def row(self, name: str) -> SensitivityRow:
        """The row of unit ``name`` (or of a unit owning op ``name``)."""
        for r in self.rows:
            if name == r.name or name in r.owners:
                return r
        raise KeyError(f"no unit {name!r}; known: {[r.name for r in self.rows][:8]}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {
            "mode": self.mode,
            "scored_by": self.scored_by,
            "fp32": finite(self.fp32),
            "int8": finite(self.int8),
            "evaluations": self.evaluations,
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self) -> str:
        """Indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self, top: int | None = 10) -> str:
        """A table of the ``top`` most sensitive units (all with ``None``)."""
        rows = self.rows if top is None else self.rows[:top]
        unit = "output SQNR dB" if self.scored_by == "output_sqnr_db" else "metric"
        what = "only this unit INT8" if self.mode == "one-on" else "all INT8 but this unit"
        width = max([len(r.name) for r in rows] + [4])
        lines = [
            f"sensitivity ({self.mode}: {what}), {unit}; FP32 {self.fp32:.4g}, "
            f"INT8 {self.int8:.4g}; {self.evaluations} evaluations in {self.seconds:.1f} s",
            f"{'#':>3}  {'unit':<{width}}  {'score':>10}  {'damage':>10}  ops",
        ]
        for i, r in enumerate(rows, 1):
            owners = ", ".join(r.owners[:3]) + (
                f" +{len(r.owners) - 3}" if len(r.owners) > 3 else ""
            )
            lines.append(
                f"{i:>3}  {r.name:<{width}}  {r.score:>10.4g}  {r.damage:>10.3g}  "
                f"{'/'.join(r.ops)} ({owners})"
            )
        return "\n".join(lines)


def sensitivity(
    prepared: nn.Module,
    data: Iterable[Any] | None = None,
    metric: Metric | None = None,
    *,
    mode: str = "one-off",
    num_batches: int = 4,
    units: Sequence[Unit] | None = None,
    show_progress: bool = True,
) -> Sensitivity:
    """Score every unit of a calibrated prepared model, one configuration per unit.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`; its quantizer modes and train/eval
            mode are restored afterwards. A bypassed quantizer stays bypassed in every
            configuration.
        data: batches as :func:`qdq.calibrate` takes them, for the proxy (``metric=None``).
        metric: ``metric(model) -> float``, higher is better; called with the model configured.
        mode: ``"one-off"`` or ``"one-on"``.
        num_batches: proxy batches (the first ones of ``data``, kept in memory).
        units: the units to score (default: every unit, :func:`~qdq.accuracy.units.units_of`).
        show_progress: a progress bar over the units.

    Raises:
        ValueError: not a prepared model, uncalibrated quantizers, unknown ``mode``, bad
            ``num_batches``, neither ``data`` nor ``metric``, empty ``data``, or a metric that
            does not return a finite number.
    """
    plan_of(prepared)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    if metric is None and data is None:
        raise ValueError("sensitivity needs data (for the output proxy) or a metric")
    missing = [p for p, q in quantizers_of(prepared).items()
               if q.mode is not QuantMode.BYPASS and not q.is_calibrated]  # fmt: skip
    if missing:
        raise ValueError(f"quantizers without amax: {missing[:5]}; run qdq.calibrate first")
    todo = list(units) if units is not None else units_of(prepared)
    start = time.perf_counter()
    score: Callable[[], tuple[float, float | None]]
    if metric is None:
        assert data is not None
        proxy = _Proxy(prepared, data, num_batches)
        score, scored_by, samples, fp32 = proxy.score, "output_sqnr_db", proxy.samples, math.inf
    else:
        checked = checked_metric(metric)
        score, scored_by, samples = (lambda: (checked(prepared), None)), "metric", None
        with quantizer_mode(prepared, QuantMode.BYPASS):
            fp32 = score()[0]
    int8 = score()[0]
    int8_err = _rel_mse(int8)
    rows = []
    switch = units_off if mode == "one-off" else units_only
    for unit in progress(todo, total=len(todo), desc=f"sensitivity {mode}", enabled=show_progress):
        with switch(prepared, [unit]):
            value, cos = score()
        if scored_by == "metric":
            damage = value - int8 if mode == "one-off" else fp32 - value
        else:
            damage = int8_err - _rel_mse(value) if mode == "one-off" else _rel_mse(value)
        rows.append(SensitivityRow(unit.name, unit.owners, unit.ops, unit.quantizers, value,
                                   damage, cos))  # fmt: skip
    order = {u.name: i for i, u in enumerate(todo)}
    rows.sort(key=lambda r: (-r.damage if math.isfinite(r.damage) else math.inf, order[r.name]))
    return Sensitivity(
        mode=mode,
        scored_by=scored_by,
        fp32=fp32,
        int8=int8,
        rows=tuple(rows),
        evaluations=len(rows) + (1 if metric is None else 2),
        seconds=time.perf_counter() - start,
        samples=samples,
    )


def output_error(reference: Any, output: Any, sums: ErrorSums | None = None) -> ErrorSums:
    """Add every floating output tensor of ``output`` vs ``reference`` (pytree order) to ``sums``."""
    sums = sums if sums is not None else ErrorSums()
    refs = [t for t in tree_flatten(reference)[0] if isinstance(t, torch.Tensor)]
    outs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    if len(refs) != len(outs):
        raise ValueError(f"the model returned {len(outs)} tensors, FP32 {len(refs)}")
    for x, y in zip(refs, outs, strict=True):
        if x.is_floating_point() and x.shape == y.shape:
            sums.add(x, y)
    return sums


def _rel_mse(sqnr_db: float) -> float:
    return 0.0 if sqnr_db == math.inf else 10.0 ** (-sqnr_db / 10.0)


class _Proxy:
    """The first ``num_batches`` batches and their FP32 outputs; scores a configuration."""

    def __init__(self, prepared: nn.Module, data: Iterable[Any], num_batches: int) -> None:
        self.model = prepared
        self.expected = expected_inputs(prepared)
        self.batches: list[Any] = []
        self.references: list[Any] = []
        self.samples = 0
        with eval_no_grad(prepared), quantizer_mode(prepared, QuantMode.BYPASS):
            for i, batch in enumerate(data):
                if i >= num_batches:
                    break
                self.batches.append(batch)
                self.references.append(run_batch(prepared, batch, i, self.expected))
                self.samples += batch_samples(batch)
        if not self.batches:
            raise ValueError("sensitivity saw no batches: the data is empty")

    def score(self) -> tuple[float, float | None]:
        sums = ErrorSums()
        with eval_no_grad(self.model):
            for i, (batch, ref) in enumerate(zip(self.batches, self.references, strict=True)):
                output_error(ref, run_batch(self.model, batch, i, self.expected), sums)
        stats: ErrorStats = sums.stats()
        return stats.sqnr_db, stats.cosine


def checked_metric(metric: Metric) -> Callable[[nn.Module], float]:
    """``metric`` called without autograd, the model's train/eval mode restored, and its result
    checked: a finite number (else ``ValueError``)."""
    if not callable(metric):
        raise TypeError(f"metric must be a callable model -> float, got {type(metric).__name__}")

    def score(model: nn.Module) -> float:
        was_training = model.training
        try:
            with torch.no_grad():
                value = metric(model)
        finally:
            model.train(was_training)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"the metric must return a number, got {type(value).__name__}: {value!r}"
            ) from None
        if not math.isfinite(number):
            raise ValueError(f"the metric returned {number}: it must be finite")
        return number

    return score
