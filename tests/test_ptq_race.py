"""The recipe search's cross-fitting (issue 33): when one recipe is measurably better than another
(significance and effect size), the race of the close candidates over more folds, and the choice
made on every held-out sample of the folds they completed."""

from __future__ import annotations

import pytest
import torch

from qdq.ptq.race import Margin, Runs
from qdq.ptq.search import Fold, search
from test_ptq_search import _net, _steps_of


def _runs(*scores: torch.Tensor | float) -> Runs:
    r = Runs()
    r.scores.extend(scores)
    return r


def _cos(error: float, n: int = 32, jitter: float = 0.0, seed: int = 0) -> torch.Tensor:
    """Per-sample cosines whose mean error 1 − cosine is exactly ``error``, ``jitter`` apart."""
    noise = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return 1.0 - error + jitter * (noise - noise.mean())


def test_a_consistent_but_tiny_gap_is_not_measurably_better_with_a_ceiling() -> None:
    base = _cos(1e-4, jitter=2e-5)
    tiny, half = _runs(base + 1e-7), _runs(base + 5e-5)  # a 0.1 % and a 50 % cut of the error
    cosine = Margin(significance=1.0, effect=0.1, ceiling=1.0)
    assert cosine.better(tiny, _runs(base)) == (False, cosine.better(tiny, _runs(base))[1])
    better, words = cosine.better(half, _runs(base))
    assert better and "50% of its error 1.0e-04" in words and "32 held-out samples" in words
    # without a known ceiling only the paired test applies: the tiny gap is significant
    assert Margin(significance=1.0, ceiling=None).better(tiny, _runs(base))[0]
    # and a gain within the noise is not, whatever its size
    noisy = _runs(base + torch.tensor([1e-3, -1e-3] * 16, dtype=torch.float64))
    assert not cosine.better(noisy, _runs(base))[0]


def test_one_number_per_candidate_is_compared_with_the_tie() -> None:
    m = Margin(tie=1e-3)
    assert not m.better(_runs(0.9005), _runs(0.9))[0]
    assert m.better(_runs(0.902), _runs(0.9))[0]
    # folds of one number each: their mean
    assert _runs(0.9, 0.8).value() == pytest.approx(0.85)


def _fold_scores(table: dict[str, list[float]], original: torch.Tensor, fold: int):
    """A per-sample score on ``fold``: recipe → its error 1 − cosine there (8 samples)."""

    def score(prepared: torch.nn.Module) -> torch.Tensor:
        name = "+".join(s for s in ("kernel-sum", "bias") if s in _steps_of(prepared, original))
        seed = 10 * fold + list(table).index(name or "none")  # independent noise per recipe
        return _cos(table[name or "none"][fold], n=8, jitter=1e-6, seed=seed)

    return score


@pytest.fixture(scope="module")
def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 10, 10, generator=g) for _ in range(8)]


def test_the_close_candidates_race_over_the_folds_and_the_choice_uses_them_all(
    data: list[torch.Tensor],
) -> None:
    original = _net()[0].weight.detach().clone()
    # fold 0 alone would keep bias (a hair ahead of kernel-sum); on the next fold kernel-sum
    # halves bias's error; none is far behind from the first fold and leaves the race
    table = {
        "none": [1e-2, 1e-2, 1e-2, 1e-2],
        "bias": [1.0e-4, 2e-4, 2e-4, 2e-4],
        "kernel-sum": [1.0001e-4, 1e-4, 1e-4, 1e-4],
    }
    folds = [Fold(data[:6], data[6 + k % 2 :][:1], _fold_scores(table, original, k))
             for k in (1, 2, 3)]  # fmt: skip
    found = search(_net(), (data[0][:1],), data[:6], data[6:7],
                   score=_fold_scores(table, original, 0), candidates=("none", "bias", "kernel-sum"),
                   folds=folds)  # fmt: skip
    rows = {t.recipe: t for t in found.rows}
    assert found.kept.name == "kernel-sum", found.format()
    # after the second fold bias is measurably behind too: with one contender left the race ends
    assert found.folds == 2 and found.held_out == 2
    assert rows["none"].status == "scored on 1 of 2 folds (left the race)"
    assert rows["bias"].folds == rows["kernel-sum"].folds == 2
    assert rows["kernel-sum"].score == pytest.approx(1 - 1e-4, abs=1e-8)
    assert found.to_report()["folds"] == 2 and found.to_report()["margin"]["race"] == 2.0
    # without the folds the first split decides: bias, the best there
    alone = search(_net(), (data[0][:1],), data[:6], data[6:7],
                   score=_fold_scores(table, original, 0),
                   candidates=("none", "bias", "kernel-sum"))  # fmt: skip
    assert alone.kept.name == "bias" and alone.folds == 1


def test_a_candidate_failing_on_a_later_fold_leaves_the_choice(data: list[torch.Tensor]) -> None:
    original = _net()[0].weight.detach().clone()
    table = {"none": [1e-4] * 3, "bias": [1e-4] * 3, "kernel-sum": [1e-4] * 3}

    def failing(prepared: torch.nn.Module) -> torch.Tensor:
        if "bias" in _steps_of(prepared, original):
            raise RuntimeError("planted failure on fold 2")
        return _fold_scores(table, original, 1)(prepared)

    found = search(_net(), (data[0][:1],), data[:6], data[6:7],
                   score=_fold_scores(table, original, 0), candidates=("none", "bias", "kernel-sum"),
                   folds=[Fold(data[:6], data[7:8], failing),
                          Fold(data[:6], data[6:7], _fold_scores(table, original, 2))])  # fmt: skip
    rows = {t.recipe: t for t in found.rows}
    assert rows["bias"].status.startswith("failed: RuntimeError: planted failure on fold 2")
    # the others finished all three folds and are chosen between on all of them
    assert rows["none"].folds == rows["kernel-sum"].folds == 3 and found.folds == 3
    assert found.kept.name == "none" and found.held_out == 3


def test_folds_are_checked(data: list[torch.Tensor]) -> None:
    with pytest.raises(ValueError, match="neither empty"):
        search(_net(), (data[0][:1],), data[:2], data[2:3], folds=[Fold(data[:2], [])])
    with pytest.raises(ValueError, match="every fold needs its own score"):
        search(_net(), (data[0][:1],), data[:2], data[2:3], score=lambda m: 1.0,
               folds=[Fold(data[:2], data[3:4])])  # fmt: skip


#: three close candidates (bias a hair ahead): their error 1 - cosine
CLOSE = {"none": 1.01e-4, "bias": 1.0e-4, "kernel-sum": 1.02e-4}


def _tagged_race(
    costs: dict[str, float], limit: float, errors: dict[str, float] = CLOSE
) -> tuple[dict[str, Runs], int]:
    """:func:`race` over three candidates whose steps were measured at ``costs`` seconds per
    fold (none has no step), within a search budget of ``limit`` seconds."""
    from qdq.ptq.costs import Costs
    from qdq.ptq.race import race
    from qdq.ptq.schedule import Schedule
    from qdq.ptq.search import recipe

    def scores(name: str, fold: int) -> torch.Tensor:  # independent noise per recipe and fold,
        seed = 10 * fold + list(errors).index(name)  # far above their gaps
        return _cos(errors[name], n=16, jitter=1e-4, seed=seed)

    measured = {"bias_correction": (costs["bias"], 8), "kernel_sum": (costs["kernel-sum"], 8)}
    schedule = Schedule(limit, Costs(forward=0.0, calibration=0.0, params=0, layers=0,
                                     flops=1e9, measured=measured), fit=[8] * 3, held=[16] * 3)  # fmt: skip
    recipes = [recipe(name) for name in errors]
    runs_of = {name: _runs(scores(name, 0)) for name in errors}

    def run(r, fold: int, admitted) -> bool:
        runs_of[r.name].scores.append(scores(r.name, fold))
        return True

    used, _ = race(recipes, runs_of, 3, run, Margin(), schedule, False)
    return runs_of, used


def test_a_contender_too_costly_for_the_budget_leaves_the_race() -> None:
    """Measured on the first fold, kernel-sum would take 100 s of a 10 s budget: it leaves
    the race instead of starting, and the others race on. The best so far leaves too when it is
    that costly and not measurably better than the rest; when it is, the race ends at once."""
    runs_of, used = _tagged_race({"none": 0.0, "bias": 0.0, "kernel-sum": 100.0}, limit=10.0)
    assert used == 3 and runs_of["kernel-sum"].folds == 1 and runs_of["kernel-sum"].left == "budget"
    assert runs_of["none"].folds == runs_of["bias"].folds == 3
    assert runs_of["kernel-sum"].trial("kernel-sum", used).status == (
        "scored on 1 of 3 folds (budget)"
    )
    runs_of, used = _tagged_race({"none": 0.0, "bias": 100.0, "kernel-sum": 0.0}, limit=10.0)
    assert used == 3 and runs_of["bias"].folds == 1 and runs_of["bias"].left == "budget"
    assert runs_of["none"].folds == runs_of["kernel-sum"].folds == 3
    # bias a third below the others' error: still in the race at 2 standard errors, but
    # measurably better at 1 (the choice's significance): no race is needed
    ahead = {"none": 1.5e-4, "bias": 1.0e-4, "kernel-sum": 1.5e-4}
    runs_of, used = _tagged_race({"none": 0.0, "bias": 100.0, "kernel-sum": 0.0}, 10.0, ahead)
    assert used == 1 and all(r.folds == 1 and not r.left for r in runs_of.values())
    # within the budget every contender races
    runs_of, used = _tagged_race({"none": 0.0, "bias": 1.0, "kernel-sum": 1.0}, limit=10.0)
    assert used == 3 and all(r.folds == 3 for r in runs_of.values())
