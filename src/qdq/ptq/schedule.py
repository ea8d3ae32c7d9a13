"""The recipe search inside its time budget: what runs, in which order, and what is left out.

:func:`qdq.ptq.search.search` has one budget for all of its work — the first pass over the
candidates and the race over further folds — and, when the caller will refit the kept recipe on
every calibration sample, the refit's estimate is held back from it too. :class:`Schedule` keeps
the clock and the estimates (:class:`qdq.ptq.costs.Costs`):

* **order**: the first candidate (``none``: the calibrated model itself) runs first and measures
  one fake-quant forward; the others then run cheapest first by their estimate (ties in the
  order given), so that what the budget cuts is the expensive tail;
* **admission**: a candidate starts only when its estimate — its base calibration if not made
  yet (the equalized copy), its steps and its scoring — plus the refit of the costliest
  candidate scored so far and the race of the candidates in contention so far over the other
  folds fits in what is left (a reliable choice among the candidates already close beats one
  more candidate scored on a few samples); AdaRound is shortened to the iterations that fit
  (at least :data:`qdq.ptq.costs.MIN_ADAROUND_ITERS`) before it is skipped; what does not run is
  listed with its estimate and the seconds that were left;
* **the stop**: a candidate runs under a deadline of the budget's end plus its own estimate
  (:mod:`qdq._deadline`): one that runs over its estimate is stopped at the next step of its
  loops, so the search never overruns by more than the estimate of one step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdq.ptq.costs import MIN_ADAROUND_ITERS, Costs

if TYPE_CHECKING:
    from qdq.ptq.recipes import Recipe

__all__ = ["Admission", "Schedule"]


@dataclass(frozen=True)
class Admission:
    """Whether a candidate runs now: ``iters`` is AdaRound's (shortened) iterations, ``why``
    the reason when it does not run."""

    run: bool
    estimate: float
    iters: int | None = None
    why: str = ""


@dataclass
class Schedule:
    """The search's clock and estimates (module docstring).

    Attributes:
        budget: seconds for the whole search.
        costs: the estimates.
        fit: calibration samples per fold (fold 0 first); ``held``: held-out samples per fold.
        refit: the share of a candidate's step seconds its refit costs (every calibration sample
            against a fold's; 0: the caller does not refit).
        iters: AdaRound's iterations as asked; ``samples``: its samples.
        start: when the search started (``time.perf_counter()``).
        built: the bases ``(fold, equalized)`` made so far.
        iters_of: the AdaRound iterations each admitted AdaRound candidate runs.
    """

    budget: float
    costs: Costs
    fit: Sequence[int]
    held: Sequence[int]
    refit: float = 0.0
    iters: int = 500
    samples: int = 256
    start: float = field(default_factory=time.perf_counter)
    built: set[tuple[int, bool]] = field(default_factory=set)
    iters_of: dict[str, int] = field(default_factory=dict)

    @property
    def deadline(self) -> float:
        """When the budget ends (``time.perf_counter()`` seconds)."""
        return self.start + self.budget

    def left(self) -> float:
        """Seconds left of the budget (negative past it)."""
        return self.deadline - time.perf_counter()

    def spent(self) -> float:
        """Seconds since the search started."""
        return time.perf_counter() - self.start

    def estimate(self, r: Recipe, fold: int = 0, iters: int | None = None) -> float:
        """Seconds to run ``r`` on ``fold``: its base when not made yet, its steps, scoring."""
        samples = self.fit[fold]
        seconds = self.costs.score(self.held[fold])
        if r.equalize and (fold, True) not in self.built:
            seconds += self.costs.step("equalize", samples)
        for key in r.steps:
            if key != "equalize":
                seconds += self.costs.step(key, samples, iters=iters or self.iters)
        return seconds

    def race_estimate(self, contenders: Sequence[Recipe], folds: int) -> float:
        """Seconds to run ``contenders`` on folds 1 … ``folds`` − 1 (0 with fewer than two)."""
        if len(contenders) < 2 or folds < 2:
            return 0.0
        return sum(self.estimate(r, k, self.iters_of.get(r.name))
                   for r in contenders for k in range(1, folds))  # fmt: skip

    def refit_estimate(self, r: Recipe, iters: int | None = None) -> float:
        """Seconds to refit ``r`` on every calibration sample (0 without a refit)."""
        if not self.refit:
            return 0.0
        samples = math.ceil(self.fit[0] * self.refit)
        return sum(self.costs.step(k, samples, iters=iters or self.iters) for k in r.steps)

    def order(self, recipes: Sequence[Recipe]) -> list[Recipe]:
        """The first recipe, then the others cheapest first (stable)."""
        if not recipes:
            return []
        rest = sorted(recipes[1:], key=lambda r: self.estimate(r))
        return [recipes[0], *rest]

    def admit(
        self,
        r: Recipe,
        fold: int = 0,
        held_back: Iterable[Recipe] = (),
        *,
        first: bool = False,
        shorten: bool = True,
        reserve: float = 0.0,
    ) -> Admission:
        """Whether ``r`` runs on ``fold`` now (module docstring); ``held_back``: the candidates
        whose refit must stay affordable (the scored ones); ``reserve``: seconds held back for
        other work (the race of the contenders so far); ``first`` always runs; without
        ``shorten``, AdaRound runs the iterations it ran before (a fold of the race must run the
        recipe the first fold scored) or not at all."""
        left = self.left() - reserve
        reserve = max((self.refit_estimate(c, self.iters_of.get(c.name)) for c in held_back),
                      default=0.0)  # fmt: skip

        def need(iters: int | None) -> float:
            return self.estimate(r, fold, iters) + max(reserve, self.refit_estimate(r, iters))

        wanted = self.iters_of.get(r.name, self.iters) if "adaround" in r.steps else None
        fits = need(wanted) <= left
        if not (first or fits) and wanted is not None and shorten:  # AdaRound: what fits
            low, high = 0, wanted
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if need(mid) <= left else (low, mid - 1)
            if low >= min(wanted, MIN_ADAROUND_ITERS):
                wanted, fits = low, True
        if first or fits:
            if wanted is not None:
                self.iters_of[r.name] = wanted
            return Admission(True, self.estimate(r, fold, wanted), wanted)
        estimate = self.estimate(r, fold)
        return Admission(False, estimate, why=f"skipped (budget: needs ~{_seconds(estimate)}, "
                                              f"{_seconds(max(left - reserve, 0))} left)")  # fmt: skip


def _seconds(x: float) -> str:
    return f"{x:.2g} s" if x < 1 else f"{x:.1f} s"
