"""The recipe search (issue 33): recipe names, the choice on planted scores (each candidate the
right one in turn, ties to the simpler recipe, the budget, a failing candidate), a real search with
the default score, and its report."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import qdq
from qdq.ptq.search import CANDIDATES, recipe, search


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4),
    ).eval()  # fmt: skip


@pytest.fixture(scope="module")
def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 10, 10, generator=g) for _ in range(3)]


def test_recipe_names_are_parsed_into_pipeline_order() -> None:
    assert recipe("bias+kernel-sum").name == "kernel-sum+bias"
    assert recipe("adaround+equalize").steps == ("equalize", "adaround")
    assert recipe(" none ").steps == ()
    assert all(recipe(c).name == c for c in CANDIDATES)
    for bad, match in (("kernel-sum+adaround", "two roundings"), ("bias+bias", "twice"),
                       ("sharpen", "unknown recipe part"), ("", "a recipe is")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            recipe(bad)


def test_ptq_options_and_recipe_names_go_both_ways() -> None:
    from qdq.pipeline.improve import PtqOptions

    for name in ("none", *CANDIDATES, "equalize+method+kernel-sum+bias"):
        assert PtqOptions.from_recipe(name).recipe == recipe(name).name
    options = PtqOptions.from_recipe("adaround+bias", adaround_iters=7)
    assert (options.rounding, options.bias_correction, options.adaround_iters) == (
        "adaround",
        True,
        7,
    )


def _steps_of(prepared: torch.nn.Module, original: torch.Tensor) -> set[str]:
    """Which steps were applied to ``prepared``, read off its state."""
    found = set()
    for q in qdq.quantizers_of(prepared).values():
        learned = q.learned if q.spec.axis is not None else {}
        if "rounding" in learned:
            found.add("kernel-sum" if learned["rounding"]["method"] == "kernel-sum" else "adaround")
        if "bias_correction" in learned:
            found.add("bias")
    if not torch.equal(prepared[0].weight.detach(), original):
        found.add("equalize")
    return found


_PLANTED = ["none", "kernel-sum", "bias", "kernel-sum+bias", "equalize", "adaround+bias"]


@pytest.mark.parametrize("right", _PLANTED)
def test_the_planted_best_recipe_is_kept(right: str, data: list[torch.Tensor]) -> None:
    original = _net()[0].weight.detach().clone()
    want = set(recipe(right).name.split("+")) - {"none"}

    def score(prepared: torch.nn.Module) -> float:
        steps = _steps_of(prepared, original)
        return 1.0 if steps == want else 0.5 - 0.01 * len(steps ^ want)

    # a budget no load exhausts: every candidate runs, whatever the machine's speed
    found = search(_net(), (data[0][:1],), data[:2], data[2:], score=score, candidates=_PLANTED,
                   adaround_samples=8, adaround_iters=5, budget=3600.0)  # fmt: skip
    assert found.kept.name == right
    assert [t.recipe for t in found.rows] == _PLANTED and all(
        t.status == "scored" for t in found.rows
    )
    assert _steps_of(found.model, original) == want  # the kept model is the kept recipe's


def test_a_tie_goes_to_the_simpler_recipe_and_the_reason_says_so(data: list[torch.Tensor]) -> None:
    original = _net()[0].weight.detach().clone()

    def score(prepared: torch.nn.Module) -> float:
        return 0.9 + 0.00005 * len(_steps_of(prepared, original))  # more steps, a hair better

    found = search(_net(), (data[0][:1],), data[:2], data[2:], score=score,
                   candidates=("kernel-sum+bias", "bias", "none"), tie=1e-4)  # fmt: skip
    assert found.kept.name == "none" and "fewer steps" in found.reason
    strict = search(_net(), (data[0][:1],), data[:2], data[2:], score=score,
                    candidates=("kernel-sum+bias", "bias", "none"), tie=0.0)  # fmt: skip
    assert strict.kept.name == "kernel-sum+bias" and "best held-out score" in strict.reason


@pytest.mark.parametrize(
    ("gains", "kept"),
    [
        # every held-out sample a little better with more steps: measurable, however small
        ([1e-6] * 8, "kernel-sum+bias"),
        # a larger mean gain, but from one sample of eight: within 1 standard error, noise
        ([8e-4, -2e-4] + [0.0] * 6, "none"),
        # half the samples better, half worse: noise
        ([1e-3, -1e-3] * 4, "none"),
    ],
)
def test_per_sample_scores_keep_a_step_only_where_its_gain_is_measurable(
    data: list[torch.Tensor], gains: list[float], kept: str
) -> None:
    original = _net()[0].weight.detach().clone()
    base = torch.linspace(0.99, 0.999, 8, dtype=torch.float64)

    def score(prepared: torch.nn.Module) -> torch.Tensor:
        steps = len(_steps_of(prepared, original))  # 0, 1 or 2
        return base + steps * torch.tensor(gains, dtype=torch.float64)

    found = search(_net(), (data[0][:1],), data[:2], data[2:], score=score,
                   candidates=("kernel-sum+bias", "bias", "none"))  # fmt: skip
    assert found.kept.name == kept, found.format()
    assert [t.score for t in found.rows] == pytest.approx(
        [float((base + n * torch.tensor(gains, dtype=torch.float64)).mean()) for n in (2, 1, 0)]
    )
    if kept == "none":
        assert "not measurably worse" in found.reason and "standard error" in found.reason


def test_the_budget_skips_the_rest_and_a_failing_candidate_is_a_row(
    data: list[torch.Tensor],
) -> None:
    calls = []

    def score(prepared: torch.nn.Module) -> float:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planted failure")
        return float(len(calls))

    found = search(_net(), (data[0][:1],), data[:2], data[2:], score=score,
                   candidates=("none", "bias", "kernel-sum"))  # fmt: skip
    status = {t.recipe: t.status for t in found.rows}
    first, failed, last = found.order  # the first given, then cheapest first
    assert first == "none" and {failed, last} == {"bias", "kernel-sum"}
    assert status[first] == "scored" and status[failed].startswith("failed: RuntimeError: planted")
    assert found.kept.name == last  # the highest score of the two that scored
    budgeted = search(_net(), (data[0][:1],), data[:2], data[2:], budget=0.0,
                      candidates=("none", "bias"))  # fmt: skip
    assert [t.status.split(":")[0] for t in budgeted.rows] == ["scored", "skipped (budget"]
    assert budgeted.kept.name == "none"


def test_a_real_search_scores_by_output_cosine_and_reports(data: list[torch.Tensor]) -> None:
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    found = search(net, (data[0][:1],), data[:2], data[2:],
                   candidates=("none", "kernel-sum+bias", "equalize"))  # fmt: skip
    assert all(k in before and torch.equal(v, before[k]) for k, v in net.state_dict().items())
    scores = {t.recipe: t.score for t in found.rows}
    assert all(s is not None and 0.9 < s <= 1.0 + 1e-6 for s in scores.values())
    assert scores[found.kept.name] >= max(scores.values()) - 1e-4
    report: dict[str, Any] = json.loads(json.dumps(found.to_report()))
    assert report["kept"] == found.kept.name and report["score"] == "output cosine"
    assert [r["recipe"] for r in report["rows"]] == ["none", "kernel-sum+bias", "equalize"]
    assert "<- kept" in found.format() and found.summary() in found.format()
    with torch.no_grad():  # the kept model is a working calibrated model
        assert torch.isfinite(found.model(data[2])).all()


def test_bad_arguments_are_refused(data: list[torch.Tensor]) -> None:
    with pytest.raises(ValueError, match="held-out"):
        search(_net(), (data[0][:1],), data[:2], [])
    with pytest.raises(ValueError, match="at least one candidate"):
        search(_net(), (data[0][:1],), data[:2], data[2:], candidates=())
    for bad in ({"tie": -1}, {"significance": -1}, {"effect": -0.1}, {"budget": -1}):
        with pytest.raises(ValueError, match=f"must be >= 0, got .*{next(iter(bad))}=-"):
            search(_net(), (data[0][:1],), data[:2], data[2:], **bad)
