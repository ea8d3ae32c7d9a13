"""Recipe search (issue 33): which PTQ steps help this model, chosen by measurement.

The best set of PTQ steps differs per model (docs/ptq.md): EfficientNet-Lite0 gains most from
kernel-sum rounding and bias correction, MTCNN RNet from equalization and AdaRound, Fashion-MNIST
from none. :func:`search` tries candidate recipes on a held-out part of the calibration data and
keeps the best:

1. the float model is prepared and calibrated once (once more, on its equalized copy, for the
   recipes that equalize): every candidate starts from a copy of that calibrated model, so the
   one calibration collection serves them all;
2. each candidate runs its steps (:data:`qdq.ptq.step.STEPS`, in pipeline order) on the
   calibration batches and is scored on the held-out batches: by ``score(model)`` when given
   (a task metric, higher is better), else by the mean cosine similarity of its outputs with the
   FP32 model's, sample by sample;
3. the kept recipe has the best score, unless a simpler recipe (fewer steps) is not measurably
   worse: then the simpler one is kept, so that a step stays only where it measurably helps.
   With per-sample scores (the default score, or a ``score`` that returns one value per held-out
   sample) "measurably" is a paired test: the best's mean gain over the simpler recipe, sample by
   sample, must exceed ``significance`` standard errors of that gain (default 1: a step that
   helps on average rarely hurts, so only a gain within the noise of the held-out samples goes
   to the simpler recipe). With one number per candidate it must exceed ``tie``. (An absolute
   tie on the cosine fails both ways: 1e-4 is noise on one model and, on CREPE-tiny, where every
   candidate scores above 0.9999, it hid kernel-sum + bias, whose mean error 1 − cosine on the
   held-out frames was 2.7× smaller: a gain of 4.7e-5 ± 3.0e-5, 1.6 standard errors.) With the
   default score the gain must also cut the simpler recipe's error 1 − cosine by ``effect`` (a
   tenth): a consistent gap of 1e-7 is significant, not meaningful;
4. with ``folds`` (cross-fitting, :mod:`qdq.ptq.race`), the candidates still in contention after
   the first held-out share run again on further disjoint shares, each time calibrated on the
   rest of the samples, and the choice is made on all the held-out samples they completed: a few
   held-out samples do not decide alone.

What runs — the candidates, their order, AdaRound's iterations, the folds of the race — is
planned from counts (the model's multiply-accumulates, layers, parameters and samples:
:mod:`qdq.ptq.counts`, :mod:`qdq.ptq.schedule`), never from the clock: the same data and
arguments give the same recipe and the same model on an idle and on a loaded machine. The clock
stops work only when the caller asks (``budget``, ``ceiling``); the result then lists what it cut
(:attr:`SearchResult.clock_cut`).

The held-out batches must not be the evaluation samples the results are published on: the
figure that decides is never the figure that is reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from qdq._deadline import deadline
from qdq._progress import progress
from qdq.api import quantizers_of as qdq_quantizers
from qdq.calib.batches import batch_samples
from qdq.ptq.costs import Costs, matmul_flops
from qdq.ptq.counts import batch_of, count_macs, nominal_costs
from qdq.ptq.race import Margin, Runs, choose, contenders, describe, race, run_one
from qdq.ptq.recipes import Recipe, Trial, recipe
from qdq.ptq.schedule import Admission, Schedule
from qdq.ptq.scoring import output_cosine
from qdq.ptq.step import StepReport, step_runs

__all__ = [
    "CANDIDATES",
    "Fold",
    "Recipe",
    "SearchResult",
    "Trial",
    "default_budget",
    "default_work",
    "recipe",
    "recipe_of",
    "record_recipe",
    "search",
]

_RECIPE_ATTR = "_qdq_ptq_recipe"

#: the candidates :func:`search` tries by default: the data-free rounding first, then by the gain
#: measured per second on the zoo (docs/ptq.md) — kernel-sum + bias before bias alone, whose cost
#: is the same (bias correction dominates it: 279 s of 292 on EfficientNet-Lite0 at 224², where
#: the search's budget then stopped before kernel-sum + bias, the zoo's best there) — AdaRound last
CANDIDATES: tuple[str, ...] = (
    "none",
    "kernel-sum",
    "kernel-sum+bias",
    "bias",
    "method",
    "method+kernel-sum+bias",
    "equalize",
    "equalize+kernel-sum+bias",
    "adaround",
    "adaround+bias",
    "equalize+adaround",
    "equalize+adaround+bias",
)


def default_budget(calibration_seconds: float) -> float:
    """A time budget of 10 × one prepare + calibrate, at least 30 s (kept for callers that want
    one; :func:`search` has no clock by default, its plan is :func:`default_work`)."""
    return max(30.0, 10.0 * calibration_seconds)


def default_work(costs: Costs) -> float:
    """:func:`search`'s work allowance when it is called alone (``qdq quantize`` gives it a
    share of its job's counted work, :mod:`qdq.pipeline.budget`): 10 × one counted calibration,
    at least 30 nominal seconds (:mod:`qdq.ptq.counts`), for the whole search."""
    return max(30.0, 10.0 * costs.calibration)


def record_recipe(prepared: nn.Module, name: str, chosen_by: str) -> None:
    """Record on a prepared model the recipe its PTQ steps followed, and how it was chosen
    (``"search"`` or ``"given"``): :func:`qdq.export_onnx` writes it into the manifest's
    ``"ptq"`` entry, so that ``qdq quantize --recipe NAME`` (or
    :meth:`qdq.pipeline.PtqOptions.from_recipe`) can replay it on new calibration data. Copies of
    the model (:func:`qdq.copy_prepared`, :func:`qdq.qat.prepare`) keep it."""
    r = recipe(name)
    prepared.__dict__[_RECIPE_ATTR] = {"recipe": r.name, "steps": list(r.steps),
                                       "chosen_by": chosen_by}  # fmt: skip


def recipe_of(prepared: nn.Module) -> dict[str, Any] | None:
    """What :func:`record_recipe` recorded on ``prepared`` (``None``: nothing)."""
    found = prepared.__dict__.get(_RECIPE_ATTR)
    return dict(found) if isinstance(found, dict) else None


@dataclass(frozen=True)
class SearchResult(StepReport):
    """What :func:`search` did: one row per candidate, in the order tried.

    Attributes:
        rows: the trials.
        kept: the recipe kept.
        reason: why it was kept.
        score_name: what the score is (``"output cosine"`` or the caller's name).
        budget: the caller's seconds (the whole search: every fold; ``None``: no clock);
            ``calibration_seconds``: one prepare + calibrate.
        work: the work allowed the search (nominal seconds, counted: :mod:`qdq.ptq.counts`);
            ``work_done``: the estimates of what ran.
        clock_cut: what the clock (``budget`` or ``ceiling``) cut from the plan; empty: the
            result does not depend on the machine's speed or load.
        held_out: held-out batches the choice was made on (over ``folds`` folds).
        folds: the folds the choice was made on (1: the first split only).
        spent: the seconds the search took.
        order: the candidates in the order they ran (the first, then cheapest first).
        iters: the AdaRound iterations of the kept recipe (``None``: no AdaRound); the budget
            may have shortened them, and a refit runs as many.
        refit_estimate: the estimated seconds to run the kept recipe's steps on every
            calibration sample (0 without ``refit``).
        model: the kept prepared model (calibrated, its steps applied); not in the JSON.
        float_model: the float model the kept model was prepared from (the equalized copy when
            the kept recipe equalizes, else the model searched); not in the JSON.
        reports: the kept recipe's step reports (:class:`~qdq.ptq.step.StepReport`, equalization
            first), from the run that made ``model``; not in the JSON.
    """

    rows: tuple[Trial, ...]
    kept: Recipe
    reason: str
    score_name: str
    budget: float | None
    calibration_seconds: float
    held_out: int
    model: nn.Module | None = field(default=None, repr=False, compare=False)
    notes: tuple[str, ...] = ()
    float_model: nn.Module | None = field(default=None, repr=False, compare=False)
    reports: tuple[StepReport, ...] = field(default=(), repr=False, compare=False)
    folds: int = 1
    margin: dict[str, Any] = field(default_factory=dict)
    spent: float = 0.0
    order: tuple[str, ...] = ()
    iters: int | None = None
    refit_estimate: float = 0.0
    work: float = 0.0
    work_done: float = 0.0
    clock_cut: tuple[str, ...] = ()
    refit_work: float = 0.0

    key: ClassVar[str] = "recipe_search"
    columns: ClassVar[tuple[tuple[str, Callable[[Any], str]], ...]] = (
        ("recipe", lambda t: t.recipe),
        ("score", lambda t: "-" if t.score is None else f"{t.score:.6f}"),
        ("folds", lambda t: str(t.folds)),
        ("seconds", lambda t: f"{t.seconds:.1f}"),
        ("status", lambda t: t.status),
    )

    def summary(self) -> str:
        """One line: the recipe kept, its score, and how many were tried."""
        scored = [t for t in self.rows if t.score is not None]
        best = next((t for t in scored if t.recipe == self.kept.name), None)
        value = "-" if best is None else f"{best.score:.6f}"
        folds = f" of {self.folds} folds" if self.folds > 1 else ""
        return (
            f"recipe search: kept {self.kept.name} ({self.score_name} {value} on {self.held_out} "
            f"held-out batches{folds}) of {len(scored)} scored / {len(self.rows)} candidates"
        )

    def fields(self) -> dict[str, Any]:
        """The recipe kept and why, the score, the budget and the data."""
        return {
            "kept": self.kept.name,
            "steps": list(self.kept.steps),
            "reason": self.reason,
            "score": self.score_name,
            "budget_seconds": self.budget,
            "work": round(self.work, 3),
            "work_done": round(self.work_done, 3),
            "clock_cut": list(self.clock_cut),
            "seconds": round(self.spent, 3),
            "order": list(self.order),
            "adaround_iters": self.iters,
            "calibration_seconds": self.calibration_seconds,
            "held_out_batches": self.held_out,
            "folds": self.folds,
            "margin": dict(self.margin),
        }

    def flag(self, row: Trial) -> str:
        """The kept row is marked."""
        return "  <- kept" if row.recipe == self.kept.name else ""


@dataclass(frozen=True)
class Fold:
    """Another split of the calibration samples for :func:`search` to score on (cross-fitting).

    Attributes:
        calib: the batches this fold calibrates on (and runs the steps on).
        held: the batches it scores on: none of them in ``calib``, nor in another fold's
            ``held``, nor evaluation samples.
        score: ``score(prepared)`` on ``held``, as :func:`search`'s ``score`` (required when that
            is given; default: the output cosine with FP32 on ``held``).
        calibrated: ``calibrated()`` returns the model prepared and calibrated on ``calib`` (with
            the search's method), made without running data — e.g. by :func:`qdq.calibrate_from`
            from statistics collected once per part (:mod:`qdq.calib.parts`); ``None``: the
            search prepares and calibrates it.
    """

    calib: Sequence[Any]
    held: Sequence[Any]
    score: Callable[[nn.Module], float | torch.Tensor] | None = None
    calibrated: Callable[[], nn.Module] | None = None


def search(
    model: nn.Module,
    example_inputs: Sequence[Any],
    calib_data: Iterable[Any],
    held_out: Iterable[Any],
    *,
    score: Callable[[nn.Module], float | torch.Tensor] | None = None,
    score_name: str = "score",
    method: str | None = "mse",
    percentile: float | None = None,
    config: Any = None,
    candidates: Sequence[str] = CANDIDATES,
    budget: float | None = None,
    tie: float = 1e-4,
    significance: float = 1.0,
    effect: float = 0.1,
    adaround_samples: int = 256,
    adaround_iters: int = 500,
    calibrated: nn.Module | None = None,
    calibration_seconds: float | None = None,
    folds: Sequence[Fold] = (),
    show_progress: bool = False,
    refit: float = 0.0,
    forward_seconds: float | None = None,
    work: float | None = None,
    ceiling: float | None = None,
    macs: int | None = None,
) -> SearchResult:
    """Try PTQ recipes and keep the best on held-out data (module docstring).

    Args:
        model: the float model (never modified).
        example_inputs: positional inputs for one forward (as for :func:`qdq.prepare`).
        calib_data: calibration batches (as :func:`qdq.calibrate` takes them).
        held_out: batches to score on, none of them calibration or evaluation samples.
        score: ``score(prepared)``, higher is better: a number, or a 1-D tensor of one number per
            held-out sample (the score is its mean; the choice then tests the gains sample by
            sample). Default: the cosine similarity with the FP32 model's outputs, per sample,
            averaged over the output tensors, on ``held_out``. ``score_name`` names it.
        method / percentile: the calibration method (:func:`qdq.calibrate`; ``None``: each
            quantizer's own, as an FP8 or mixed plan calibrates).
        config: the :class:`qdq.QuantConfig` for :func:`qdq.prepare`.
        candidates: recipe names (:func:`recipe`), tried in this order.
        budget: the caller's seconds for the whole search, the race over ``folds`` included,
            counted from the call (``None``: no clock). Within the plan (``work``), a candidate
            starts only when its measured estimate fits in the seconds left, AdaRound with fewer
            iterations when that fits, and one that runs past the end by more than its
            estimate is stopped; what the clock cut is listed (``clock_cut``).
        work: the work planned for the whole search, in nominal seconds counted from the model
            (:mod:`qdq.ptq.counts`; default :func:`default_work`). The first candidate always
            runs; the others run cheapest first, each only when its counted estimate fits in
            the work left (:mod:`qdq.ptq.schedule`), AdaRound with fewer iterations when that
            fits. The same on every machine and under any load.
        ceiling: a hard stop in seconds (no estimate: a candidate running past it stops at its
            next step; none starts after it); listed in ``clock_cut`` when it cut anything.
        macs: the float model's multiply-accumulates per sample, when the caller counted them
            (default: counted on ``example_inputs``, :func:`qdq.ptq.counts.count_macs`).
        tie: for a score of one number: a recipe with fewer steps within ``tie`` of the best is
            kept instead.
        significance: for per-sample scores: a recipe with fewer steps is kept instead of the
            best unless the best's mean per-sample gain over it exceeds this many standard
            errors of that gain.
        effect: with the default score (the output cosine, whose ceiling is 1): the best's mean
            gain must also cut the simpler recipe's mean error 1 − cosine by this share
            (:class:`qdq.ptq.race.Margin`); a ``score`` of your own has no known ceiling, and
            this does not apply.
        adaround_samples / adaround_iters: AdaRound's settings (:func:`qdq.ptq.adaround.adaround`).
        calibrated: ``model`` already prepared and calibrated on ``calib_data`` with ``method``
            (it is copied, not changed): the search then calibrates only the equalized copy.
        calibration_seconds: what preparing and calibrating ``calibrated`` took (for the default
            budget and the report; measured when the search calibrates).
        folds: more splits of the calibration samples (:class:`Fold`). After every candidate
            ran on ``calib_data`` / ``held_out``, the ones still in contention (the best not
            measurably better at :data:`qdq.ptq.race.RACE` standard errors) run on each fold in
            turn, calibrated on its ``calib`` and scored on its ``held``; the choice is then made
            on all the held-out samples of the folds the remaining candidates completed, so that
            a few held-out samples do not decide alone.
        refit: the caller will run the kept recipe again on ``refit`` times the samples of
            ``calib_data`` (every calibration sample): its estimated cost is kept out of
            ``budget`` (0: no refit).
        forward_seconds: one fake-quant forward's seconds per sample, when the caller timed it
            (the first measured estimate the clock admits by; default: what one sample of the
            calibration cost). Never used by the plan.

    Raises:
        ValueError: no candidates, an unknown recipe, empty calibration or held-out data (of a
            fold too), a fold without ``score`` when ``score`` is given, or a negative
            ``budget`` / ``tie`` / ``significance`` / ``effect``.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
        >>> data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
        >>> found = search(net, (data[0][:1],), data[:2], data[2:], candidates=("none", "bias"))
        >>> found.kept.name in ("none", "bias")
        True
    """
    import qdq

    recipes = [recipe(c) for c in candidates]
    if not recipes:
        raise ValueError("search needs at least one candidate recipe")
    splits = [Fold(list(f.calib), list(f.held), f.score, f.calibrated)
              for f in (Fold(list(calib_data), list(held_out), score), *folds)]  # fmt: skip
    if any(not f.calib or not f.held for f in splits):
        raise ValueError("search needs calibration batches and held-out batches (neither empty)")
    if score is not None and any(f.score is None for f in splits[1:]):
        raise ValueError(
            "with a score given, every fold needs its own score (on its held-out data)"
        )
    limits = [x for x in (budget, work, ceiling) if x is not None]
    if any(x < 0 for x in limits) or min(tie, significance, effect, refit) < 0:
        raise ValueError(
            f"budget, work, ceiling, tie, significance, effect and refit must be >= 0, got "
            f"budget={budget!r}, work={work!r}, ceiling={ceiling!r}, tie={tie!r}, "
            f"significance={significance!r}, effect={effect!r}, refit={refit!r}"
        )
    margin = Margin(significance, tie, effect, 1.0 if score is None else None)
    if score is None:
        score_name = "output cosine"
    scorers = [f.score or output_cosine(model, list(f.held)) for f in splits]
    fit = [sum(batch_samples(b) for b in f.calib) for f in splits]
    held = [sum(batch_samples(b) for b in f.held) for f in splits]
    # per fold and base (equalized or not): its float model, its calibrated prepared model and
    # the equalization report; calibrated once each, copied for every candidate
    bases: dict[tuple[int, bool], tuple[nn.Module, nn.Module, StepReport | None]] = {}
    if calibrated is not None:
        bases[0, False] = (model, calibrated, None)
    seconds: list[float] = [] if calibration_seconds is None else [float(calibration_seconds)]
    if macs is None:  # counted, not timed: the plan's unit (qdq.ptq.counts)
        macs = count_macs(model, example_inputs, batch_samples(tuple(example_inputs)))
    clock = time.perf_counter()  # the budget counts from here

    def base(fold: int, equalized: bool) -> tuple[nn.Module, nn.Module, StepReport | None]:
        if (fold, equalized) not in bases:
            start = time.perf_counter()
            data = list(splits[fold].calib)
            make = splits[fold].calibrated
            float_model, report = model, None
            if make is not None and not equalized:  # from statistics already collected
                prepared = make()
            else:
                if equalized:
                    from qdq.ptq.equalize import equalize

                    report = equalize(model, example_inputs, data)
                    float_model = report.model
                prepared = qdq.prepare(float_model, example_inputs, config)
                qdq.calibrate(prepared, data, method=method, percentile=percentile,
                              show_progress=False)  # fmt: skip
            bases[fold, equalized] = (float_model, prepared, report)
            if equalized and timed_costs is not None:
                timed_costs.record("equalize", time.perf_counter() - start, fit[fold])
            if (fold, equalized) == (0, False):
                seconds.append(time.perf_counter() - start)
        if schedule is not None:
            schedule.built.add((fold, equalized))
        return bases[fold, equalized]

    schedule: Schedule | None = None
    timed_costs: Costs | None = None  # measured: only what the caller's clock admits by
    base(0, False)
    params, layers = _size(bases[0, False][1])
    costs = nominal_costs(params=params, layers=layers, macs=macs,
                          batch=batch_of(splits[0].calib), samples=fit[0])  # fmt: skip
    if budget is not None:
        forward = forward_seconds if forward_seconds is not None else seconds[0] / max(fit[0], 1)
        timed_costs = Costs(forward=forward, calibration=seconds[0], params=params,
                            layers=layers, flops=matmul_flops())  # fmt: skip
    schedule = Schedule(work if work is not None else default_work(costs), costs, fit, held,
                        refit, adaround_iters, adaround_samples, start=clock, clock=budget,
                        hard=ceiling, timed=timed_costs)  # fmt: skip
    schedule.built.add((0, False))

    def build(r: Recipe, fold: int = 0, iters: int | None = None
              ) -> tuple[nn.Module, tuple[StepReport, ...]]:  # fmt: skip
        """A copy of the recipe's calibrated base with its steps applied, and their reports."""
        _, calibrated_base, eq = base(fold, r.equalize)
        prepared = qdq.copy_prepared(calibrated_base)
        n = iters or adaround_iters
        steps = step_runs(list(splits[fold].calib), adaround_samples=adaround_samples,
                          adaround_iters=n)  # fmt: skip
        done = []
        for key in r.steps:
            if key != "equalize":
                start = time.perf_counter()
                done.append(steps[key](prepared))
                if timed_costs is not None:
                    timed_costs.record(key, time.perf_counter() - start, fit[fold], iters=n)
        return prepared, tuple(done) if eq is None else (eq, *done)

    def timed(fold: int) -> Callable[[nn.Module], float | torch.Tensor]:
        def score(prepared: nn.Module) -> float | torch.Tensor:
            start = time.perf_counter()
            got = scorers[fold](prepared)
            if timed_costs is not None:
                timed_costs.timed_forward((time.perf_counter() - start) / max(held[fold], 1))
            return got

        return score

    runs_of = {r.name: Runs() for r in recipes}
    kept_models: dict[str, tuple[nn.Module, tuple[StepReport, ...]]] = {}  # fold 0's, by recipe
    order: list[str] = []

    def run(r: Recipe, fold: int, admitted: Admission) -> bool:
        """Run ``r`` on ``fold`` under the deadline; ``False`` when the deadline stopped it."""
        if fold == 0:
            order.append(r.name)
        with deadline(schedule.stop_at(admitted.seconds)):
            got = run_one(runs_of[r.name], partial(build, r, fold, admitted.iters), timed(fold))
        schedule.charge(admitted.estimate)
        if runs_of[r.name].stopped:
            schedule.cut.append(f"{r.name} (fold {fold + 1}) stopped")
            if fold == 0:
                runs_of[r.name].status = (f"stopped (budget: ran past the budget's end and its "
                                          f"estimate of {admitted.seconds:.1f} s)")  # fmt: skip
            return False
        if got is not None and fold == 0:
            kept_models[r.name] = got[1], got[2]
        return True

    run(recipes[0], 0, schedule.admit(recipes[0], 0, first=True))
    rest = schedule.order(recipes)[1:]  # cheapest first, a forward now measured
    ends = schedule.ends
    desc = "recipe search" + ("" if ends is None else f" (ends by {_clock(ends)})")
    for r in progress(rest, total=len(rest), enabled=show_progress, desc=desc):
        scored = [c for c in recipes if runs_of[c.name].scored()]
        racing = schedule.race_estimate(contenders(scored, runs_of, margin), len(splits))
        admitted = schedule.admit(r, 0, held_back=scored, reserve=racing)
        if not admitted.run:
            runs_of[r.name].status = admitted.why
            continue
        run(r, 0, admitted)
        alive = contenders([c for c in recipes if runs_of[c.name].scored()], runs_of, margin)
        for name in [n for n in kept_models if n not in {c.name for c in alive}]:
            del kept_models[name]  # out of contention: its copy of the model is not kept
    used, race_note = race(recipes, runs_of, len(splits), run, margin, schedule, show_progress)
    trials = [runs_of[r.name].trial(r.name, used, schedule.iters_of.get(r.name))
              for r in recipes]  # fmt: skip
    kept, reason = choose(recipes, runs_of, used, margin)
    # only the first split's models of candidates in contention were kept: else made again
    kept_model, reports = kept_models.get(kept.name) or build(
        kept, 0, schedule.iters_of.get(kept.name)
    )
    record_recipe(kept_model, kept.name, "search")
    notes = tuple(n for n in (race_note,) if n)
    return SearchResult(
        rows=tuple(trials),
        kept=kept,
        reason=reason,
        score_name=score_name,
        budget=None if budget is None else float(budget),
        calibration_seconds=seconds[0],
        held_out=sum(len(f.held) for f in splits[:used]),
        model=kept_model,
        notes=notes,
        float_model=base(0, kept.equalize)[0],
        reports=reports,
        folds=used,
        margin=describe(margin),
        spent=schedule.spent(),
        order=tuple(order),
        iters=schedule.iters_of.get(kept.name),
        refit_estimate=schedule.refit_estimate(
            kept, schedule.iters_of.get(kept.name), timed_costs or costs
        ),
        work=schedule.budget,
        work_done=schedule.done,
        clock_cut=tuple(schedule.cut),
        refit_work=schedule.refit_estimate(kept, schedule.iters_of.get(kept.name)),
    )


def _size(prepared: nn.Module) -> tuple[int, int]:
    """The parameters of a prepared model and its weight quantizers (for :class:`Costs`)."""
    weights = [q for q in qdq_quantizers(prepared).values() if q.name.endswith(":weight")]
    return sum(p.numel() for p in prepared.parameters()), len(weights)


def _clock(at: float) -> str:
    """The wall-clock time ``at`` (a ``time.perf_counter()`` value) falls on, as HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(time.time() + at - time.perf_counter()))
