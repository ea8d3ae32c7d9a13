"""The time budget under load (issue 57): the same data and flags give the same model whatever
the clock says, the budget's timing is robust to a load spike, and a result the user's own
clock cut says so with the ``--recipe`` that reproduces it. Nothing here asserts a duration:
the clock is replaced by one that runs fast or 100x slow."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import QuantData, SearchOptions, quantize
from qdq.pipeline.budget import Budget, budget_lines
from qdq.pipeline.timing import per_sample

#: what the search planned (report.json: ptq.recipe_search)
PLAN = ("kept", "order", "folds", "work", "work_done", "adaround_iters", "held_out_batches")
#: candidates cheap enough for a test, with a race over the folds (the data-aware ones differ)
CANDIDATES = ("none", "kernel-sum", "bias", "kernel-sum+bias", "method")


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 10),
    ).eval()  # fmt: skip


def _data() -> QuantData:
    g = torch.Generator().manual_seed(3)
    return QuantData(calibration=torch.randn(32, 3, 8, 8, generator=g),
                     evaluation=torch.randn(8, 3, 8, 8, generator=g), labels=None,
                     source="random", split="32 calibration, 8 evaluation")  # fmt: skip


@pytest.fixture
def slow_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``time.perf_counter`` as a machine 10^5x slower would read it (a real millisecond: 100
    s), so that any budget of a few hundred seconds runs out whatever the machine's speed."""
    real = time.perf_counter
    origin = real()
    monkeypatch.setattr(time, "perf_counter", lambda: origin + 1e5 * (real() - origin))
    yield


def _run(out: Path, **kwargs: Any) -> dict[str, Any]:
    res = quantize(_net(), _data(), out=out, exporter="torchscript", batch_size=8,
                   show_progress=False, ptq=SearchOptions(candidates=CANDIDATES),
                   **kwargs)  # fmt: skip
    report = res.report
    search = report["ptq"]["recipe_search"]
    manifest = json.loads(res.manifest_path.read_text())
    scales = json.dumps(manifest["quantizers"], sort_keys=True, default=str)
    return {
        "recipe": report["settings"]["recipe"],
        "plan": {k: search.get(k) for k in PLAN},
        "rows": [(r["recipe"], r["status"], r["folds"]) for r in search["rows"]],
        "scales": hashlib.sha256(scales.encode()).hexdigest(),
        "budget": report["budget"],
        "search": search,
    }


def _plan_of(tmp_path: Path, name: str) -> dict[str, Any]:
    return _run(tmp_path / name)


def test_the_same_data_give_the_same_model_on_a_fast_and_a_100x_slow_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle, then every interval read 100x longer (the issue's loaded machine, where the
    timing swung 100x): the recipe, the search's plan (its order, folds, work, each candidate's
    status) and the manifest's scales are the same; only the predicted seconds differ, and
    nothing says the clock cut anything."""
    idle = _plan_of(tmp_path, "idle")
    real = time.perf_counter
    origin = real()
    monkeypatch.setattr(time, "perf_counter", lambda: origin + 100.0 * (real() - origin))
    slow = _plan_of(tmp_path, "slow")
    monkeypatch.undo()
    assert slow["recipe"] == idle["recipe"] and slow["plan"] == idle["plan"]
    assert slow["rows"] == idle["rows"] and slow["scales"] == idle["scales"]
    assert idle["budget"]["work"] == slow["budget"]["work"]  # counted, not timed
    # the prediction follows the clock (a 100x slower reading of the same forwards)
    assert slow["budget"]["per_sample"] > idle["budget"]["per_sample"]
    for b in (idle["budget"], slow["budget"]):
        assert b["clock"] == {"depended": False, "cut": [], "reproduce": None}
        assert b["skipped"] == []
    assert idle["search"]["clock_cut"] == slow["search"]["clock_cut"] == []


def test_a_time_budget_too_small_says_the_result_depended_on_the_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's own --time-budget stops work: the report says the result depended on the
    clock and names the --recipe that reproduces it, in report.json, the summary and the page."""
    x = torch.randn(32, 3, 8, 8).numpy()
    import numpy as np

    np.save(tmp_path / "x.npy", x)
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU()).eval()\n"
    )
    out = tmp_path / "out"
    assert main(["quantize", "--model", f"{model}:build", "--data", str(tmp_path / "x.npy"),
                 "--exporter", "torchscript", "--no-progress", "--out", str(out),
                 "--time-budget", "0.001"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    clock = report["budget"]["clock"]
    assert clock["depended"] is True and clock["reproduce"] == "--recipe none"
    assert "the recipe search did not run" in clock["cut"]
    assert "the result depended on the clock" in printed and "--recipe none reproduces" in printed
    page = (out / "report.html").read_text()
    assert "The result depended on the clock" in page and "--recipe none" in page


def test_a_search_the_clock_cut_names_its_recipe(tmp_path: Path, slow_clock: None) -> None:
    """A --time-budget of 200 s on a clock 10^5x slow (2 ms of real time): the search gets what
    the clock leaves and is cut (or does not run); the kept recipe is named as the one to
    reproduce with."""
    got = _run(tmp_path / "out", time_budget=200.0)
    clock = got["budget"]["clock"]
    assert clock["depended"] is True and clock["cut"]
    assert clock["reproduce"] == f"--recipe {got['recipe']}"
    assert any("depended on the clock" in line for line in budget_lines(got["budget"]))


def test_the_timing_keeps_the_fastest_reading_and_the_calibration_bounds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load spike on the first readings (100x) does not make the estimate: the fastest
    reading does, and a forward never costs more than a calibration sample did."""
    net, batch = _net(), torch.randn(8, 3, 8, 8)
    # the warm-up (10 ms), then readings of 100 s, 0.5 s and 10 ms: the fastest, per sample
    ticks = iter([0.0, 0.01, 0.01, 100.01, 100.01, 100.51, 100.51, 100.52] + [200.0] * 20)
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    assert per_sample(net, batch, warm=True) == pytest.approx(0.01 / 8)
    ticks = iter([0.0, 100.0] + [100.0 + k for k in range(1, 20)])
    assert per_sample(net, batch, warm=False, bound=1e-3) == pytest.approx(1e-3)


def test_the_budget_replans_and_its_headline_says_planned_and_spent() -> None:
    """The plan's work is counted (the same whatever the timing), its seconds are predicted;
    the stages that ended re-plan the ones to come; the headline says planned and spent."""
    fast, slow = (Budget(None, eval_samples=100, calib_samples=64) for _ in range(2))
    fast.plan(points=10, fp32=1e-3, int8=2e-3, nominal=5e-4)
    slow.plan(points=10, fp32=1e-1, int8=2e-1, nominal=5e-4)
    assert fast.work == slow.work and fast.search_work() == slow.search_work()
    assert slow.total is not None and fast.total is not None and slow.total > fast.total
    before = fast.reserved(after="export")
    fast.observe({"export": 2 * fast.planned["export"]})  # the export took twice its estimate
    assert fast.speed() == pytest.approx(2.0)
    assert fast.reserved(after="export") == pytest.approx(2 * before)
    report = fast.to_report()
    assert report["spent_by_stage"] == {"export": pytest.approx(2 * fast.planned["export"])}
    line = budget_lines(report)[0]
    assert line.startswith("time budget: planned ") and " spent " in line
    assert "within it" not in line and "the clock stops work only past" in line
