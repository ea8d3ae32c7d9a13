"""The recipe search's plan: what runs, in which order, and what is left out — decided by
counts, not by the clock (issue 57).

:func:`qdq.ptq.search.search` has one allowance of **work** for all of its work — the first pass
over the candidates and the race over further folds — and, when the caller will refit the kept
recipe on every calibration sample, the refit's estimate is held back from it too. Work is
counted in nominal seconds (:mod:`qdq.ptq.counts`): the estimates (:class:`qdq.ptq.costs.Costs`)
come from the model's counts, and what a candidate is charged is its estimate, never what it
took, so the plan is the same on an idle and on a loaded machine. :class:`Schedule` keeps the
allowance and the estimates:

* **order**: the first candidate (``none``: the calibrated model itself) runs first; the others
  then run cheapest first by their estimate (ties in the order given), so that what the
  allowance cuts is the expensive tail;
* **admission**: a candidate starts only when its estimate — its base calibration if not made
  yet (the equalized copy), its steps and its scoring — plus the refit of the costliest
  candidate scored so far and the race of the candidates in contention so far over the other
  folds fits in the work left (a reliable choice among the candidates already close beats one
  more candidate scored on a few samples); AdaRound is shortened to the iterations that fit
  (at least :data:`qdq.ptq.costs.MIN_ADAROUND_ITERS`) before it is skipped; what does not run is
  listed with its estimate and the work that was left;
* **the clock** stops work only when asked: the caller's own seconds (``clock``: the user's
  ``--time-budget`` / ``--search-budget``; a candidate whose *measured* estimate, ``timed``,
  does not fit in the seconds left does not start, AdaRound is shortened) or a hard ceiling
  (``hard``: a stop only). A candidate runs under a deadline of that end plus its own estimate
  (:mod:`qdq._deadline`). Whatever the clock cut is listed in :attr:`Schedule.cut`: the result
  then depended on the clock, and the caller says so.
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
    the reason when it does not run; ``estimate`` its work (nominal seconds, what it is
    charged), ``seconds`` its measured estimate (the deadline's grace; 0 without a clock)."""

    run: bool
    estimate: float
    iters: int | None = None
    why: str = ""
    seconds: float = 0.0
    clock: bool = False  # the clock, not the plan, kept it from running (or shortened it)


@dataclass
class Schedule:
    """The search's plan and its clock (module docstring).

    Attributes:
        budget: the work allowed the whole search (nominal seconds, :mod:`qdq.ptq.counts`).
        costs: the deterministic estimates (nothing measured is recorded in them).
        fit: calibration samples per fold (fold 0 first); ``held``: held-out samples per fold.
        refit: the share of a candidate's step seconds its refit costs (every calibration sample
            against a fold's; 0: the caller does not refit).
        iters: AdaRound's iterations as asked; ``samples``: its samples.
        start: when the search started (``time.perf_counter()``).
        built: the bases ``(fold, equalized)`` made so far.
        iters_of: the AdaRound iterations each admitted AdaRound candidate runs.
        clock: the caller's seconds for the search (``None``: none): admission by ``timed``.
        hard: a hard ceiling in seconds (``None``: none): a stop, never an estimate.
        timed: the measured estimates the clock admits by (default: ``costs``).
        done: the work charged so far (the estimates of what ran).
        cut: what the clock cut (empty: the plan ran as counted).
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
    clock: float | None = None
    hard: float | None = None
    timed: Costs | None = None
    done: float = 0.0
    cut: list[str] = field(default_factory=list)

    def left(self) -> float:
        """Work left of the allowance (negative past it)."""
        return self.budget - self.done

    def charge(self, work: float) -> None:
        """Charge ``work`` (an admitted estimate) to the allowance."""
        self.done += work

    def spent(self) -> float:
        """Seconds since the search started."""
        return time.perf_counter() - self.start

    def seconds_left(self) -> float:
        """Seconds left before the clock's end (``clock`` or ``hard``; infinite without)."""
        ends = [x for x in (self.clock, self.hard) if x is not None]
        return min(ends) - self.spent() if ends else math.inf

    def stop_at(self, grace: float) -> float | None:
        """The deadline of one run (``time.perf_counter()``): the caller's end plus ``grace``
        (the run's measured estimate), and the hard ceiling; ``None``: no clock."""
        ends = [self.start + self.clock + grace] if self.clock is not None else []
        ends += [self.start + self.hard] if self.hard is not None else []
        return min(ends) if ends else None

    @property
    def ends(self) -> float | None:
        """When the clock ends (``time.perf_counter()`` seconds; ``None``: no clock)."""
        left = self.seconds_left()
        return None if left == math.inf else time.perf_counter() + left

    def estimate(
        self, r: Recipe, fold: int = 0, iters: int | None = None, costs: Costs | None = None
    ) -> float:
        """Work to run ``r`` on ``fold``: its base when not made yet, its steps, scoring
        (``costs``: other estimates, e.g. the measured ones)."""
        costs = costs or self.costs
        samples = self.fit[fold]
        seconds = costs.score(self.held[fold])
        if r.equalize and (fold, True) not in self.built:
            seconds += costs.step("equalize", samples)
        for key in r.steps:
            if key != "equalize":
                seconds += costs.step(key, samples, iters=iters or self.iters)
        return seconds

    def race_estimate(self, contenders: Sequence[Recipe], folds: int) -> float:
        """Work to run ``contenders`` on folds 1 … ``folds`` − 1 (0 with fewer than two)."""
        if len(contenders) < 2 or folds < 2:
            return 0.0
        return sum(self.estimate(r, k, self.iters_of.get(r.name))
                   for r in contenders for k in range(1, folds))  # fmt: skip

    def refit_estimate(
        self, r: Recipe, iters: int | None = None, costs: Costs | None = None
    ) -> float:
        """Work to refit ``r`` on every calibration sample (0 without a refit)."""
        if not self.refit:
            return 0.0
        samples = math.ceil(self.fit[0] * self.refit)
        return sum((costs or self.costs).step(k, samples, iters=iters or self.iters)
                   for k in r.steps)  # fmt: skip

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
        """Whether ``r`` runs on ``fold`` now (module docstring): by the plan (the work left),
        then by the clock when there is one; ``held_back``: the candidates whose refit must
        stay affordable (the scored ones); ``reserve``: work held back for other work (the race
        of the contenders so far); ``first`` always runs (unless the clock has ended); without
        ``shorten``, AdaRound runs the iterations it ran before (a fold of the race must run
        the recipe the first fold scored) or not at all."""
        held = list(held_back)
        wanted = self.iters_of.get(r.name, self.iters) if "adaround" in r.steps else None
        ok, iters = self._fits(r, fold, held, self.left() - reserve, wanted, self.costs,
                               first=first, shorten=shorten)  # fmt: skip
        estimate = self.estimate(r, fold, iters if ok else None)
        if not ok:
            left = max(self.left() - reserve - self._reserve(held, self.costs), 0)
            return Admission(False, estimate, why=f"skipped (plan: needs ~{_seconds(estimate)} "
                                                  f"of work, {_seconds(left)} left)")  # fmt: skip
        seconds, clocked = 0.0, self.clock is not None or self.hard is not None
        if clocked:
            timed = self.timed or self.costs
            if self.clock is not None:  # the caller's seconds: admission by what was measured
                ok2, iters2 = self._fits(r, fold, held, self.seconds_left(), iters, timed,
                                         first=first, shorten=shorten)  # fmt: skip
            else:  # a hard ceiling: only once it has passed
                ok2, iters2 = first or self.seconds_left() > 0, iters
            seconds = self.estimate(r, fold, iters2 if ok2 else iters, timed)
            if not ok2:
                left = max(self.seconds_left() - self._reserve(held, timed), 0)
                self.cut.append(f"{r.name} (fold {fold + 1}) not run")
                return Admission(False, estimate, why=f"skipped (budget: needs ~{_seconds(seconds)}"
                                                      f", {_seconds(left)} left)", clock=True)  # fmt: skip
            if iters2 != iters:
                self.cut.append(f"{r.name}: AdaRound {iters2} of {iters} iterations")
                iters, estimate = iters2, self.estimate(r, fold, iters2)
        if iters is not None:
            self.iters_of[r.name] = iters
        return Admission(True, estimate, iters, seconds=seconds)

    def _reserve(self, held: Sequence[Recipe], costs: Costs) -> float:
        return max((self.refit_estimate(c, self.iters_of.get(c.name), costs) for c in held),
                   default=0.0)  # fmt: skip

    def _fits(
        self,
        r: Recipe,
        fold: int,
        held: Sequence[Recipe],
        left: float,
        wanted: int | None,
        costs: Costs,
        *,
        first: bool,
        shorten: bool,
    ) -> tuple[bool, int | None]:
        """Whether ``r`` fits in ``left`` by ``costs`` with the refit of ``held`` kept
        affordable, and AdaRound's iterations (shortened when ``shorten``)."""
        reserve = self._reserve(held, costs)

        def need(iters: int | None) -> float:
            return self.estimate(r, fold, iters, costs) + max(
                reserve, self.refit_estimate(r, iters, costs)
            )

        if first or need(wanted) <= left:
            return True, wanted
        if wanted is not None and shorten:  # AdaRound: what fits
            low, high = 0, wanted
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if need(mid) <= left else (low, mid - 1)
            if low >= min(wanted, MIN_ADAROUND_ITERS):
                return True, low
        return False, None


def _seconds(x: float) -> str:
    return f"{x:.2g} s" if x < 1 else f"{x:.1f} s"
