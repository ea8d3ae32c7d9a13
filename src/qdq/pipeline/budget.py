"""The whole job's time budget (issue 47): ``qdq quantize --time-budget SECONDS``.

A user iterates: the job must end in a time they can plan for, and say so while it runs. The
budget bounds the job from capture to the written report (loading the model and the data is not
in it). Its stages fall in two kinds:

* the **core** — capture + plan, calibration, the export and its verification, the FP32 and INT8
  evaluations, lint and the report — runs whatever the budget (every published figure comes from
  it);
* the **flexible** stages fit in what the core leaves: the recipe search (and the refit of the
  kept recipe), ``--compare-methods`` and the per-layer errors.

After calibration, :meth:`Budget.plan` estimates the stages still to come from what one sample
costs in a forward of the float and of the fake-quant model (timed on 16 calibration
samples) and the plan's size (the export), sets
the total when none was given — :data:`SHARE` × the core's estimate, at least the core plus
:data:`MIN_SEARCH` seconds, so that a small model ends in about a minute on a 2-core CPU — and
gives the search what is left after the stages to come (:meth:`Budget.search_seconds`). Later,
each flexible stage runs only on the time then left (:meth:`Budget.fits`): ``--compare-methods``
measures the methods that fit, the per-layer errors run on fewer samples or not at all, and the
report says what was left out and why (``report.json: budget``).

Estimates are ratios of what the job measured, not of a model's size alone; the constants below
are upper-side figures from this project's CPU runs (benchmarks/time_to_result.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MIN_SEARCH", "SHARE", "Budget", "check_budget"]

#: the default total, as a multiple of the core stages' estimate (capture to report): the
#: search and the refit get as much as the estimate of the rest. At 1.4 and 1.6
#: EfficientNet-Lite0's search (17 s, 23 s) ran none, kernel-sum and bias and left
#: kernel-sum+bias out (top-1 agreement 87.5 %) while the job ended at 35 s of its 59-63 s (the
#: core's estimate is an upper side); at 2.0 it keeps kernel-sum+bias (92.97 %, 58 s in all). The
#: demo's search, which ends when the race is decided, stays at 7 s of 33 s
SHARE = 2.0
#: seconds the default budget leaves the flexible stages at least (a tiny model's search)
MIN_SEARCH = 5.0
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
    """The job's clock and its plan (module docstring).

    Attributes:
        given: the budget asked for (``None``: the default, set by :meth:`plan`).
        eval_samples: the evaluation samples; ``layer_error_samples``: those of the per-layer
            errors; ``methods``: the calibration methods ``--compare-methods`` measures (0:
            not asked for).
        start: when the job's clock started (``time.perf_counter()``: capture).
        total: the budget in seconds (``None`` until :meth:`plan` when not given).
        planned: the estimates :meth:`plan` made, by stage, in the order they run.
        skipped: what the budget left out, each ``{"stage", "what", "why"}``.
        per_sample: what one sample costs in a fake-quant forward (the unit of the estimates).
        search: whether the job searches a recipe (the default total leaves it a share).
    """

    given: float | None = None
    eval_samples: int = 0
    layer_error_samples: int = 0
    methods: int = 0
    start: float = field(default_factory=time.perf_counter)
    total: float | None = None
    planned: dict[str, float] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    per_sample: float = 0.0
    search: bool = True

    def __post_init__(self) -> None:
        if self.given is not None:
            self.total = self.given

    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left of the budget (negative past it; infinite before :meth:`plan`)."""
        return math.inf if self.total is None else self.total - self.elapsed()

    def plan(self, *, points: int, fp32: float, int8: float, search: bool = True) -> None:
        """Estimate the stages to come from the plan's size (``points``) and what one sample
        costs in a forward of the float model (``fp32``) and of the fake-quant model (``int8``);
        set the total when none was given (``search``: whether a recipe search will run: without
        one the default is the core's estimate and a tenth for its error)."""
        self.search = search
        self.per_sample = int8
        export = EXPORT_FIXED + EXPORT_PER_POINT * points
        self.planned = {
            "export": export,
            "fp32_eval": FP32_FORWARDS * fp32 * self.eval_samples,
            "int8_eval": INT8_FORWARDS * int8 * self.eval_samples,
            "layer_errors": LAYER_ERROR_FORWARDS * int8 * self.layer_error_samples,
            "compare_methods": METHOD_FORWARDS * int8 * self.eval_samples * self.methods,
            "lint_report": REPORT_FIXED + REPORT_PER_EXPORT * export,
        }
        if self.total is None:
            core = self.elapsed() + sum(self.planned.values())
            self.total = max(SHARE * core, core + MIN_SEARCH) if search else 1.1 * core

    def reserved(self, after: str | None = None) -> float:
        """The estimated seconds of the planned stages (those after ``after`` in the plan's
        order when given)."""
        names = list(self.planned)
        if after is not None and after in names:
            names = names[names.index(after) + 1 :]
        return sum(self.planned[n] for n in names)

    def search_seconds(self) -> float:
        """What the recipe search (its refit included) may take: what is left after every
        planned stage."""
        return max(0.0, self.left() - self.reserved())

    def fits(self, stage: str, seconds: float) -> bool:
        """Whether ``stage`` (estimated now at ``seconds``) fits in what is left with the planned
        stages after it still to run."""
        return seconds <= self.left() - self.reserved(after=stage)

    def skip(self, stage: str, what: str, why: str) -> None:
        """Record that the budget left ``what`` of ``stage`` out."""
        self.skipped.append({"stage": stage, "what": what, "why": why})

    def describe(self) -> str:
        """One line: the budget, how it was set, and when the job should end."""
        assert self.total is not None
        end = time.strftime("%H:%M:%S", time.localtime(time.time() + self.total - self.elapsed()))
        how = (
            "given"
            if self.given is not None
            else (f"default: {SHARE:g} x the core stages' estimate")
        )
        search = (
            f"the search may take {self.search_seconds():.0f} s"
            if self.search
            else "no recipe search"
        )
        return f"time budget {self.total:.0f} s ({how}); {search}; expected end by {end}"

    def to_report(self) -> dict[str, Any]:
        """``report.json["budget"]``."""
        spent = self.elapsed()
        return {
            "seconds": None if self.total is None else round(self.total, 3),
            "given": self.given is not None,
            "spent": round(spent, 3),
            "within": self.total is None or spent <= self.total,
            "planned": {k: round(v, 3) for k, v in self.planned.items()},
            "skipped": list(self.skipped),
        }
