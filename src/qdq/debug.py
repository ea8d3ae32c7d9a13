"""Per-layer quantization error: where the fake-quant model departs from FP32, and why.

:func:`layer_errors` runs a few batches through the prepared model twice each — every quantizer
bypassed (the FP32 model) and the quantizers as they are set (the INT8 model as it is exported) — and,
at every activation quantizer, compares the tensor its consumers read in the INT8 model (everything
upstream quantized, then this Q/DQ) with the same tensor in the FP32 model. That is the
*accumulated* error of the point. Also measured: the output of the quantizer's layer when it is a
module (``nn.Conv2d``, ``nn.Linear`` ...), the error of every quantized weight, the model's first
output, the fraction of FP32 values beyond ``amax`` (clipped), and, for the worst points, the
calibration histogram of ``|x|`` with the amax of every calibration method.

Errors are summed over every call of a quantizer and every batch, as

* ``sqnr_db`` = 10·log10(Σx² / Σ(x − y)²) (higher is better; ``inf`` when identical);
* ``cosine`` = Σxy / √(Σx²·Σy²) over the whole tensor;
* ``rel_mse`` = Σ(x − y)² / Σx² (= 10^(−SQNR/10)).

The *isolated* error of a point (only this point quantized) is left to a later pass
(``LayerError.isolated`` is ``None`` here).

Example:
    >>> import torch, qdq
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3)
    ... )
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(4, 3, 12, 12) for _ in range(3)]
    >>> _ = qdq.calibrate(m, data, show_progress=False)
    >>> errors = layer_errors(m, data)
    >>> [r.name for r in errors.rows]  # worst first
    ['2:input', '0:input']
    >>> errors.rows[0].accumulated.sqnr_db > 20, errors.rows[0].weight.sqnr_db > 40
    (True, True)
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import plan_of, quantizers_of
from qdq.calib.batches import expected_inputs, run_batch
from qdq.quant import Quantizer, QuantMode, quantizer_mode

__all__ = ["ErrorStats", "Histogram", "LayerError", "LayerErrors", "WeightError", "layer_errors"]

#: bins kept per histogram (the calibrator's are merged into at most this many)
HISTOGRAM_BINS = 128


@dataclass(frozen=True)
class ErrorStats:
    """How far a tensor ``y`` is from its FP32 reference ``x`` (summed over every element).

    Attributes:
        sqnr_db: 10·log10(Σx² / Σ(x − y)²); ``inf`` when ``y == x``.
        cosine: Σxy / √(Σx²·Σy²).
        rel_mse: Σ(x − y)² / Σx².
        numel: elements compared.

    Example:
        >>> s = ErrorStats.between(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]))
        >>> round(s.sqnr_db, 1), round(s.rel_mse, 4)
        (27.0, 0.002)
    """

    sqnr_db: float
    cosine: float
    rel_mse: float
    numel: int

    @staticmethod
    def between(reference: torch.Tensor, other: torch.Tensor) -> ErrorStats:
        """The error of ``other`` against ``reference``."""
        acc = _Sums()
        acc.add(reference, other)
        return acc.stats()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (a non-finite number is ``null``)."""
        return {k: _finite(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Histogram:
    """The calibration histogram of ``|x|`` of one quantizer and the amax each method picks.

    ``counts[i]`` counts values in ``[i·bin_width, (i+1)·bin_width)``; ``amax`` is the one in use
    (``method``), ``methods`` the amax of every method the calibrator computes from the same data.
    """

    bin_width: float
    counts: tuple[int, ...]
    observed_max: float
    amax: float
    method: str
    methods: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable."""
        return {**asdict(self), "counts": list(self.counts)}


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
        isolated: only this point quantized (not measured by :func:`layer_errors`: ``None``).
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
                value = _finite(value)
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
            f"{'point':<{width}}  {'SQNR dB':>8}  {'cosine':>8}  {'clipped':>8}  {'weight dB':>9}",
        ]
        for r in rows:
            clipped = "-" if r.clipped is None else f"{100 * r.clipped:.3f}%"
            weight = "-" if r.weight is None else f"{r.weight.sqnr_db:.1f}"
            lines.append(
                f"{r.name:<{width}}  {r.accumulated.sqnr_db:>8.2f}  {r.accumulated.cosine:>8.5f}"
                f"  {clipped:>8}  {weight:>9}"
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
        if path in groups and not _is_weight(quantizers[path])
    }
    modules = dict(prepared.named_modules())
    taps = _Taps(
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
            with _int8_modes(quantizers):
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
    taps: _Taps,
    seen: int,
    histograms: int,
) -> LayerErrors:
    groups = {g.quantizer: g for g in plan.groups}
    weights = tuple(
        WeightError(q.name, path, plan.point(q.name).owner, taps.sums[path].stats())
        for path, q in quantizers.items()
        if _is_weight(q) and path in taps.sums
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


class _Sums:
    """Running Σx², Σy², Σxy, Σ(x−y)² in float64, and the count of clipped reference values."""

    def __init__(self) -> None:
        self.xx = self.yy = self.xy = self.ee = 0.0
        self.numel = self.clipped = 0

    def add(self, x: torch.Tensor, y: torch.Tensor, amax: torch.Tensor | None = None) -> None:
        x64, y64 = x.detach().double().flatten(), y.detach().double().flatten()
        self.xx += float(x64 @ x64)
        self.yy += float(y64 @ y64)
        self.xy += float(x64 @ y64)
        self.ee += float(((x64 - y64) ** 2).sum())
        self.numel += x64.numel()
        if amax is not None and amax.numel() == 1:
            self.clipped += int((x.detach().abs() > amax).sum())

    def stats(self) -> ErrorStats:
        if self.ee == 0.0:
            sqnr = math.inf
        elif self.xx == 0.0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.xx / self.ee)
        norm = math.sqrt(self.xx * self.yy)
        cosine = self.xy / norm if norm > 0 else (1.0 if self.xx == self.yy else 0.0)
        rel = self.ee / self.xx if self.xx > 0 else (0.0 if self.ee == 0 else math.inf)
        return ErrorStats(sqnr, cosine, rel, self.numel)


class _Taps:
    """Forward hooks: the FP32 pass stores tensors, the INT8 pass is compared with them.

    Quantizer hooks copy their tensor at once (the tracker of :mod:`qdq.graph.calls` does not
    count torch calls made inside a quantizer). Module hooks only keep a reference (no torch call
    there, so the tracker's call ordinals are untouched); they are compared after the forward.
    """

    def __init__(
        self, quantizers: dict[str, Quantizer], modules: dict[str, nn.Module], root: nn.Module
    ) -> None:
        self.quantizers, self.modules, self.root = quantizers, modules, root
        self.phase = "fp32"
        self.sums: dict[str, _Sums] = {}
        self.order: list[str] = []
        self.samples = 0
        self.notes: list[str] = []
        self._fp32: dict[str, list[torch.Tensor]] = {}
        self._int8: dict[str, list[torch.Tensor]] = {}
        self._calls: dict[str, int] = {}  # INT8 calls of each activation quantizer, this batch
        self._handles: list[Any] = []

    def __enter__(self) -> _Taps:
        for path, q in self.quantizers.items():
            self._handles.append(q.register_forward_hook(self._quantizer_hook(path)))
        for path, m in self.modules.items():
            self._handles.append(m.register_forward_hook(self._keep(f"module:{path}")))
        self._handles.append(self.root.register_forward_hook(self._root_hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _quantizer_hook(self, path: str) -> Any:
        weight = _is_weight(self.quantizers[path])

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, torch.Tensor):
                return
            if weight:  # the float weight is the input; compared once
                if self.phase == "int8" and path not in self.sums:
                    self._sums(path).add(args[0], output)
            elif self.phase == "fp32":
                if path not in self.order:
                    self.order.append(path)
                self._fp32.setdefault(path, []).append(output.detach().clone())
            else:
                calls = self._fp32.get(path, [])
                k = self._calls.get(path, 0)
                self._calls[path] = k + 1
                if k < len(calls) and calls[k].shape == output.shape:
                    self._sums(path).add(calls[k], output, self.quantizers[path].amax)
                    self._sums(f"in:{path}").add(calls[k], args[0])
                    calls[k] = calls[k].new_empty(0)  # free the FP32 copy early
                else:
                    self._note(f"{path}: its calls differ between the FP32 and INT8 runs")

        return hook

    def _keep(self, key: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            store = self._fp32 if self.phase == "fp32" else self._int8
            store.setdefault(key, []).append(output)

        return hook

    def _root_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        self._keep("model:output")(module, args, output)
        if self.phase == "fp32":
            leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            self.samples += int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1

    def compare(self) -> None:
        """After the INT8 pass: compare the kept module outputs; drop the batch's tensors."""
        for key, ref in self._fp32.items():
            if not key.startswith(("module:", "model:")):
                if self._calls.get(key, 0) != len(ref):
                    self._note(f"{key}: its calls differ between the FP32 and INT8 runs")
                continue
            got = self._int8.get(key, [])
            for a, b in zip(ref, got, strict=False):
                x, y = _first_tensor(a), _first_tensor(b)
                if x is not None and y is not None and x.shape == y.shape:
                    self._sums(key).add(x, y)
            if len(got) != len(ref):
                self._note(f"{key}: its calls differ between the FP32 and INT8 runs")
        self._fp32.clear()
        self._int8.clear()
        self._calls.clear()

    def _sums(self, key: str) -> _Sums:
        return self.sums.setdefault(key, _Sums())

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _first_tensor(value: Any) -> torch.Tensor | None:
    return next((t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)), None)


def _is_weight(q: Quantizer) -> bool:
    return q.name.endswith(":weight")


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


@contextlib.contextmanager
def _int8_modes(quantizers: dict[str, Quantizer]) -> Iterator[None]:
    """The INT8 model as the user set it up: calibrating quantizers quantize, bypassed ones stay."""
    saved = {path: q.mode for path, q in quantizers.items()}
    try:
        for q in quantizers.values():
            if q.mode is QuantMode.CALIBRATE:
                q.mode = QuantMode.QUANTIZE
        yield
    finally:
        for path, q in quantizers.items():
            q.mode = saved[path]
