"""``qdq.auto_quantize``: INT8 everywhere the accuracy budget allows, float where it does not.

1. Prepare and calibrate the whole model; measure the metric of FP32 and of full INT8.
2. Within ``max_drop``: done. Otherwise rank every unit (scale group, :mod:`qdq.accuracy.units`) by
   the cheap proxy — :func:`qdq.sensitivity` one-off on a few batches, one forward per unit —, then
   confirm the ``candidates`` best with the user's metric (everything INT8 but that unit).
3. Fall back units greedily, confirmed gains first, then the proxy order (units that lost metric
   alone, or whose float version does not bring the outputs closer to FP32, are not tried): put a
   unit in float, measure, keep it there unless the metric got worse (several units may be needed
   before a coarse metric moves); stop once the drop is within budget, or after ``patience``
   units in a row without a gain. Then put back in INT8 every unit the budget does not need (or,
   budget not met, that gains nothing), latest first.
4. Re-plan: :func:`qdq.prepare` again with the fallen units' ops excluded (rule ``USER``, so the
   plan, the export and its manifest all say so), calibrate again, measure the final metric.
5. Predict the TensorRT cost (``lint_cost``): export the full-INT8 model, the final model and the
   full model less each fallen unit, lint each, and report per unit how many weighted layers
   leave INT8, float islands appear and Q/DQ stay unfused.

The user's model is never modified. Every figure is from ``metric`` (default: top-1 agreement
with FP32 on ``eval_data``, or the mean output cosine when the output has no class dimension).

Example:
    >>> import torch, qdq
    >>> conv = torch.nn.Conv2d
    >>> net = torch.nn.Sequential(conv(3, 16, 3), torch.nn.ReLU(), conv(16, 32, 3)).eval()
    >>> data = [torch.randn(8, 3, 12, 12) for _ in range(2)]
    >>> res = auto_quantize(net, (data[0][:1],), data, max_drop=1.0, show_progress=False)
    >>> res.fallback, res.within_budget
    ((), True)
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.accuracy.sensitivity import Metric, Sensitivity, checked_metric, sensitivity
from qdq.accuracy.units import Unit, units_of, units_off
from qdq.api import calibrate, plan_of, prepare
from qdq.calib.batches import expected_inputs, run_batch
from qdq.config import QuantConfig
from qdq.debug.stats import sample_cosines

__all__ = ["AutoQuantResult", "FallbackStep", "LintCost", "agreement_metric", "auto_quantize"]

#: ``improve(prepared)``: PTQ steps run after every calibration (method choice, bias correction ...)
Improve = Callable[[nn.Module], Any]


@dataclass(frozen=True)
class LintCost:
    """What the linter predicts a fallback costs in the TensorRT engine (differences, ≥ 0 worse).

    Attributes:
        int8_layers_lost: weighted layers that leave INT8.
        float_islands: float islands added (FP16 regions between INT8 layers).
        unfused_qdq: Q/DQ added that TensorRT cannot fuse (standalone reformats).
        int8_flops_percent: INT8 share of the weighted FLOPs lost, in points.
    """

    int8_layers_lost: int
    float_islands: int
    unfused_qdq: int
    int8_flops_percent: float

    @staticmethod
    def between(base: dict[str, Any], other: dict[str, Any]) -> LintCost:
        """From two lint summaries (``LintReport.summary``)."""
        return LintCost(
            int8_layers_lost=int(base["int8_weighted_layers"]) - int(other["int8_weighted_layers"]),
            float_islands=int(other["float_islands"]) - int(base["float_islands"]),
            unfused_qdq=int(other["unfused_qdq"]) - int(base["unfused_qdq"]),
            int8_flops_percent=round(
                float(base["int8_flops_percent"]) - float(other["int8_flops_percent"]), 2
            ),
        )

    def describe(self) -> str:
        """``"1 weighted layer leaves INT8, +1 float island, +0 unfused Q/DQ"``."""
        s = "" if self.int8_layers_lost == 1 else "s"
        return (
            f"{self.int8_layers_lost} weighted layer{s} leave{'' if s else 's'} INT8 "
            f"({self.int8_flops_percent:g} pt of INT8 FLOPs), {self.float_islands:+d} float "
            f"island(s), {self.unfused_qdq:+d} unfused Q/DQ"
        )


@dataclass(frozen=True)
class FallbackStep:
    """One unit tried in float during the search.

    Attributes:
        unit: the unit's name; ``owners`` its ops (kept in float when ``kept``).
        proxy_damage: its one-off proxy damage (output relative MSE that goes away).
        confirmed_gain: metric gain with only this unit in float (``None``: not confirmed).
        metric: the metric with this and every earlier kept unit in float.
        kept: whether the unit stays in float.
        restored: kept at first, then put back in INT8 because the budget holds without it.
        cost: the predicted TensorRT cost of this unit alone (with ``lint_cost``).
    """

    unit: str
    owners: tuple[str, ...]
    proxy_damage: float
    confirmed_gain: float | None
    metric: float
    kept: bool
    restored: bool = False
    cost: LintCost | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {
            "unit": self.unit,
            "owners": list(self.owners),
            "proxy_damage": self.proxy_damage,
            "confirmed_gain": self.confirmed_gain,
            "metric": self.metric,
            "kept": self.kept,
            "restored": self.restored,
            "cost": None if self.cost is None else self.cost.__dict__,
        }


@dataclass(frozen=True)
class AutoQuantResult:
    """Result of :func:`auto_quantize`.

    Attributes:
        model: the calibrated prepared model (re-planned with ``fallback`` in float).
        fallback: the ops kept in float (module paths or functional op names), as excluded.
        fp32_metric: the float model's metric.
        int8_metric: the final model's metric (torch fake-quant, bit-exact with its export).
        full_int8_metric: the metric with everything INT8 (before any fallback).
        max_drop: the budget.
        steps: every unit tried, in order.
        config: the final :class:`~qdq.config.QuantConfig` (the exclusions appended).
        sensitivity: the proxy ranking (``None`` when no fallback was needed).
        cost: the predicted TensorRT cost of the whole fallback (with ``lint_cost``).
        seconds: wall time.
    """

    model: nn.Module
    fallback: tuple[str, ...]
    fp32_metric: float
    int8_metric: float
    full_int8_metric: float
    max_drop: float
    steps: tuple[FallbackStep, ...] = ()
    config: QuantConfig = field(default_factory=QuantConfig.tensorrt)
    sensitivity: Sensitivity | None = None
    cost: LintCost | None = None
    seconds: float = 0.0

    @property
    def drop(self) -> float:
        """``fp32_metric - int8_metric``."""
        return self.fp32_metric - self.int8_metric

    @property
    def within_budget(self) -> bool:
        """Whether the final drop is at most ``max_drop``."""
        return self.drop <= self.max_drop + 1e-12

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (without the model)."""
        return {
            "fallback": list(self.fallback),
            "fp32_metric": self.fp32_metric,
            "int8_metric": self.int8_metric,
            "full_int8_metric": self.full_int8_metric,
            "max_drop": self.max_drop,
            "drop": self.drop,
            "within_budget": self.within_budget,
            "steps": [s.to_dict() for s in self.steps],
            "sensitivity": None if self.sensitivity is None else self.sensitivity.to_dict(),
            "cost": None if self.cost is None else self.cost.__dict__,
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> str:
        """Indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """What fell back, why, and at what predicted cost."""
        lines = [
            f"FP32 {self.fp32_metric:.4f}, full INT8 {self.full_int8_metric:.4f}, final "
            f"{self.int8_metric:.4f} (drop {self.drop:.4f}, budget {self.max_drop:g}: "
            f"{'within' if self.within_budget else 'NOT within'})",
        ]
        if not self.fallback:
            lines.append("no fallback: every planned point is INT8")
        for s in self.steps:
            why = f"proxy {s.proxy_damage:.3g}"
            if s.confirmed_gain is not None:
                why += f", alone {s.confirmed_gain:+.4f}"
            state = "float" if s.kept else "INT8 (not needed)" if s.restored else "INT8 (no gain)"
            cost = f"; {s.cost.describe()}" if s.cost is not None else ""
            lines.append(f"  {s.unit}: {state}, metric {s.metric:.4f} ({why}){cost}")
        if self.cost is not None:
            lines.append(f"TensorRT cost of the fallback: {self.cost.describe()}")
        return "\n".join(lines)


def agreement_metric(model: nn.Module, eval_data: Iterable[Any]) -> Metric:
    """A metric against ``model``'s own outputs on ``eval_data`` (computed now, once).

    Top-1 agreement (arg-max over dimension 1, per sample and position) when the first output
    has a class dimension (``(N, C, ...)``, ``C >= 2``), else the mean per-sample cosine.
    """
    batches = _reiterable(eval_data, "eval_data")
    expected = expected_inputs(model) if hasattr(model, "qdq_plan") else None
    references = [_first(_run(model, b, i, expected)) for i, b in enumerate(batches)]
    if not references:
        raise ValueError("eval_data holds no batch")
    classes = references[0].dim() >= 2 and references[0].shape[1] >= 2

    def metric(candidate: nn.Module) -> float:
        cand_expected = expected_inputs(candidate) if hasattr(candidate, "qdq_plan") else None
        hits = total = 0.0
        for i, (batch, ref) in enumerate(zip(batches, references, strict=True)):
            out = _first(_run(candidate, batch, i, cand_expected))
            if classes:
                same = out.argmax(dim=1) == ref.argmax(dim=1)
                hits, total = hits + float(same.sum()), total + same.numel()
            else:
                cos = sample_cosines(out, ref)  # scale-invariant at any magnitude
                hits, total = hits + float(cos.sum()), total + cos.numel()
        return hits / total

    return metric


def auto_quantize(
    model: nn.Module,
    example_inputs: Sequence[Any],
    data: Iterable[Any],
    *,
    metric: Metric | None = None,
    max_drop: float = 0.01,
    eval_data: Iterable[Any] | None = None,
    config: QuantConfig | None = None,
    method: str | None = None,
    improve: Improve | None = None,
    candidates: int = 8,
    max_fallback: int | None = None,
    patience: int = 6,
    num_batches: int = 4,
    lint_cost: bool = True,
    exporter: str = "auto",
    target: str = "trt10",
    show_progress: bool = True,
    prepared: nn.Module | None = None,
    fp32_metric: float | None = None,
) -> AutoQuantResult:
    """Quantize ``model`` to INT8, keeping in float only what the ``max_drop`` budget needs.

    Args:
        model: the float model (not modified).
        example_inputs: a tuple of example inputs for :func:`qdq.prepare`.
        data: calibration batches (as :func:`qdq.calibrate` takes them); also the proxy's data.
            Must be re-iterable (a list or a DataLoader, not a generator).
        metric: ``metric(model) -> float``, higher is better, e.g. accuracy on a validation set.
            Default: :func:`agreement_metric` on ``eval_data``.
        max_drop: the largest acceptable ``fp32 - int8`` drop of the metric (its units).
        eval_data: batches for the default metric (default: ``data``).
        config: placement settings (default ``QuantConfig.tensorrt()``); fallbacks are appended
            as exclusions.
        method: calibration method (default: each quantizer's spec, mse).
        improve: called with each calibrated model before it is measured (PTQ steps of
            :mod:`qdq.ptq`).
        candidates: units confirmed with the metric before the greedy search.
        max_fallback: at most this many units tried in the greedy search (default: every unit
            that gained alone or whose proxy damage is positive).
        patience: stop the search after this many units in a row that did not improve the metric.
        num_batches: proxy batches.
        lint_cost: predict the TensorRT cost of the fallback (exports to a temporary directory
            and lints; needs onnx).
        exporter: the exporter for ``lint_cost``.
        target: the TensorRT version for ``lint_cost``.
        show_progress: progress bars.
        prepared: start from this calibrated (and improved) ``qdq.prepare(model, example_inputs,
            config)`` instead of preparing and calibrating again.
        fp32_metric: the float model's metric when already known (else measured).

    Raises:
        ValueError: bad ``max_drop``/``candidates``/``max_fallback``, one-shot or empty data, a
            metric that does not return a finite number.
    """
    start = time.perf_counter()
    if (
        isinstance(max_drop, bool)
        or not isinstance(max_drop, (int, float))
        or not (math.isfinite(max_drop) and max_drop >= 0)
    ):
        raise ValueError(f"max_drop must be a finite number >= 0, got {max_drop!r}")
    for name, value, low in (
        ("candidates", candidates, 0),
        ("num_batches", num_batches, 1),
        ("patience", patience, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if max_fallback is not None and (
        isinstance(max_fallback, bool) or not isinstance(max_fallback, int) or max_fallback < 1
    ):
        raise ValueError(f"max_fallback must be an int >= 1 or None, got {max_fallback!r}")
    data = _reiterable(data, "data")
    cfg = config if config is not None else QuantConfig.tensorrt()
    score = checked_metric(
        metric if metric is not None else agreement_metric(model, eval_data or data)
    )
    if prepared is None:
        prepared = _quantized(model, example_inputs, data, cfg, method, improve, show_progress)
    fp32 = score(model) if fp32_metric is None else float(fp32_metric)
    full = score(prepared)
    if fp32 - full <= max_drop:
        return AutoQuantResult(prepared, (), fp32, full, full, float(max_drop), config=cfg,
                               seconds=time.perf_counter() - start)  # fmt: skip
    proxy = sensitivity(prepared, data, mode="one-off", num_batches=num_batches,
                        show_progress=show_progress)  # fmt: skip
    units = {u.name: u for u in units_of(prepared)}
    confirmed: dict[str, float] = {}
    top = [r.name for r in proxy.rows[:candidates]]
    for name in progress(top, total=len(top), desc="confirming", enabled=show_progress):
        with units_off(prepared, [units[name]]):
            confirmed[name] = score(prepared) - full
    # confirmed gains first, then the proxy order (only units whose float version brings the
    # outputs closer to FP32, and none that lost metric when tried alone)
    order = [n for n in sorted(confirmed, key=lambda n: -confirmed[n]) if confirmed[n] > 0]
    order += [r.name for r in proxy.rows
              if r.damage > 0 and confirmed.get(r.name, 0.0) == 0.0]  # fmt: skip
    if max_fallback is not None:
        order = order[:max_fallback]
    search = _Search(prepared, units, score, fp32, full, max_drop)
    steps, off = search.run(order, proxy, confirmed, patience, show_progress)
    owners = tuple(dict.fromkeys(o for u in off for o in u.owners))
    final_cfg = cfg
    for owner in owners:
        final_cfg = final_cfg.exclude(name=owner)
    final = _quantized(model, example_inputs, data, final_cfg, method, improve, show_progress)
    _check_excluded(final, owners)
    if owners:
        why = "; ".join(
            f"{s.unit} ({', '.join(s.owners)}): metric {s.metric:.4f} with it in float"
            for s in steps
            if s.kept
        )
        _add_note(final, f"auto_quantize kept in float for max_drop={max_drop:g}: {why}")
    final_metric = score(final)
    cost = None
    if lint_cost and off:
        steps, cost = _lint_costs(model, example_inputs, data, cfg, units, steps, exporter, target)
    return AutoQuantResult(
        model=final,
        fallback=owners,
        fp32_metric=fp32,
        int8_metric=final_metric,
        full_int8_metric=full,
        max_drop=float(max_drop),
        steps=tuple(steps),
        config=final_cfg,
        sensitivity=proxy,
        cost=cost,
        seconds=time.perf_counter() - start,
    )


class _Search:
    """The greedy fallback search on one prepared model, by bypassing units."""

    def __init__(
        self,
        prepared: nn.Module,
        units: dict[str, Unit],
        score: Callable[[nn.Module], float],
        fp32: float,
        full: float,
        max_drop: float,
    ) -> None:
        self.prepared, self.units, self.score = prepared, units, score
        self.fp32, self.full, self.max_drop = fp32, full, max_drop

    def metric(self, off: list[Unit]) -> float:
        with units_off(self.prepared, off):
            return self.score(self.prepared)

    def run(
        self,
        order: list[str],
        proxy: Sensitivity,
        confirmed: dict[str, float],
        patience: int,
        show_progress: bool,
    ) -> tuple[list[FallbackStep], list[Unit]]:
        """Forward: add units while the metric does not get worse, until the budget holds or
        ``patience`` units in a row bring no gain. Backward: put back in INT8 every unit the
        budget does not need (budget not met: every unit whose float version gains nothing),
        latest first."""
        damage = {r.name: r.damage for r in proxy.rows}
        steps: list[FallbackStep] = []
        off: list[Unit] = []
        best, idle = self.full, 0
        for name in progress(order, total=len(order), desc="fallback", enabled=show_progress):
            unit = self.units[name]
            got = self.metric([*off, unit])
            kept = got >= best
            idle = 0 if got > best else idle + 1
            if kept:
                off, best = [*off, unit], got
            steps.append(FallbackStep(name, unit.owners, damage[name], confirmed.get(name), got,
                                      kept))  # fmt: skip
            if self.fp32 - best <= self.max_drop or idle >= patience:
                break
        met = self.fp32 - best <= self.max_drop
        for unit in reversed(list(off)):
            rest = [u for u in off if u is not unit]
            got = self.metric(rest)
            if (self.fp32 - got <= self.max_drop) if met else got >= best:
                off = rest
                steps = [replace(s, kept=False, restored=True) if s.unit == unit.name else s
                         for s in steps]  # fmt: skip
        return steps, off


def _quantized(
    model: nn.Module,
    example_inputs: Sequence[Any],
    data: list[Any],
    cfg: QuantConfig,
    method: str | None,
    improve: Improve | None,
    show_progress: bool,
) -> nn.Module:
    prepared = prepare(model, example_inputs, cfg)
    calibrate(prepared, data, method, show_progress=show_progress)
    if improve is not None:
        improve(prepared)
    return prepared


def _add_note(prepared: nn.Module, note: str) -> None:
    plan = plan_of(prepared)
    object.__setattr__(prepared, "qdq_plan", replace(plan, notes=(*plan.notes, note)))


def _check_excluded(prepared: nn.Module, owners: tuple[str, ...]) -> None:
    """Every fallen op is float in the re-planned model (an exclusion that did not match is a bug)."""
    plan = plan_of(prepared)
    still = sorted({p.owner for p in plan.points if p.owner in owners and p.quantized})
    if still:
        raise RuntimeError(
            f"the fallback excluded {still[:5]} but the re-planned model still quantizes them; "
            "please report this with the model"
        )


def _lint_costs(
    model: nn.Module,
    example_inputs: Sequence[Any],
    data: list[Any],
    cfg: QuantConfig,
    units: dict[str, Unit],
    steps: list[FallbackStep],
    exporter: str,
    target: str,
) -> tuple[list[FallbackStep], LintCost]:
    """Lint the full-INT8 plan, the final one and the full one less each kept unit.

    Each is planned with its exclusions (the export checks the graph against its plan, so a
    bypassed quantizer is not an option) and calibrated on one batch by max: the linter reads the
    graph's structure and which scales are equal, not their values.
    """
    from qdq.export import export_onnx
    from qdq.export.blocks_trt import form_for
    from qdq.lint import lint, parse_target

    form = form_for(cfg.format, parse_target(target).max_opset)  # the job's MXFP8 form
    with tempfile.TemporaryDirectory(prefix="qdq-fallback-") as tmp:

        def summary(owners: Iterable[str], name: str) -> dict[str, Any]:
            c = cfg
            for owner in owners:
                c = c.exclude(name=owner)
            prepared = prepare(model, example_inputs, c)
            calibrate(prepared, data, "max", num_batches=1, show_progress=False)
            path = Path(tmp) / f"{name}.onnx"
            export_onnx(prepared, tuple(example_inputs), path, exporter=exporter, verify=False,
                        block_form=form)  # fmt: skip
            return dict(lint(path, target=target).summary)

        base = summary((), "full")
        out = []
        for i, s in enumerate(steps):
            if s.kept:
                s = replace(s, cost=LintCost.between(base, summary(s.owners, f"unit{i}")))
            out.append(s)
        kept = [o for s in steps if s.kept for o in s.owners]
        total = LintCost.between(base, summary(kept, "final"))
    return out, total


def _reiterable(data: Iterable[Any] | None, what: str) -> list[Any]:
    if data is None:
        raise ValueError(f"{what} is required")
    if iter(data) is data:
        raise ValueError(
            f"{what} is a one-shot iterator; pass a list of batches or a DataLoader (it is read "
            "several times)"
        )
    batches = list(data)
    if not batches:
        raise ValueError(f"{what} holds no batch")
    return batches


def _run(model: nn.Module, batch: Any, index: int, expected: Any) -> Any:
    with eval_no_grad(model):
        if expected is not None:
            return run_batch(model, batch, index, expected)
        if isinstance(batch, torch.Tensor):
            return model(batch)
        if isinstance(batch, (tuple, list)) and batch:
            return model(batch[0])
        if isinstance(batch, dict):
            return model(**batch)
        raise TypeError(
            f"a batch must be a tensor, an (x, y) pair or a dict, got {type(batch).__name__}"
        )


def _first(output: Any) -> torch.Tensor:
    leaves = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    if not leaves:
        raise ValueError(f"the model returned no tensor (got {type(output).__name__})")
    return leaves[0].detach().float()
