"""The calibration method chosen per quantizer, from the same histograms, by its layer's error.

:func:`qdq.calibrate` sets every activation amax by one method. The best method differs from layer
to layer: ``max`` for a tensor without outliers, a percentile or ``mse`` where a few outliers
would crush the scale, ``entropy`` where the tail carries little. :func:`choose_methods` takes
every amax the quantizer's calibrator computes from the histogram it already collected (no new
calibration pass) and keeps, per quantizer, the one whose *layer output* is closest to FP32:

* for an input of a weighted layer (Conv, ConvTranspose, Linear, a MatMul with a parameter; module
  or functional, any ``groups``, every call of a module called several times, a quantizer moved in
  front of the layer's zero Pad by rule P08): the layer's output
  with this input fake-quantized by the candidate amax and its weight fake-quantized as exported,
  against the FP32 output, on the FP32 input (isolated: upstream stays float);
* for any other consumer (Add, Concat, pooling, an activation MatMul ...): the Q/DQ'd tensor
  against the FP32 tensor;
* for a scale group (one quantizer at several points, or a layer called several times): the sum
  over every point and call.

The error is the MSE (Σ in float64 over a few batches; relative MSE and SQNR rank the candidates
of one layer alike). The amax the quantizer started from is a candidate too, and ties keep it, so
on the measured data no layer gets worse. The winner's method is recorded on the quantizer
(``amax_method``/``amax_percentile``), so the export manifest, :func:`qdq.load_calibration` and the
reports say which method each quantizer uses.

Example:
    >>> import torch, qdq
    >>> from qdq.ptq.methods import choose_methods
    >>> _ = torch.manual_seed(0)
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3)
    ... ).eval()
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> data = [torch.randn(4, 3, 12, 12) for _ in range(3)]
    >>> _ = qdq.calibrate(m, data, method="max", show_progress=False)
    >>> choice = choose_methods(m, data, num_batches=2)
    >>> [(r.quantizer, r.started) for r in choice.rows]
    [('0.input_quantizer', 'max'), ('2.input_quantizer', 'max')]
    >>> all(r.errors[r.chosen] <= r.errors[r.started] for r in choice.rows)
    True
    >>> m[2].input_quantizer.amax_method == choice.row("2:input").chosen.split()[0]
    True
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._modes import eval_no_grad
from qdq._progress import progress
from qdq.api import plan_of, quantizers_of
from qdq.calib.batches import batch_samples, expected_inputs, run_batch
from qdq.config import CALIBRATION_METHODS
from qdq.debug.stats import finite, finite_fields
from qdq.graph.runtime import runtime_of
from qdq.ptq._layer_calls import LayerCall, LayerCalls, fake_quantize, is_weight_quantizer
from qdq.ptq.report import StepReport
from qdq.quant import Quantizer, QuantMode, quantizer_mode

__all__ = ["DEFAULT_CANDIDATES", "MethodChoice", "MethodRow", "choose_methods"]

#: ``(method, percentile)`` pairs tried for every quantizer (the one it started from is added)
DEFAULT_CANDIDATES: tuple[tuple[str, float | None], ...] = (
    ("max", None),
    ("entropy", None),
    ("mse", None),
    ("percentile", 99.9),
    ("percentile", 99.99),
    ("percentile", 99.999),
)

LAYER_OUTPUT, TENSOR = "layer output", "tensor"


def method_label(method: str, percentile: float | None = None) -> str:
    """``"mse"``, ``"percentile 99.99"`` ...: a method as rows and summaries name it.

    Example:
        >>> method_label("percentile", 99.99), method_label("entropy")
        ('percentile 99.99', 'entropy')
    """
    return f"percentile {percentile:g}" if method == "percentile" and percentile else method


@dataclass(frozen=True)
class MethodRow:
    """The method choice of one activation quantizer.

    Attributes:
        name: the quantizer's name, its scale group leader's point (``"layer1.conv1:input"``).
        quantizer: its module path in the prepared model.
        owner: the leader point's op (``"layer1.conv1"``, ``"layer1.add"``).
        started: the method of the amax it had (``"mse"``, ``"percentile 99.99"``).
        chosen: the method of the amax it has now (``started`` when nothing was better).
        errors: the MSE of every candidate, by method (the measure is :attr:`measured`).
        gain_db: the SQNR gain of ``chosen`` over ``started`` (10·log10 of their MSE ratio).
        amax_started, amax_chosen: the two amax values.
        measured: ``"layer output"``, ``"tensor"`` or ``"layer output + tensor"`` (a scale group
            read by a weighted layer and by another op).
        note: why a layer was measured on its tensor instead of its output, if it was.
    """

    name: str
    quantizer: str
    owner: str
    started: str
    chosen: str
    errors: dict[str, float]
    gain_db: float
    amax_started: float
    amax_chosen: float
    measured: str
    note: str = ""

    @property
    def changed(self) -> bool:
        """Whether the quantizer now uses another method than it started with."""
        return self.chosen != self.started

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (a non-finite number is ``null``)."""
        out = finite_fields(self)
        out["errors"] = {k: finite(v) for k, v in self.errors.items()}
        return out


@dataclass(frozen=True)
class MethodChoice(StepReport):
    """Result of :func:`choose_methods`: one row per activation quantizer measured.

    Attributes:
        rows: in the order of the prepared model's quantizers.
        batches, samples: the data measured on.
        candidates: the candidate methods (besides each quantizer's own).
        skipped: quantizers left as they were without measuring (see ``notes``).
        notes: why quantizers were skipped or measured on their tensor.
    """

    rows: tuple[MethodRow, ...]
    batches: int
    samples: int
    candidates: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    key: ClassVar[str] = "method_per_quantizer"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("quantizer", lambda r: r.name),
        ("started", lambda r: r.started),
        ("chosen", lambda r: r.chosen),
        ("gain dB", lambda r: f"{r.gain_db:.2f}"),
        ("MSE started", lambda r: f"{r.errors[r.started]:.4g}"),
        ("MSE chosen", lambda r: f"{r.errors[r.chosen]:.4g}"),
        ("measured", lambda r: str(r.measured)),
    )

    @property
    def changed(self) -> tuple[MethodRow, ...]:
        """The rows whose method changed."""
        return tuple(r for r in self.rows if r.changed)

    def summary(self) -> str:
        """``"method per quantizer: 3 of 7 changed; mse 4, max 2, percentile 99.9 1"``."""
        counts = Counter(r.chosen for r in self.rows)
        text = f"method per quantizer: {len(self.changed)} of {len(self.rows)} changed"
        if counts:
            text += "; " + ", ".join(f"{m} {n}" for m, n in counts.most_common())
        if self.skipped:
            text += f"; {len(self.skipped)} skipped"
        return text

    def row(self, name: str) -> MethodRow:
        """The row of quantizer ``name`` (its point name or module path)."""
        for r in self.rows:
            if name in (r.name, r.quantizer):
                return r
        raise KeyError(f"no quantizer {name!r}; known: {[r.name for r in self.rows][:8]}")

    def fields(self) -> dict[str, Any]:
        """The summary, the data measured on and the candidates."""
        return {
            "summary": self.summary(),
            "batches": self.batches,
            "samples": self.samples,
            "candidates": list(self.candidates),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (the rows, then the skipped quantizers and the notes)."""
        out = super().to_dict()
        notes = out.pop("notes")
        return {**out, "skipped": list(self.skipped), "notes": notes}

    def format(self, top: int | None = 10) -> str:
        """A table of the ``top`` rows with the largest gain (all with ``None``)."""
        ranked = sorted(self.rows, key=lambda r: -r.gain_db)
        return self._table(ranked if top is None else ranked[:top])


def choose_methods(
    prepared: nn.Module,
    data: Iterable[Any],
    *,
    candidates: Sequence[tuple[str, float | None]] | None = None,
    num_batches: int = 4,
    show_progress: bool = False,
) -> MethodChoice:
    """Set every activation quantizer's amax by the method that gives its layer the least error.

    ``prepared`` must be calibrated by :func:`qdq.calibrate` (its histograms are reused, nothing
    is recalibrated). One FP32 forward per batch (every quantizer bypassed) captures each
    quantizer's layer calls; every candidate is then evaluated on them without running the model
    again (see the module docstring for what is measured). Quantizers whose calibrator has no
    histogram (``calibrator="max"``), that collected nothing, that are set to bypass, or that the
    data never reaches are skipped with a note. Quantizer modes and train/eval mode are restored;
    amax values change only after every batch was measured.

    Args:
        prepared: a model from :func:`qdq.prepare`, calibrated by :func:`qdq.calibrate`.
        data: batches as :func:`qdq.calibrate` takes them (tensors, ``(x, y)`` tuples, dicts).
        candidates: ``(method, percentile or None)`` pairs; default :data:`DEFAULT_CANDIDATES`
            (max, entropy, mse, percentile 99.9 / 99.99 / 99.999). The amax each quantizer
            started from is always a candidate.
        num_batches: batches measured (a few suffice).
        show_progress: a progress bar.

    Returns:
        :class:`MethodChoice`: a row per quantizer with every candidate's error.

    Raises:
        ValueError: ``prepared`` is not from :func:`qdq.prepare`, it is not calibrated (an
            activation quantizer has no amax, or no calibrator holds statistics), a bad
            ``candidates`` entry or ``num_batches``, or ``data`` holds no batch.
        TypeError: ``data`` is not an iterable of batches, or a candidate is not a pair.
    """
    plan = plan_of(prepared)
    runtime = runtime_of(prepared)
    if runtime is None:
        raise ValueError(f"{type(prepared).__name__} has no qdq runtime: use qdq.prepare")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    pairs = _check_candidates(candidates)
    if not isinstance(data, Iterable):
        raise TypeError(
            f"data must be an iterable of batches, got {type(data).__name__} "
            "(a forward_loop callable cannot be measured batch by batch)"
        )
    quantizers = quantizers_of(prepared)
    acts = {p: q for p, q in quantizers.items() if not is_weight_quantizer(q)}
    missing = [p for p, q in acts.items() if not q.is_calibrated]
    if missing:
        raise ValueError(f"quantizers without amax: {missing[:5]}; run qdq.calibrate first")
    if acts and not any(q.calibrator.num_batches for q in acts.values()):
        raise ValueError(
            "no activation quantizer holds calibration statistics: run qdq.calibrate first "
            "(qdq.load_calibration restores amax values, not the histograms they came from)"
        )
    modes = {q: q.mode for q in quantizers.values()}
    targets, skipped = _targets(acts, pairs, modes)
    notes = [f"{path}: {why}" for path, why in skipped.items()]
    seen = samples = 0
    if targets:
        by_q = {t.q: t for t in targets.values()}
        capture = LayerCalls(prepared, runtime, set(by_q))
        expected = expected_inputs(prepared)
        handles = capture.install()
        try:
            with eval_no_grad(prepared), quantizer_mode(prepared, QuantMode.BYPASS):
                for batch in progress(
                    data, total=num_batches, desc="choosing methods", enabled=show_progress
                ):
                    run_batch(prepared, batch, seen, expected)
                    calls, capture.calls = capture.calls, []
                    _measure(calls, by_q, modes)
                    seen += 1
                    samples += batch_samples(batch)
                    if seen >= num_batches:
                        break
        finally:
            for h in handles:
                h.remove()
        if seen == 0:
            raise ValueError("choose_methods saw no batches: the data is empty")
    groups = {g.quantizer: g for g in plan.groups}
    rows = []
    for path, t in targets.items():
        if t.numel == 0:
            skipped[path] = "not reached on this data; kept its amax"
            notes.append(f"{path}: {skipped[path]}")
            continue
        group = groups.get(path)
        owner = plan.point(group.leader).owner if group is not None else ""
        rows.append(t.choose(owner))
    return MethodChoice(
        rows=tuple(rows),
        batches=seen,
        samples=samples,
        candidates=tuple(method_label(m, p) for m, p in pairs),
        skipped=tuple(skipped),
        notes=tuple(notes),
    )


class _Target:
    """One quantizer being measured: its candidates and the running squared errors."""

    def __init__(self, path: str, q: Quantizer, labels: dict[str, tuple[str, float | None, float]]):
        self.path, self.q = path, q
        #: label → (method, percentile, amax); the started amax first
        self.labels = labels
        self.started = next(iter(labels))
        self.amaxes = sorted({a for _, _, a in labels.values()})
        self.sums = dict.fromkeys(self.amaxes, 0.0)
        self.numel = 0
        self.measured: set[str] = set()
        self.notes: list[str] = []

    def choose(self, owner: str) -> MethodRow:
        """Pick the best candidate (ties keep the first: the started amax), set it, report it."""
        errors = {label: self.sums[a] / self.numel for label, (_, _, a) in self.labels.items()}
        chosen = self.started
        for label, err in errors.items():
            if err < errors[chosen]:
                chosen = label
        method, pct, amax = self.labels[chosen]
        if chosen != self.started:
            self.q.set_amax(amax)
            self.q.amax_method, self.q.amax_percentile = method, pct
        e0, e1 = errors[self.started], errors[chosen]
        gain = 0.0 if e0 == e1 else (math.inf if e1 == 0 else 10.0 * math.log10(e0 / e1))
        return MethodRow(
            name=self.q.name,
            quantizer=self.path,
            owner=owner,
            started=self.started,
            chosen=chosen,
            errors=errors,
            gain_db=gain,
            amax_started=self.labels[self.started][2],
            amax_chosen=amax,
            measured=" + ".join(m for m in (LAYER_OUTPUT, TENSOR) if m in self.measured),
            note="; ".join(self.notes),
        )

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _targets(
    acts: dict[str, Quantizer],
    pairs: tuple[tuple[str, float | None], ...],
    modes: dict[Quantizer, QuantMode],
) -> tuple[dict[str, _Target], dict[str, str]]:
    """The quantizers to measure with their candidate amax values, and the skipped ones (why)."""
    targets: dict[str, _Target] = {}
    skipped: dict[str, str] = {}
    for path, q in acts.items():
        cal = q.calibrator
        usable = [(m, p) for m, p in pairs if m in cal.methods]
        why = None
        if modes[q] is QuantMode.BYPASS:
            why = "set to bypass (stays float)"
        elif q.fixed_amax:
            why = f"a fixed amax ({float(q.amax):g}, data-independent); kept it"
        elif q.amax.numel() != 1:
            why = "per-channel activation quantizer (its calibrator has no histogram)"
        elif not any(m != "max" for m, _ in usable):
            why = f"its calibrator ({type(cal).__name__}) has no histogram; kept its amax"
        elif cal.num_batches == 0:
            why = "collected no calibration data; kept its amax"
        if why is not None:
            skipped[path] = why
            continue
        started = method_label(q.amax_method or "unknown", q.amax_percentile)
        labels = {started: (q.amax_method or "unknown", q.amax_percentile, float(q.amax))}
        for m, p in usable:
            label = method_label(m, p)
            if label not in labels:
                labels[label] = (m, p, float(cal.compute_amax(m, percentile=p)))
        if max(a for _, _, a in labels.values()) <= 0.0:
            skipped[path] = "saw only zeros (every amax is 0); kept its amax"
            continue
        targets[path] = _Target(path, q, labels)
    return targets, skipped


def _measure(
    calls: list[LayerCall], by_q: dict[Quantizer, _Target], modes: dict[Quantizer, QuantMode]
) -> None:
    """Add every candidate's squared error on one batch's calls."""
    for call in calls:
        if call.superseded:
            continue
        t = by_q[call.quantizer]
        if call.func is not None and call.output is not None:
            try:
                errors = _output_errors(call.with_others_quantized(modes), t.amaxes)
            except Exception as err:  # fall back to the tensor's own error, and say so
                t.note(
                    f"{call.key[0] or '<root>'}: its {call.key[1]} call could not be re-run "
                    f"({type(err).__name__}: {err}); measured on the quantized tensor"
                )
            else:
                for a, e in errors.items():
                    t.sums[a] += e
                t.numel += call.output.numel()
                t.measured.add(LAYER_OUTPUT)
                continue
        for x in call.tensors():
            for a in t.amaxes:
                t.sums[a] += _sq(fake_quantize(t.q, x, _amax(a, x)), x)
            t.numel += x.numel()
            t.measured.add(TENSOR)


def _output_errors(call: LayerCall, amaxes: list[float]) -> dict[float, float]:
    assert call.output is not None
    ref = call.output
    out = {}
    for a in amaxes:
        y = call.rerun(_amax(a, ref))
        if y.shape != ref.shape:
            raise ValueError(f"output shape {tuple(y.shape)} != FP32 {tuple(ref.shape)}")
        out[a] = _sq(y, ref)
    return out


def _amax(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _sq(y: torch.Tensor, x: torch.Tensor) -> float:
    """Σ(y − x)² in float64."""
    return float((y.detach() - x).double().square().sum())


def _check_candidates(
    candidates: Sequence[tuple[str, float | None]] | None,
) -> tuple[tuple[str, float | None], ...]:
    if candidates is None:
        return DEFAULT_CANDIDATES
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise TypeError(
            f"candidates must be a sequence of (method, percentile or None) pairs, got "
            f"{type(candidates).__name__}"
        )
    out: dict[str, tuple[str, float | None]] = {}
    for c in candidates:
        if not isinstance(c, (tuple, list)) or len(c) != 2:
            raise TypeError(
                f"each candidate must be a (method, percentile or None) pair, got {c!r}"
            )
        method, pct = c
        if method not in CALIBRATION_METHODS:
            raise ValueError(
                f"unknown calibration method {method!r} in candidates; choose from "
                f"{', '.join(CALIBRATION_METHODS)}"
            )
        if method == "percentile":
            if isinstance(pct, bool) or not isinstance(pct, (int, float)):
                raise ValueError(f"candidate ('percentile', {pct!r}) needs a percentile number")
            if not 0.0 < float(pct) <= 100.0:
                raise ValueError(f"candidate percentile must be in (0, 100], got {pct}")
            pct = float(pct)
        elif pct is not None:
            raise ValueError(f"candidate ({method!r}, {pct!r}): only 'percentile' takes a number")
        out.setdefault(method_label(method, pct), (method, pct))
    if not out:
        raise ValueError("candidates is empty: give at least one (method, percentile) pair")
    return tuple(out.values())
