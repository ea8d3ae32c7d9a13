"""The recipe search inside its time budget (issue 47): cheapest candidates first, admission by
estimate with the refit held back, AdaRound shortened to fit, a candidate past its estimate
stopped at its next step, and a race that ends once it is decided."""

from __future__ import annotations

import time

import pytest
import torch

from qdq._progress import progress
from qdq.ptq import search as search_module
from qdq.ptq.costs import MIN_ADAROUND_ITERS, Costs
from qdq.ptq.schedule import Schedule
from qdq.ptq.search import recipe, search
from test_ptq_search import _net


def _costs(**measured: tuple[float, int]) -> Costs:
    # one AdaRound iteration: 6 * 1024 * 1000 / 1e9 + 4e-4 * 2 ≈ 7 ms; a forward: 1 ms
    return Costs(forward=1e-3, calibration=0.1, params=1000, layers=2, flops=1e9,
                 measured=dict(measured))  # fmt: skip


def test_adaround_is_shortened_to_fit_and_skipped_below_the_fewest_iterations() -> None:
    ada = recipe("adaround")
    full = Schedule(60.0, _costs(), fit=[16], held=[8])
    assert full.admit(ada).iters == 500  # fits whole
    short = Schedule(2.0, _costs(), fit=[16], held=[8])
    admitted = short.admit(ada)
    assert admitted.run and MIN_ADAROUND_ITERS <= admitted.iters < 500
    assert (
        short.estimate(ada, 0, admitted.iters) <= 2.0
        and short.iters_of["adaround"] == admitted.iters
    )
    # a fold of the race runs the iterations the first fold ran, or nothing
    assert not Schedule(0.3, _costs(), fit=[16], held=[8]).admit(ada, shorten=False).run
    tiny = Schedule(0.3, _costs(), fit=[16], held=[8]).admit(ada)
    assert not tiny.run and tiny.why.startswith("skipped (plan: needs ~3.") and tiny.iters is None


def test_the_refit_of_the_costliest_scored_candidate_is_held_back() -> None:
    bias, none = recipe("bias"), recipe("none")
    costs = _costs(bias_correction=(1.0, 16))  # measured: 1 s on the 16 samples of a fold
    alone = Schedule(1.5, costs, fit=[16], held=[8])
    assert alone.admit(bias).run and alone.refit_estimate(bias) == 0.0
    # refitting on 4/3 of the samples would cost 1.33 s more: it no longer fits
    refit = Schedule(1.5, costs, fit=[16], held=[8], refit=4 / 3)
    assert refit.refit_estimate(bias) == pytest.approx(1.0 * 22 / 16)
    assert not refit.admit(bias).run
    # none (scoring alone, 8 ms) fits, unless the refit of a scored bias must fit too
    tight = Schedule(1.38, costs, fit=[16], held=[8], refit=4 / 3)
    assert tight.admit(none).run and not tight.admit(none, held_back=[bias]).run
    assert Schedule(3.0, costs, fit=[16], held=[8], refit=4 / 3).admit(bias).run


@pytest.fixture(scope="module")
def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 10, 10, generator=g) for _ in range(8)]


def test_the_first_candidate_runs_first_and_an_expensive_one_is_skipped_with_its_estimate(
    monkeypatch, data: list[torch.Tensor]
) -> None:
    """On a machine that multiplies matrices at 1 Mflop/s, AdaRound's 500 iterations are
    estimated far beyond a 20 s budget: it is skipped (its estimate said) and the cheap ones
    run, the first one first."""
    monkeypatch.setattr(search_module, "matmul_flops", lambda: 1e6)
    found = search(_net(), (data[0][:1],), data[:2], data[2:3], budget=20.0,
                   candidates=("none", "adaround", "kernel-sum", "bias"))  # fmt: skip
    assert found.order[0] == "none" and sorted(found.order) == ["bias", "kernel-sum", "none"]
    rows = {t.recipe: t for t in found.rows}
    assert rows["adaround"].status.startswith("skipped (budget: needs ~")
    assert [t.recipe for t in found.rows] == ["none", "adaround", "kernel-sum", "bias"]
    report = found.to_report()
    assert report["order"] == list(found.order) and report["seconds"] >= 0


def test_the_cheap_candidates_run_before_the_costly_one() -> None:
    costs = _costs(bias_correction=(1.0, 16), kernel_sum=(0.5, 16))
    schedule = Schedule(60.0, costs, fit=[16], held=[8])
    cands = [recipe(n) for n in ("none", "adaround", "bias", "kernel-sum+bias", "kernel-sum")]
    assert [r.name for r in schedule.order(cands)] == [
        "none", "kernel-sum", "bias", "kernel-sum+bias", "adaround"]  # fmt: skip


def test_a_candidate_past_the_budget_and_its_estimate_is_stopped(monkeypatch, data) -> None:
    """Estimated at well under a second, a bias correction that takes 10 s is stopped at its
    next step once the budget's end and its estimate are past: it does not run to its end."""
    real = search_module.step_runs
    steps_done = []

    def slow_runs(batches, **kwargs):
        runs = real(batches, **kwargs)

        def slow(prepared):
            for _ in progress(range(1000), total=1000, desc="slow", enabled=False):
                time.sleep(0.01)
                steps_done.append(1)
            return runs["bias_correction"](prepared)

        return {**runs, "bias_correction": slow}

    monkeypatch.setattr(search_module, "step_runs", slow_runs)
    found = search(_net(), (data[0][:1],), data[:2], data[2:3], budget=5.0,
                   candidates=("none", "bias"))  # fmt: skip
    rows = {t.recipe: t for t in found.rows}
    assert rows["bias"].status.startswith("stopped (budget: ran past the budget's end")
    assert rows["bias"].score is None and 0 < len(steps_done) < 3000
    assert found.clock_cut == ("bias (fold 1) stopped",)  # the result depended on the clock
    assert found.kept.name == "none"


def test_a_race_that_is_decided_ends() -> None:
    """Every candidate within a hair of the others on every sample (the output cosine, whose
    ceiling is 1): more folds cannot make one measurably better than the simplest, so the race
    ends before the second fold; with a real gap it races on."""
    from qdq.ptq.race import Margin, Runs, race
    from test_ptq_race import _cos

    def raced(errors: dict[str, float]) -> tuple[int, str, dict[str, Runs]]:
        runs_of = {}
        for i, name in enumerate(errors):
            runs_of[name] = Runs()
            runs_of[name].scores.append(_cos(errors[name], n=32, jitter=1e-7, seed=i))
        schedule = Schedule(60.0, _costs(), fit=[8] * 3, held=[32] * 3)

        def run(r, fold, admitted) -> bool:
            runs_of[r.name].scores.append(_cos(errors[r.name], n=32, jitter=1e-7, seed=9 + fold))
            return True

        used, note = race([recipe(n) for n in errors], runs_of, 3, run,
                          Margin(ceiling=1.0), schedule, False)  # fmt: skip
        return used, note, runs_of

    used, note, runs_of = raced({"none": 1e-3, "bias": 0.9999e-3, "kernel-sum": 1.0001e-3})
    assert used == 1 and all(r.folds == 1 for r in runs_of.values())
    assert note == ("the race ended after 1 fold(s): no contender can become measurably "
                    "better than the simplest, none")  # fmt: skip
    # bias cuts none's error by 5 %: under the 10 % effect floor, but plausibly above it on
    # more samples at this noise? no: the noise is tiny, so it is decided too; at 20 % it is
    # measurably better at once and the others leave
    used, note, _ = raced({"none": 1e-3, "bias": 0.95e-3, "kernel-sum": 1e-3})
    assert used == 1 and note.startswith("the race ended")
    used, note, runs_of = raced({"none": 1e-3, "bias": 0.8e-3, "kernel-sum": 1e-3})
    assert used == 1 and note == "" and runs_of["bias"].folds == 1


def test_the_race_of_the_contenders_so_far_is_held_back() -> None:
    """Two close cheap candidates would race over 3 more folds: a costly candidate that fits in
    the budget alone does not start when it would leave no time for that race."""
    bias, ks, ada = recipe("bias"), recipe("kernel-sum"), recipe("adaround")
    costs = _costs(bias_correction=(1.0, 16), kernel_sum=(0.5, 16))
    schedule = Schedule(8.0, costs, fit=[16] * 4, held=[8] * 4, iters=500)
    race = schedule.race_estimate([bias, ks], 4)
    assert race == pytest.approx(3 * (1.0 + 0.5 + 2 * 8e-3))
    assert schedule.race_estimate([bias], 4) == 0.0  # one contender: no race
    assert schedule.admit(ada, shorten=False).run  # ~3.5 s alone fits in 8 s
    assert not schedule.admit(ada, reserve=race, shorten=False).run
