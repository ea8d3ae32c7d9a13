"""``layer_errors``: the accumulated and isolated error of every activation quantizer, in one pass."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import plan_of, quantizers_of
from qdq.calib.batches import expected_inputs, run_batch
from qdq.debug.stats import ErrorStats, Histogram, finite
from qdq.debug.taps import Taps, int8_modes, is_weight
from qdq.quant import Quantizer, QuantMode, quantizer_mode

__all__ = ["HISTOGRAM_BINS", "LayerError", "LayerErrors", "WeightError", "layer_errors"]

#: bins kept per histogram (the calibrator's are merged into at most this many)
HISTOGRAM_BINS = 128


@dataclass(frozen=True)
class LayerError:
    """The error at one activation quantizer (one scale group: every point that shares it).

    Attributes:
        name: the quantizer's name, i.e. its group leader's point (``"layer1.conv1:input"``).
        quantizer: the quantizer's module path in the prepared model.
        owner, op: the leader point's op (``"layer1.conv1"``, ``"conv"``).
        members: every point of the scale group.
        rule: the rule that quantized the leader.
        order: position of the quantizer's first call in the forward (execution order).
        amax: the amax in use (``None`` for a per-channel activation quantizer).
        accumulated: the INT8 model's tensor after this Q/DQ vs the FP32 tensor.
        clipped: fraction of FP32 values with ``|x| > amax``.
        upstream: the tensor arriving at the quantizer in the INT8 model (before its Q/DQ) vs
            FP32: the error made upstream (``accumulated`` minus this is the point's own share).
        output: the output of ``owner`` when it is a module, INT8 vs FP32 (weights, input and
            everything upstream quantized); ``None`` otherwise.
        weight: the fake-quantized weight of ``owner`` vs its float weight, when it has one.
        isolated: only this point quantized: this Q/DQ applied to the FP32 tensor (everything
            upstream float), against that tensor. ``accumulated`` far below ``isolated`` means the
            damage comes from upstream; close to it, from this point's own scale.
        histogram: for the worst points, the calibration histogram and every method's amax.
    """

    name: str
    quantizer: str
    owner: str
    op: str
    members: tuple[str, ...]
    rule: str
    order: int
    amax: float | None
    accumulated: ErrorStats
    clipped: float | None = None
    upstream: ErrorStats | None = None
    output: ErrorStats | None = None
    weight: ErrorStats | None = None
    isolated: ErrorStats | None = None
    histogram: Histogram | None = None

    @property
    def score(self) -> float:
        """The ranking key: accumulated SQNR in dB (lower is worse)."""
        return self.accumulated.sqnr_db

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        out: dict[str, Any] = {}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if isinstance(value, (ErrorStats, Histogram)):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float):
                value = finite(value)
            out[key] = value
        return out


@dataclass(frozen=True)
class WeightError:
    """One quantized weight: fake-quantized vs float."""

    name: str
    quantizer: str
    owner: str
    error: ErrorStats

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {**asdict(self), "error": self.error.to_dict()}


@dataclass(frozen=True)
class LayerErrors:
    """Result of :func:`layer_errors`: ``rows`` worst first (lowest accumulated SQNR)."""

    rows: tuple[LayerError, ...]
    weights: tuple[WeightError, ...]
    output: ErrorStats | None
    batches: int
    samples: int
    notes: tuple[str, ...] = ()

    def row(self, name: str) -> LayerError:
        """The row of quantizer ``name`` (or module path)."""
        for r in self.rows:
            if name in (r.name, r.quantizer):
                return r
        raise KeyError(f"no quantizer {name!r}; known: {[r.name for r in self.rows][:8]}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: ``batches``, ``samples``, ``output``, ``rows``, ``weights``, ``notes``."""
        return {
            "batches": self.batches,
            "samples": self.samples,
            "output": None if self.output is None else self.output.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "weights": [w.to_dict() for w in self.weights],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """Indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self, top: int | None = 10) -> str:
        """A table of the worst ``top`` rows (all with ``None``)."""
        rows = self.rows if top is None else self.rows[:top]
        width = max([len(r.name) for r in rows] + [5])
        lines = [
            f"layer errors on {self.samples} samples ({self.batches} batches), worst first",
            f"{'point':<{width}}  {'SQNR dB':>8}  {'isolated':>8}  {'cosine':>8}  {'clipped':>8}"
            f"  {'weight dB':>9}",
        ]
        for r in rows:
            clipped = "-" if r.clipped is None else f"{100 * r.clipped:.3f}%"
            weight = "-" if r.weight is None else f"{r.weight.sqnr_db:.1f}"
            iso = "-" if r.isolated is None else f"{r.isolated.sqnr_db:.2f}"
            lines.append(
                f"{r.name:<{width}}  {r.accumulated.sqnr_db:>8.2f}  {iso:>8}"
                f"  {r.accumulated.cosine:>8.5f}  {clipped:>8}  {weight:>9}"
            )
        if self.output is not None:
            lines.append(f"model output: SQNR {self.output.sqnr_db:.2f} dB, cosine "
                         f"{self.output.cosine:.6f}")  # fmt: skip
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def layer_errors(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    num_batches: int = 4,
    histograms: int = 6,
    show_progress: bool = False,
) -> LayerErrors:
    """Measure the accumulated error of every activation quantizer in one pass over ``data``.

    The model must be calibrated. The INT8 run uses the quantizers as they are (a quantizer set to
    ``"bypass"`` stays float; one left calibrating quantizes); modes and train/eval mode are
    restored afterwards.

    Args:
        prepared: a calibrated model from :func:`qdq.prepare`.
        data: batches as :func:`qdq.calibrate` takes them (tensors, ``(x, y)`` tuples, dicts).
        num_batches: batches used (a few suffice: the sums converge fast).
        histograms: how many of the worst points get their calibration histogram.
        show_progress: a progress bar.

    Returns:
        :class:`LayerErrors`, rows sorted worst first.

    Raises:
        ValueError: ``prepared`` is not from :func:`qdq.prepare`, a quantizer has no amax, bad
            ``num_batches``/``histograms``, or ``data`` holds no batch.
    """
    plan = plan_of(prepared)
    for what, value, low in (("num_batches", num_batches, 1), ("histograms", histograms, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{what} must be an int >= {low}, got {value!r}")
    quantizers = quantizers_of(prepared)
    missing = [p for p, q in quantizers.items() if not q.is_calibrated]
    if missing:
        raise ValueError(f"quantizers without amax: {missing[:5]}; run qdq.calibrate first")
    groups = {g.quantizer: g for g in plan.groups}
    points = {p.name: p for p in plan.points}
    owners = {
        path: points[groups[path].leader].owner
        for path in quantizers
        if path in groups and not is_weight(quantizers[path])
    }
    modules = dict(prepared.named_modules())
    taps = Taps(
        quantizers,
        {o: modules[o] for o in set(owners.values()) if o and o in modules},
        prepared,
    )
    expected = expected_inputs(prepared)
    seen = 0
    with taps, eval_no_grad(prepared):
        for batch in progress(data, total=num_batches, desc="layer errors", enabled=show_progress):
            taps.phase = "fp32"
            with quantizer_mode(prepared, QuantMode.BYPASS):
                run_batch(prepared, batch, seen, expected)
            taps.phase = "int8"
            with int8_modes(quantizers):
                run_batch(prepared, batch, seen, expected)
            taps.compare()
            seen += 1
            if seen >= num_batches:
                break
    if seen == 0:
        raise ValueError("layer_errors saw no batches: the data is empty")
    return _result(plan, quantizers, owners, taps, seen, histograms)


def _result(
    plan: Any,
    quantizers: dict[str, Quantizer],
    owners: dict[str, str],
    taps: Taps,
    seen: int,
    histograms: int,
) -> LayerErrors:
    groups = {g.quantizer: g for g in plan.groups}
    weights = tuple(
        WeightError(q.name, path, plan.point(q.name).owner, taps.sums[path].stats())
        for path, q in quantizers.items()
        if is_weight(q) and path in taps.sums
    )
    weight_of = {w.owner: w.error for w in weights}
    rows = []
    for path, owner in owners.items():
        q, sums = quantizers[path], taps.sums.get(path)
        if sums is None:
            continue  # never called on this data
        leader = plan.point(groups[path].leader)
        per_tensor = q.amax.numel() == 1
        out = taps.sums.get(f"module:{owner}")
        upstream = taps.sums.get(f"in:{path}")
        isolated = taps.sums.get(f"iso:{path}")
        rows.append(
            LayerError(
                name=q.name,
                quantizer=path,
                owner=owner,
                op=leader.op,
                members=groups[path].members,
                rule=leader.rule,
                order=taps.order.index(path),
                amax=float(q.amax) if per_tensor else None,
                accumulated=sums.stats(),
                clipped=sums.clipped / sums.numel if per_tensor and sums.numel else None,
                upstream=None if upstream is None else upstream.stats(),
                isolated=None if isolated is None else isolated.stats(),
                output=None if out is None else out.stats(),
                weight=weight_of.get(owner),
            )
        )
    rows.sort(key=lambda r: (math.isnan(r.score), r.score, r.order))
    with_hist = [_with_histogram(r, quantizers[r.quantizer]) for r in rows[:histograms]]
    unreached = sorted(set(owners) - set(taps.sums))
    notes = list(taps.notes)
    if unreached:
        notes.append(f"{len(unreached)} quantizer(s) were not called on this data: {unreached[:5]}")
    model_out = taps.sums.get("model:output")
    return LayerErrors(
        rows=tuple(with_hist + rows[histograms:]),
        weights=weights,
        output=None if model_out is None else model_out.stats(),
        batches=seen,
        samples=taps.samples,
        notes=tuple(notes),
    )


def _with_histogram(row: LayerError, q: Quantizer) -> LayerError:
    """``row`` with its quantizer's calibration histogram (unchanged without one)."""
    cal = q.calibrator
    hist = getattr(cal, "histogram", None)
    if hist is None or cal.num_batches == 0 or row.amax is None:
        return row
    counts, edges = hist()
    factor = max(1, -(-len(counts) // HISTOGRAM_BINS))
    padded = np.zeros(-(-len(counts) // factor) * factor, dtype=np.int64)
    padded[: len(counts)] = counts
    merged = padded.reshape(-1, factor).sum(axis=1)
    methods = {}
    for m in cal.methods:
        pct = q.calib.percentile if m == "percentile" else None
        methods[m] = float(cal.compute_amax(m, percentile=pct))
    # the method in use: recorded by the quantizer when it computed its amax
    used = q.amax_method if q.amax_method in methods else None
    histogram = Histogram(
        bin_width=float(edges[1] - edges[0]) * factor,
        counts=tuple(int(c) for c in merged),
        observed_max=float(getattr(cal, "observed_max", edges[-1])),
        amax=row.amax,
        method=used if used is not None else str(q.amax_method or q.calib.method),
        methods=methods,
    )
    return LayerError(**{**row.__dict__, "histogram": histogram})
