"""Only the core can fail ``qdq quantize`` (issue 31, item 2).

Load, check, capture + plan, calibrate, export and the INT8 measurement decide success. A failure in
any later stage — per-layer error, method comparison, lint, and the page's drawing, plots, engine
views or the page itself — is injected here: the job still exits 0, writes all four files, records
the stage, the error type and the message in ``report.json`` ``stage_errors`` and on the page, and
prints one warning line for it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import PtqOptions

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
        )
    """
)
FILES = ["manifest.json", "model.qdq.onnx", "report.html", "report.json"]
BOOM = "injected failure"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stage_failures")
    (root / "model.py").write_text(MODEL_PY)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(root / "x.npy", x)
    return {"py": root / "model.py", "npy": root / "x.npy"}


def _boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError(BOOM)


def _inject(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    import qdq.lint
    import qdq.lint.engine_pages
    import qdq.pipeline.finish
    import qdq.report.html
    import qdq.report.plots

    targets = {
        "layer_errors": [(qdq.pipeline.finish, "layer_errors")],
        "compare_methods": [(qdq.pipeline.finish, "compare_methods")],
        "lint": [(qdq.lint, "lint")],
        "drawing": [(qdq.lint.engine_pages, "predicted_svg")],
        "plots": [(qdq.report.plots, "histogram_svg"), (qdq.report.plots, "sqnr_profile_svg")],
        "html": [(qdq.report.html, "render_html")],
    }
    for module, name in targets[stage]:
        monkeypatch.setattr(module, name, _boom)


STAGES = ("layer_errors", "compare_methods", "lint", "drawing", "plots", "html")


@pytest.mark.parametrize("stage", STAGES)
def test_a_failing_late_stage_is_recorded_and_everything_is_written(
    stage: str, inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _inject(monkeypatch, stage)
    out = tmp_path / "out"
    argv = ["quantize", "--model", f"{inputs['py']}:build", "--data", str(inputs["npy"])]
    argv += ["--out", str(out), "--exporter", "torchscript", "--no-progress", "--compare-methods"]
    argv += ["--recipe", "none"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == FILES
    report = json.loads((out / "report.json").read_text())
    assert report["stage_errors"] == [
        {"stage": stage, "error": "RuntimeError", "message": BOOM}
    ] * (2 if stage == "plots" else 1)
    warnings = [line for line in printed.splitlines() if line.startswith("warning: stage")]
    assert len(warnings) == len(report["stage_errors"]) and BOOM in warnings[0]
    # the core figures are all there
    assert report["export"]["verified_in_onnxruntime"] and 0 <= report["int8_metric"] <= 1
    page = (out / "report.html").read_text()
    assert BOOM in page and "Stages that failed" in page
    if stage == "lint":
        assert report["lint"] is None and report["lint_verdict"] == "not run"
        assert "the lint stage failed" in page
    if stage == "layer_errors":
        assert report["layer_errors"] is None
    if stage == "compare_methods":
        assert report["calibration_methods"] is None
        # the exported amax was restored: the torch figure is the exported method's
        assert report["int8_torch"]["metric"] == pytest.approx(report["int8"]["metric"], abs=0.2)
    if stage not in ("html", "drawing"):
        assert "<svg" in page  # the rest of the page is drawn


def test_without_failures_stage_errors_is_empty(
    inputs: dict[str, Path], tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    argv = ["quantize", "--model", f"{inputs['py']}:build", "--data", str(inputs["npy"])]
    argv += ["--recipe", "none"]
    assert main([*argv, "--out", str(out), "--exporter", "torchscript", "--no-progress"]) == 0
    assert "warning: stage" not in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["stage_errors"] == []
    assert "Stages that failed" not in (out / "report.html").read_text()


def test_a_failing_core_stage_still_fails_the_job(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import qdq

    monkeypatch.setattr(qdq, "calibrate", _boom)
    monkeypatch.setattr(qdq, "calibrate_parts", _boom)  # the search's calibration
    out = tmp_path / "out"
    argv = ["quantize", "--model", f"{inputs['py']}:build", "--data", str(inputs["npy"])]
    assert main([*argv, "--out", str(out), "--exporter", "torchscript", "--no-progress"]) == 2
    assert BOOM in capsys.readouterr().err
    assert not out.exists()


def test_engine_views_failure_is_recorded(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine views of the page (the diff against a real engine report) fail: the page is
    written without them and the failure is handed back."""
    import qdq.lint.diff
    from qdq.pipeline import quantize
    from qdq.report import write_html

    res = quantize(f"{inputs['py']}:build", str(inputs["npy"]), out=tmp_path / "out",
                   exporter="torchscript", show_progress=False, ptq=PtqOptions())  # fmt: skip
    monkeypatch.setattr(qdq.lint.diff, "diff_engine", _boom)
    failures: list[dict[str, str]] = []
    engine: Any = object()  # never read: the diff fails first
    page = write_html(res.report, tmp_path / "r.html", engine=engine, failures=failures)
    assert failures == [{"stage": "engine_views", "error": "RuntimeError", "message": BOOM}]
    text = page.read_text()
    assert "the engine views failed" in text and "Stages that failed" in text
