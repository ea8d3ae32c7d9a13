"""The PTQ steps' one shape (issue 33, item 5): every step's report is a StepReport whose key is
its registry entry, with the same JSON and text plumbing, and the pipeline runs them in order."""

from __future__ import annotations

import json

import pytest
import torch

import qdq
from qdq.pipeline.improve import PtqOptions, improver
from qdq.ptq.adaround import adaround
from qdq.ptq.bias import correct_bias
from qdq.ptq.equalize import equalize
from qdq.ptq.kernel_sums import kernel_sum_rounding
from qdq.ptq.methods import choose_methods
from qdq.ptq.step import STEPS, StepReport, step


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4),
    ).eval()  # fmt: skip


@pytest.fixture(scope="module")
def data() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 12, 12, generator=g) for _ in range(2)]


def _calibrated(data: list[torch.Tensor]) -> torch.nn.Module:
    prepared = qdq.prepare(_net(), (data[0][:1],))
    qdq.calibrate(prepared, data, method="mse", show_progress=False)
    return prepared


def test_every_step_reports_in_one_shape(data: list[torch.Tensor]) -> None:
    reports = [
        equalize(_net(), (data[0][:1],), data, show_progress=False),
        choose_methods(_calibrated(data), data, show_progress=False),
        kernel_sum_rounding(_calibrated(data), data),
        adaround(_calibrated(data), data, num_samples=8, iters=5, show_progress=False),
        correct_bias(_calibrated(data), data, show_progress=False),
    ]
    assert [r.key for r in reports] == [s.key for s in STEPS]
    for report in reports:
        assert isinstance(report, StepReport)
        full = report.to_report()
        assert full["summary"] == report.summary() and next(iter(full)) == "summary"
        assert json.loads(report.to_json()) == json.loads(json.dumps(report.to_dict()))
        assert len(full["rows"]) == len(report.rows) and full["notes"] == list(report.notes)
        text = report.format().splitlines()
        assert text[0] == report.summary()
        header = text[1].split()
        assert header[0] == report.columns[0][0].split()[0]
        assert len(text) >= 2 + min(len(report.rows), 10)


def test_steps_say_what_they_need_and_change() -> None:
    assert step("kernel_sum").data_free and not step("adaround").data_free
    assert all(s.needs and s.changes and s.label for s in STEPS)
    with pytest.raises(KeyError, match="kernel_sum"):
        step("rounding")


def test_the_pipeline_runs_the_chosen_steps_in_order(data: list[torch.Tensor]) -> None:
    options = PtqOptions(method_per_quantizer=True, rounding="kernel-sum", bias_correction=True)
    improve, reports = improver(options, data, show_progress=False)
    improve(_calibrated(data))
    assert list(reports) == ["method_per_quantizer", "kernel_sum", "bias_correction"]
    assert all(isinstance(r["summary"], str) and "rows" in r for r in reports.values())
