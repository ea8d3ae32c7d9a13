"""The recipe search's choice (issue 33): when one recipe is measurably better than another, the
race of the close candidates over more held-out folds, and the recipe kept.

:func:`qdq.ptq.search.search` scores every candidate on a first held-out share of the calibration
samples. A handful of held-out samples does not rank recipes whose scores are close (on
CREPE-tiny's 8 held-out frames every candidate's output cosine was above 0.99993 and their order
was noise), so the candidates still in contention run again on further folds — calibrated on the
rest of the samples, scored on another disjoint share — and the choice is made on every held-out
sample of the folds they all completed.

"Measurably better" (:class:`Margin`) has two parts when the scores are per sample:

* **significance**: the mean paired gain, sample by sample, exceeds a number of standard errors of
  that gain;
* **effect**: for a score with a ceiling (the default output cosine: 1), the gain also cuts the
  other recipe's error (ceiling − score) by a share. Without it a consistent but meaningless gap
  is significant: two recipes whose outputs differ by 1e-7 on every sample have a gain whose
  standard error is smaller still, and the race would drop one of a pair that is the same model
  for every purpose.

With one number per candidate (a task metric, detection F1) the gain must exceed ``tie``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from qdq._deadline import DeadlinePassed
from qdq._progress import progress

if TYPE_CHECKING:
    from qdq.ptq.recipes import Recipe, Trial
    from qdq.ptq.report import StepReport
    from qdq.ptq.schedule import Admission, Schedule

__all__ = ["RACE", "Margin", "Runs", "choose", "contenders", "describe", "race", "run_one"]

#: a candidate leaves the race over further folds once the best is measurably better than it at
#: this many standard errors (the final choice uses :class:`Margin`'s ``significance``)
RACE = 2.0

Scorer = Callable[[nn.Module], "float | torch.Tensor"]


@dataclass(frozen=True)
class Margin:
    """When a recipe's score is measurably better than another's (module docstring).

    Attributes:
        significance: per-sample scores: standard errors the mean paired gain must exceed.
        tie: one number per candidate: the gain must exceed it.
        effect: per-sample scores with a ``ceiling``: the share of the other recipe's error
            (``ceiling`` − its mean score) the gain must also reach.
        ceiling: the best possible score (1 for a cosine); ``None``: unknown, ``effect`` unused.
    """

    significance: float = 1.0
    tie: float = 1e-4
    effect: float = 0.1
    ceiling: float | None = None

    def better(self, top: Runs, other: Runs, z: float | None = None) -> tuple[bool, str]:
        """Whether ``top`` is measurably better than ``other`` (at ``z`` standard errors, default
        ``significance``), and the test in words."""
        z = self.significance if z is None else z
        mine, best = other.per_sample(), top.per_sample()
        if mine is not None and best is not None and mine.shape == best.shape:
            gain = best - mine
            mean = float(gain.mean())
            se = float(gain.std() / math.sqrt(gain.numel()))
            words = f"{mean:.2e} ± {se:.1e} (standard error, {gain.numel()} held-out samples)"
            floor = 0.0
            if self.ceiling is not None and self.effect > 0:
                error = self.ceiling - float(mine.mean())
                floor = self.effect * error
                if error > 0:
                    words += f", {mean / error:.0%} of its error {error:.1e}"
            return mean > z * se and mean > floor, words
        gap = (top.value() or 0.0) - (other.value() or 0.0)
        return gap > self.tie, f"{gap:.2e} (one number each; tie {self.tie:g})"

    def out_of_reach(self, other: Runs, simplest: Runs, z: float) -> bool:
        """Whether ``other`` cannot plausibly become measurably better than ``simplest``: even
        its mean per-sample gain plus ``z`` standard errors stays below the effect floor (the
        share ``effect`` of ``simplest``'s error). Only for per-sample scores with a ceiling."""
        mine, base = other.per_sample(), simplest.per_sample()
        if self.ceiling is None or mine is None or base is None or mine.shape != base.shape:
            return False
        gain = mine - base
        upper = float(gain.mean()) + z * float(gain.std() / math.sqrt(gain.numel()))
        return upper <= self.effect * (self.ceiling - float(base.mean()))


class Runs:
    """One candidate's runs: its score on each fold it completed, its seconds and status."""

    def __init__(self) -> None:
        self.scores: list[torch.Tensor | float] = []
        self.seconds = 0.0
        self.status = ""  # "" while it runs well, else "skipped (budget ...)" or "failed: ..."
        self.left = ""  # why it stopped before the last fold: "left the race" or "budget"
        self.steps: tuple[str, ...] = ()
        self.stopped = False  # its last run was stopped by the deadline (qdq._deadline)

    @property
    def folds(self) -> int:
        return len(self.scores)

    def per_sample(self) -> torch.Tensor | None:
        """Every fold's per-sample scores in one tensor (``None``: a fold gave one number)."""
        if not self.scores or not all(isinstance(s, torch.Tensor) for s in self.scores):
            return None
        joined = torch.cat([s.reshape(-1) for s in self.scores if isinstance(s, torch.Tensor)])
        return joined if joined.numel() > 1 else None

    def value(self) -> float | None:
        """The mean over every held-out sample scored (per fold: over its one number)."""
        joined = self.per_sample()
        if joined is not None:
            return float(joined.mean())
        if not self.scores:
            return None
        return sum(float(s.mean()) if isinstance(s, torch.Tensor) else s
                   for s in self.scores) / len(self.scores)  # fmt: skip

    def scored(self) -> bool:
        value = self.value()
        return not self.status and value is not None and math.isfinite(value)

    def trial(self, name: str, used: int, iters: int | None = None) -> Trial:
        from qdq.ptq.recipes import Trial

        status = self.status or "scored"
        if status == "scored" and self.folds < used:
            status = f"scored on {self.folds} of {used} folds ({self.left or 'left the race'})"
        return Trial(name, self.value(), self.seconds, status, self.steps, self.folds, iters)


def run_one(
    runs: Runs, make: Callable[[], tuple[nn.Module, tuple[StepReport, ...]]], scorer: Scorer
) -> tuple[float, nn.Module, tuple[StepReport, ...]] | None:
    """Build one candidate on one fold and score it; record the score (a failure is its status,
    not the end of the search). Returns the mean score, the model and its step reports."""
    start = time.perf_counter()
    runs.stopped = False
    try:
        prepared, done = make()
        got = scorer(prepared)
        value: torch.Tensor | float
        if isinstance(got, torch.Tensor) and got.dim() == 1:
            value = got.detach().double().cpu()
        else:
            value = float(got)
        runs.scores.append(value)
        runs.steps = runs.steps or tuple(d.summary() for d in done)
    except DeadlinePassed:  # the caller says what it means (qdq._deadline)
        runs.stopped = True
        return None
    except Exception as err:  # a failing candidate is a row, not the end of the search
        runs.status = f"failed: {type(err).__name__}: {err}"[:300]
        return None
    finally:
        runs.seconds += time.perf_counter() - start
    mean = float(value.mean()) if isinstance(value, torch.Tensor) else value
    return mean, prepared, done


def race(
    recipes: Sequence[Recipe],
    runs_of: dict[str, Runs],
    folds: int,
    run: Callable[[Recipe, int, Admission], bool],
    margin: Margin,
    schedule: Schedule,
    show_progress: bool,
) -> tuple[int, str]:
    """Run the candidates still in contention on folds 1 … ``folds`` − 1 in turn, within the
    search's budget (``schedule``); return how many folds the choice is made on (those every
    remaining candidate completed) and, when the race ended early, why.

    ``run(recipe, fold, admission)`` runs one candidate on one fold and returns ``False`` when
    the deadline stopped it. A contender whose estimate (its measured cost, AdaRound with the
    iterations it ran on the first fold) does not fit in what is left leaves the race
    (``budget``) instead of starting. When the best so far does not fit, the race ends there if
    it is measurably better than every other contender; else it leaves and the others race on.
    The race also ends when it is **decided**: no contender can plausibly become measurably
    better than the simplest one (:meth:`Margin.out_of_reach`), so more folds would keep the
    simplest whatever they show."""
    used = 1
    for fold in range(1, folds):
        alive = [r for r in recipes if runs_of[r.name].folds == fold and runs_of[r.name].scored()]
        alive = contenders(alive, runs_of, margin)
        if len(alive) < 2:
            break
        for r in recipes:
            if runs_of[r.name].folds == fold and r not in alive and not runs_of[r.name].left:
                runs_of[r.name].left = "left the race"
        simplest = min(alive, key=lambda r: (len(r.steps), list(recipes).index(r)))
        if all(margin.out_of_reach(runs_of[r.name], runs_of[simplest.name], RACE)
               for r in alive if r is not simplest):  # fmt: skip
            return used, (
                f"the race ended after {used} fold(s): no contender can become measurably "
                f"better than the simplest, {simplest.name}"
            )
        top = _best(alive, runs_of)
        while not _fits(schedule, top, fold, alive) and len(alive) > 1:
            # the best so far cannot run once more within the budget: when it is measurably
            # better than every other contender the choice needs no race; else it leaves the
            # race and the others race on (its one fold cannot be weighed against their folds)
            rest = [r for r in alive if r is not top]
            if all(margin.better(runs_of[top.name], runs_of[r.name])[0] for r in rest):
                return used, ""
            runs_of[top.name].left = "budget"
            alive = rest
            top = _best(alive, runs_of)
        if len(alive) < 2:
            break
        cut = False
        for r in progress(alive, total=len(alive), desc=f"recipe search, fold {fold + 1}",
                          enabled=show_progress):  # fmt: skip
            admitted = schedule.admit(r, fold, held_back=alive, shorten=False)
            if cut or not admitted.run:
                if r is top or cut:
                    cut = True
                else:
                    runs_of[r.name].left = "budget"  # its run would overrun what is left
                continue
            if not run(r, fold, admitted):
                cut = True
        alive = [r for r in alive if runs_of[r.name].folds > fold or runs_of[r.name].status]
        finished = [r for r in alive if runs_of[r.name].scored()]
        if cut or len(finished) < 2:
            # the budget ran out within the fold (or too few were left to choose between): the
            # choice is made on the folds before, where every contender has its scores
            for r in alive:
                if runs_of[r.name].folds > fold:
                    runs_of[r.name].scores.pop()
                runs_of[r.name].left = runs_of[r.name].left or (
                    "budget" if cut else "too few finished that fold"
                )
            break
        used = fold + 1
    return used, ""


def _fits(schedule: Schedule, r: Recipe, fold: int, alive: list[Recipe]) -> bool:
    return schedule.admit(r, fold, held_back=alive, shorten=False).run


def _best(alive: list[Recipe], runs_of: dict[str, Runs]) -> Recipe:
    """The candidate with the best score so far."""
    return max(alive, key=lambda r: runs_of[r.name].value() or 0.0)


def contenders(alive: list[Recipe], runs_of: dict[str, Runs], margin: Margin) -> list[Recipe]:
    """The candidates the best so far is not measurably better than at :data:`RACE` standard
    errors (with the margin's effect size), the best included."""
    if not alive:
        return []
    top = _best(alive, runs_of)
    return [
        r
        for r in alive
        if r is top or not margin.better(runs_of[top.name], runs_of[r.name], RACE)[0]
    ]


def choose(
    recipes: Sequence[Recipe], runs_of: dict[str, Runs], used: int, margin: Margin
) -> tuple[Recipe, str]:
    """Among the candidates scored on all ``used`` folds: the best, or the one with the fewest
    steps (then the earliest) that the best is not measurably better than; and why."""
    final = [r for r in recipes if runs_of[r.name].scored() and runs_of[r.name].folds == used]
    if not final:
        first = recipes[0]
        return first, f"no candidate could be scored; kept the first, {first.name}"
    top = _best(final, runs_of)
    best = runs_of[top.name]
    close = [r for r in final if r is top or not margin.better(best, runs_of[r.name])[0]]
    simplest = min(close, key=lambda r: (len(r.steps), list(recipes).index(r)))
    value = best.value() or 0.0
    if simplest is top:
        return top, f"the best held-out score ({value:.6f})"
    words = margin.better(best, runs_of[simplest.name])[1]
    return simplest, (
        f"fewer steps and not measurably worse than the best held-out score ({top.name}: "
        f"{value:.6f}; its gain {words})"
    )


def describe(margin: Margin) -> dict[str, Any]:
    """The margin's settings for the report."""
    return {"significance": margin.significance, "tie": margin.tie, "effect": margin.effect,
            "ceiling": margin.ceiling, "race": RACE}  # fmt: skip
