"""The whole job's time budget (issue 47): ``qdq quantize --time-budget`` / ``time_budget=``,
the default set from the core stages' estimate, and what the budget leaves out (the search, the
refit, the per-layer errors, --compare-methods' methods) said in report.json and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import QuantData, SearchOptions, quantize
from qdq.pipeline.budget import CEILING, MIN_SEARCH, OPTIONAL, SHARE, Budget, check_budget


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 16),
    ).eval()  # fmt: skip


def _data() -> QuantData:
    g = torch.Generator().manual_seed(3)
    return QuantData(calibration=torch.randn(16, 3, 8, 8, generator=g),
                     evaluation=torch.randn(8, 3, 8, 8, generator=g), labels=None,
                     source="random", split="16 calibration, 8 evaluation")  # fmt: skip


def test_the_default_budget_is_the_core_estimate_and_a_share_for_the_search(tmp_path: Path):
    stages: dict[str, str] = {}
    res = quantize(_net(), _data(), out=tmp_path / "out", exporter="torchscript", batch_size=4,
                   show_progress=False, on_stage=lambda n, s, d: stages.__setitem__(n, d),
                   ptq=SearchOptions(candidates=("none", "kernel-sum")))  # fmt: skip
    b = res.report["budget"]
    assert b["given"] is False and set(b["planned"]) == {
        "export", "fp32_eval", "int8_eval", "layer_errors", "compare_methods", "lint_report"}  # fmt: skip
    assert b["planned"]["compare_methods"] == 0  # not asked for
    # the seconds are a prediction (the stages to come and the search's counted work at the
    # measured speed); the search's plan is counted work, the same on every machine
    assert b["seconds"] >= sum(b["planned"].values())
    assert b["ceiling"] == pytest.approx(CEILING * b["seconds"], rel=1e-3)
    assert b["search_work"] == pytest.approx(
        max((SHARE - 1) * sum(v for k, v in b["work"].items() if k not in OPTIONAL), MIN_SEARCH),
        rel=1e-3)  # fmt: skip
    assert b["skipped"] == [] and b["clock"] == {"depended": False, "cut": [], "reproduce": None}
    assert stages["budget"].startswith(f"time budget {b['seconds']:.0f} s (default: ")
    assert "expected end by" in stages["budget"]
    found = res.report["ptq"]["recipe_search"]
    assert found["budget_seconds"] is None and found["order"][0] == "none"
    assert found["work"] == pytest.approx(b["search_work"], rel=1e-3) and found["clock_cut"] == []


def test_a_budget_too_small_for_anything_optional_keeps_the_core(tmp_path: Path, capsys):
    out = tmp_path / "out"
    res = quantize(_net(), _data(), out=out, exporter="torchscript", batch_size=4,
                   show_progress=False, compare_methods=True, time_budget=0.001)  # fmt: skip
    r = res.report
    b = r["budget"]
    assert b["given"] is True and b["seconds"] == 0.001 and b["within"] is False
    left_out = {(s["stage"], s["what"]) for s in b["skipped"]}
    assert ("recipe_search", "every candidate") in left_out
    assert ("layer_errors", "the stage") in left_out
    assert {("compare_methods", m) for m in ("max", "entropy", "mse", "percentile")} <= left_out
    assert r["ptq"]["recipe_search"]["reason"].startswith("not run: the time budget leaves it")
    assert r["layer_errors"] is None and r["calibration_methods"] == {}
    # the core figures and every file are there
    assert r["export"]["verified_in_onnxruntime"] and r["int8_metric"] is not None
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "model.qdq.onnx", "report.html", "report.json"]  # fmt: skip
    page = res.html_path.read_text()
    assert "Left out by the time budget" in page and "over it" in page


def test_the_cli_takes_a_time_budget_and_refuses_a_bad_one(tmp_path: Path, capsys) -> None:
    x = torch.randn(24, 3, 8, 8).numpy()
    import numpy as np

    np.save(tmp_path / "x.npy", x)
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU()).eval()\n"
    )
    argv = ["quantize", "--model", f"{model}:build", "--data", str(tmp_path / "x.npy"),
            "--exporter", "torchscript", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "bad"), "--time-budget", "0"]) == 2
    err = capsys.readouterr().err
    assert "time_budget must be a number of seconds > 0, got 0.0" in err
    assert not (tmp_path / "bad").exists()
    assert main([*argv, "--out", str(tmp_path / "ok"), "--time-budget", "0.001"]) == 0
    printed = capsys.readouterr().out
    assert "time budget: 0 s (given), capture to report" in printed and "OVER it" in printed
    assert "left out by the budget: recipe_search: every candidate" in printed
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["budget"]["given"] is True


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "10"])
def test_bad_budgets_are_named(bad: object) -> None:
    with pytest.raises(ValueError, match="time_budget must be a number of seconds > 0"):
        check_budget(bad)
    assert check_budget(None) is None and check_budget(5) == 5.0


def test_the_plan_reserves_the_stages_to_come() -> None:
    b = Budget(None, eval_samples=100, layer_error_samples=10, methods=4)
    assert b.left() == float("inf")
    b.plan(points=10, fp32=0.01, int8=0.02)
    assert b.planned["fp32_eval"] == pytest.approx(1.2) and b.planned["int8_eval"] == pytest.approx(
        6
    )
    assert b.planned["compare_methods"] == pytest.approx(1.2 * 0.02 * 100 * 4)
    core = sum(b.planned.values())
    assert b.total is not None and b.total >= core + b.search_work() and b.ceiling is not None
    assert b.reserved(after="compare_methods") == pytest.approx(b.planned["lint_report"])
    # without a budget given the clock stops nothing before the ceiling: every stage fits
    assert b.search_seconds() is None and b.left() == float("inf")
    assert b.fits("layer_errors", 0.0) and b.fits("layer_errors", b.total)
    given = Budget(30.0)
    given.plan(points=10, fp32=0.01, int8=0.02)
    assert given.total == 30.0 and given.to_report()["given"] is True
    assert given.search_seconds() == pytest.approx(
        given.left() - sum(given.planned.values()), abs=0.01
    )
    assert given.fits("layer_errors", 0.0) and not given.fits("layer_errors", 30.0)


def test_without_a_search_the_default_is_the_core_predicted(tmp_path: Path) -> None:
    stages: dict[str, str] = {}
    res = quantize(_net(), _data(), out=tmp_path / "out", exporter="torchscript", batch_size=4,
                   show_progress=False, ptq="none",
                   on_stage=lambda n, s, d: stages.__setitem__(n, d))  # fmt: skip
    b = res.report["budget"]
    assert "; no recipe search; expected end by " in stages["budget"]
    assert b["seconds"] >= sum(b["planned"].values()) and b["search_work"] is not None
    assert "recipe_search" not in res.report["timings_s"]
