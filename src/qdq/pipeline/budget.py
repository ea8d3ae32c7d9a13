"""The whole job's time budget (issues 47, 57): ``qdq quantize --time-budget SECONDS``.

A user iterates: the job must end in a time they can plan for, and say so while it runs. The
budget bounds the job from capture to the written report (loading the model and the data is not
in it). Its stages fall in two kinds:

* the **core** — capture + plan, calibration, the export and its verification, the FP32 and INT8
  evaluations, lint and the report — runs whatever the budget (every published figure comes from
  it);
* the **flexible** stages fit in what the core leaves: the recipe search (and the refit of the
  kept recipe), ``--compare-methods`` and the per-layer errors.

``--objective speed`` adds its stage ``speed`` to the core's plan (:attr:`Budget.speed_stage`):
two exports of the plan and their lint, and a calibration of the re-plan on every calibration
sample; like the optional stages it is not in the work the search's share is counted from, so
the recipe does not depend on the objective.

After calibration, :meth:`Budget.plan` makes two plans of the stages still to come:

* the **work**, counted (:mod:`qdq.ptq.counts`: the model's multiply-accumulates, layers and
  samples in nominal seconds): the same on every machine and under any load. What the recipe
  search may try — candidates, folds, AdaRound's iterations — is :data:`SHARE` − 1 times the
  work of the stages every job runs, at least :data:`MIN_SEARCH` (:meth:`Budget.search_work`),
  so the same data and flags give the same recipe and the same model whatever the load;
* the **seconds**, predicted from what one sample costs in a forward of the float and of the
  fake-quant model (:mod:`qdq.pipeline.timing`: warmed up on the job's own batch, the fastest
  of several readings, at most what a sample of the calibration cost) and the plan's size (the
  export). Without ``--time-budget`` their sum is the default total, printed with the expected
  end; it stops nothing: the clock stops work only past the hard ceiling of :data:`CEILING` ×
  that total. As the stages end, :meth:`Budget.observe` re-plans the ones to come by how their
  real seconds compared with the prediction.

With ``--time-budget`` the clock stops work: the search gets the seconds the stages to come
leave (:meth:`Budget.search_seconds`), each flexible stage runs only on the time then left
(:meth:`Budget.fits`): ``--compare-methods`` measures the methods that fit, the per-layer errors
run on fewer samples or not at all. Whatever the clock cut from the search or the refit makes
the result depend on the clock: ``report.json: budget.clock`` says so, with the ``--recipe``
that reproduces the result (:meth:`Budget.clocked`); the report says what was left out and why
(``report.json: budget``).

The constants below are upper-side figures from this project's CPU runs
(benchmarks/time_to_result.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from qdq.ptq.counts import CALIBRATION_FORWARDS

__all__ = ["CEILING", "MIN_SEARCH", "OPTIONAL", "SHARE", "Budget", "budget_lines", "check_budget"]

#: the default total, as a multiple of the core stages' estimate (capture to report): the
#: search and the refit get as much as the estimate of the rest. At 1.4 and 1.6
#: EfficientNet-Lite0's search (17 s, 23 s) ran none, kernel-sum and bias and left
#: kernel-sum+bias out (top-1 agreement 87.5 %) while the job ended at 35 s of its 59-63 s (the
#: core's estimate is an upper side); at 2.0 it keeps kernel-sum+bias (92.97 %, 58 s in all). The
#: demo's search, which ends when the race is decided, stays at 7 s of 33 s
SHARE = 2.0
#: work the default plan leaves the search at least (nominal seconds: a tiny model's search)
MIN_SEARCH = 5.0
#: without --time-budget, the clock stops work only past this multiple of the predicted total
CEILING = 10.0
#: the planned stages not every job runs (the search's share is counted without them)
OPTIONAL = ("layer_errors", "compare_methods", "speed")
#: the stages' names in the job's timings (``report.json: timings_s``) where they differ
TIMED_AS = {"lint_report": "lint"}
#: the export: a fixed cost (tracing, ONNX Runtime's session) plus seconds per point of the plan
#: (dynamo's tracing and translation grow with the graph: 0.05-0.18 s per point on this
#: project's real-model rows, EfficientNet-Lite0 0.053, YOLOv8n 0.13)
EXPORT_FIXED, EXPORT_PER_POINT = 2.0, 0.1
#: per evaluation sample: the FP32 evaluation in FP32 forwards (the metric besides); the INT8
#: evaluation in fake-quant forwards: ONNX Runtime at ORT_ENABLE_BASIC (unfused Q/DQ) and the
#: torch fake-quant model
FP32_FORWARDS, INT8_FORWARDS = 1.2, 3.0
#: per sample of the per-layer errors, in fake-quant forwards (an FP32 and an INT8 pass, every
#: quantizer's error)
LAYER_ERROR_FORWARDS = 6.0
#: per evaluation sample and calibration method of --compare-methods, in fake-quant forwards
METHOD_FORWARDS = 1.2
#: lint and the report (its drawing): fixed seconds plus a share of the export's
REPORT_FIXED, REPORT_PER_EXPORT = 1.0, 0.2


def check_budget(seconds: object) -> float | None:
    """``seconds`` as a time budget (``None``: the default).

    Raises:
        ValueError: not a positive finite number.
    """
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not (0 < seconds < math.inf)
    ):
        raise ValueError(f"time_budget must be a number of seconds > 0, got {seconds!r}")
    return float(seconds)


@dataclass
class Budget:
    """The job's clock and its plans (module docstring).

    Attributes:
        given: the budget asked for (``None``: the default, set by :meth:`plan`).
        eval_samples: the evaluation samples; ``layer_error_samples``: those of the per-layer
            errors; ``methods``: the calibration methods ``--compare-methods`` measures (0:
            not asked for); ``calib_samples``: the calibration samples (every one).
        start: when the job's clock started (``time.perf_counter()``: capture).
        total: the budget in seconds (given; else the predicted job, ``None`` until
            :meth:`plan`).
        planned: the seconds :meth:`plan` predicted, by stage, in the order they run.
        work: the counted work of the same stages (nominal seconds), capture + calibration
            first.
        skipped: what the budget left out, each ``{"stage", "what", "why"}``.
        per_sample: what one sample costs in a fake-quant forward (the unit of the predictions);
            ``nominal``: its counted work.
        search: whether the job searches a recipe.
        ceiling: without ``given``, the seconds past which the clock stops work.
        spent_by: the real seconds of the planned stages that ended (:meth:`observe`).
        cut: what the clock cut from the search or the refit (the result depended on it).
        recipe: the recipe kept (for the ``--recipe`` that reproduces a clocked result).
        speed_stage: whether the job runs ``--objective speed``'s stage ``speed`` (planned
            first: it runs after the search, before the export).
    """

    given: float | None = None
    eval_samples: int = 0
    layer_error_samples: int = 0
    methods: int = 0
    calib_samples: int = 0
    start: float = field(default_factory=time.perf_counter)
    total: float | None = None
    planned: dict[str, float] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    per_sample: float = 0.0
    nominal: float = 0.0
    search: bool = True
    ceiling: float | None = None
    spent_by: dict[str, float] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)
    recipe: str | None = None
    speed_stage: bool = False

    def __post_init__(self) -> None:
        if self.given is not None:
            self.total = self.given

    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left of the budget (negative past it; infinite before :meth:`plan`, and
        without ``given`` until the hard ceiling has passed: the default stops nothing)."""
        if self.given is not None:
            return self.given - self.elapsed()
        if self.ceiling is None:
            return math.inf
        past = self.ceiling - self.elapsed()
        return math.inf if past > 0 else past

    def plan(
        self,
        *,
        points: int,
        fp32: float,
        int8: float,
        search: bool = True,
        nominal: float | None = None,
    ) -> None:
        """Plan the stages to come from the plan's size (``points``), what one sample costs in a
        forward of the float model (``fp32``) and of the fake-quant model (``int8``), and its
        counted work (``nominal``, :func:`qdq.ptq.counts.nominal_forward`; default ``int8``);
        set the predicted total when none was given (``search``: whether a recipe search will
        run: its work at the measured speed is in it)."""
        self.search = search
        self.per_sample = int8
        self.nominal = int8 if nominal is None else nominal
        self.planned = self._stages(points, fp32, int8)
        self.work = {"capture_calibrate": EXPORT_PER_POINT * points + CALIBRATION_FORWARDS
                     * self.nominal * self.calib_samples,
                     **self._stages(points, self.nominal, self.nominal)}  # fmt: skip
        if self.given is None:
            speed = int8 / self.nominal if self.nominal > 0 else 1.0
            ahead = self.search_work() * speed if search else 0.0
            self.total = self.elapsed() + sum(self.planned.values()) + ahead
            self.ceiling = CEILING * self.total

    def _stages(self, points: int, fp32: float, int8: float) -> dict[str, float]:
        export = EXPORT_FIXED + EXPORT_PER_POINT * points
        report = REPORT_FIXED + REPORT_PER_EXPORT * export
        # --objective speed: the first export and the re-plan's, each linted, and the re-plan
        # calibrated on every calibration sample
        speed = 2 * (export + report) + CALIBRATION_FORWARDS * int8 * self.calib_samples
        return {
            **({"speed": speed} if self.speed_stage else {}),
            "export": export,
            "fp32_eval": FP32_FORWARDS * fp32 * self.eval_samples,
            "int8_eval": INT8_FORWARDS * int8 * self.eval_samples,
            "layer_errors": LAYER_ERROR_FORWARDS * int8 * self.layer_error_samples,
            "compare_methods": METHOD_FORWARDS * int8 * self.eval_samples * self.methods,
            "lint_report": report,
        }

    def search_work(self) -> float:
        """The work the recipe search (its refit included) may do: :data:`SHARE` − 1 times the
        counted work of the stages every job runs (not the optional ones), at least
        :data:`MIN_SEARCH` (nominal seconds; no clock in it)."""
        core = sum(v for k, v in self.work.items() if k not in OPTIONAL)
        return max((SHARE - 1.0) * core, MIN_SEARCH)

    def observe(self, timings: dict[str, float]) -> None:
        """Re-plan: the planned stages that ended (in the job's ``timings``) have their real
        seconds; the ones to come are scaled by how those compared with the prediction."""
        for stage in self.planned:
            seconds = timings.get(TIMED_AS.get(stage, stage))
            if seconds is not None:
                self.spent_by[stage] = float(seconds)

    def speed(self) -> float:
        """Real seconds over predicted ones of the planned stages that ended (1: none yet; a
        stage predicted under 0.1 s does not count)."""
        done = [(self.spent_by[k], self.planned[k]) for k in self.spent_by
                if self.planned.get(k, 0.0) >= 0.1]  # fmt: skip
        if not done:
            return 1.0
        return max(sum(s for s, _ in done) / sum(p for _, p in done), 0.1)

    def reserved(self, after: str | None = None) -> float:
        """The predicted seconds of the planned stages still to come (those after ``after`` in
        the plan's order when given), re-planned by :meth:`speed`."""
        names = list(self.planned)
        if after is not None and after in names:
            names = names[names.index(after) + 1 :]
        speed = self.speed()
        return sum(self.planned[n] * speed for n in names if n not in self.spent_by)

    def search_seconds(self) -> float | None:
        """What the recipe search (its refit included) may take by the clock: with ``given``,
        what is left after every planned stage; else ``None`` (the search's work is counted,
        :meth:`search_work`; only the ceiling stops it: :meth:`search_ceiling`)."""
        if self.given is None:
            return None
        return max(0.0, self.left() - self.reserved())

    def search_ceiling(self) -> float | None:
        """The hard stop of the search in seconds (without ``given``): the ceiling less the
        stages to come."""
        if self.given is not None or self.ceiling is None:
            return None
        return max(0.0, self.ceiling - self.elapsed() - self.reserved())

    def fits(self, stage: str, seconds: float) -> bool:
        """Whether ``stage`` (estimated now at ``seconds``) fits in what is left with the planned
        stages after it still to run (always, without ``given``, until the ceiling)."""
        return seconds <= self.left() - self.reserved(after=stage)

    def skip(self, stage: str, what: str, why: str) -> None:
        """Record that the budget left ``what`` of ``stage`` out."""
        self.skipped.append({"stage": stage, "what": what, "why": why})

    def clocked(self, what: str) -> None:
        """Record that the clock cut ``what`` from the search or the refit: the result
        depended on it."""
        if what not in self.cut:
            self.cut.append(what)

    def describe(self) -> str:
        """One line: the budget, how it was set, and when the job should end."""
        assert self.total is not None
        end = time.strftime("%H:%M:%S", time.localtime(time.time() + self.total - self.elapsed()))
        if self.given is not None:
            how = "given"
            search = (f"the search may take {self.search_seconds() or 0:.0f} s" if self.search
                      else "no recipe search")  # fmt: skip
        else:
            how = f"default: the predicted job; the clock stops work only past {self.ceiling:.0f} s"
            search = (f"the search's plan {self.search_work():.0f} s of counted work"
                      if self.search else "no recipe search")  # fmt: skip
        return f"time budget {self.total:.0f} s ({how}); {search}; expected end by {end}"

    def to_report(self, timings: dict[str, float] | None = None) -> dict[str, Any]:
        """``report.json["budget"]`` (``timings``: the job's, observed first)."""
        if timings is not None:
            self.observe(timings)
        spent = self.elapsed()
        depended = bool(self.cut)
        return {
            "seconds": None if self.total is None else round(self.total, 3),
            "given": self.given is not None,
            "spent": round(spent, 3),
            "within": self.total is None or spent <= self.total,
            "ceiling": None if self.ceiling is None else round(self.ceiling, 3),
            "per_sample": self.per_sample,
            "planned": {k: round(v, 3) for k, v in self.planned.items()},
            "spent_by_stage": {k: round(v, 3) for k, v in self.spent_by.items()},
            "work": {k: round(v, 3) for k, v in self.work.items()},
            "search_work": round(self.search_work(), 3) if self.work else None,
            "skipped": list(self.skipped),
            "clock": {
                "depended": depended,
                "cut": list(self.cut),
                "reproduce": f"--recipe {self.recipe}" if depended and self.recipe else None,
            },
        }


def budget_lines(b: dict[str, Any] | None) -> list[str]:
    """The budget's headline in words (the summary and the page): what was planned, what was
    spent, whether the result depended on the clock (and the ``--recipe`` that reproduces it),
    and what the budget left out. ``b``: ``report.json["budget"]``."""
    if not b or b.get("seconds") is None:
        return []
    spent = b["spent"]
    if b["given"]:
        state = "within it" if b["within"] else "OVER it"
        lines = [f"time budget: {b['seconds']:.0f} s (given), capture to report {spent:.1f} s, "
                 f"{state}"]  # fmt: skip
    else:
        ratio = spent / b["seconds"] if b["seconds"] > 0 else math.inf
        ceiling = b.get("ceiling")
        stop = f"; the clock stops work only past {ceiling:.0f} s" if ceiling else ""
        lines = [f"time budget: planned {b['seconds']:.0f} s (default: the predicted job{stop}), "
                 f"spent {spent:.1f} s capture to report ({ratio:.2g}x the plan)"]  # fmt: skip
    clock = b.get("clock") or {}
    if clock.get("depended"):
        again = clock.get("reproduce")
        lines.append("  the result depended on the clock (" + "; ".join(clock["cut"]) + ")"
                     + (f": {again} reproduces it without the search" if again else ""))  # fmt: skip
    lines += [f"  left out by the budget: {s['stage']}: {s['what']} ({s['why']})"
              for s in b.get("skipped", [])]  # fmt: skip
    return lines
