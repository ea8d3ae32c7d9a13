"""Speed in the main job (issue 58, part 4): ``qdq quantize`` with a target naming a GPU reports the
predicted engine time against FP16 (``report.json: latency``, the page's card and per-layer chart,
the summary's line), warns under 1.05x, and ``--objective speed`` keeps in FP16 the layers whose
quantization does not pay (rule T01), refused without a GPU in the target.

The prediction itself is the linter's (tests/test_speed_*.py); here it is real where the wiring
needs any figure and monkeypatched where a test needs a given verdict (a slow engine, a layer that
does not pay)."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qdq.cli.main import main

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
#: the engine layer of the model's one INT8 convolution (module "0"), as the linter names it
CONV = "0/Conv + 1/Relu"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("main_speed")
    (root / "model.py").write_text(MODEL_PY)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(root / "x.npy", x)
    return {"py": root / "model.py", "npy": root / "x.npy"}


def _argv(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", f"{inputs['py']}:build", "--data", str(inputs["npy"]),
            "--out", str(out), "--exporter", "torchscript", "--no-progress", "--recipe", "none",
            *extra]  # fmt: skip


def _fake_prediction(
    monkeypatch: pytest.MonkeyPatch, speedup: float, slow_conv: bool, calls: list[Any]
) -> None:
    """``predict_latency`` replaced: the INT8 convolution ``0`` takes 0.05 ms against 0.02 ms in
    FP16 when ``slow_conv`` (a layer that does not pay); the total is ``speedup`` times faster
    than FP16 while the convolution is quantized, 1.2x once it is not."""
    import onnx

    from qdq.lint.speed import latency
    from qdq.lint.speed.latency import LatencyReport, LayerLatency, NotPaying

    def predict_latency(model: Any, *, target: Any, **kw: Any) -> LatencyReport:
        proto = onnx.load(str(model))
        quantized = any(n.name.startswith("0.weight_quantizer/") for n in proto.graph.node)
        calls.append((Path(model).name, quantized, kw.get("shapes")))
        conv = LayerLatency(CONV, ("0/Conv", "1/Relu"), "conv", "int8" if quantized else "fp16",
                            0.05 if slow_conv and quantized else 0.02)  # fmt: skip
        rest = LayerLatency("2/Conv + 3/Relu", ("2/Conv", "3/Relu"), "conv", "fp16", 0.1)
        total = conv.ms + rest.ms
        fp16 = total * (speedup if quantized else 1.2)
        paying = (NotPaying(CONV, 0.05, 0.02, "predicted 0.04 ms INT8 + 0.01 ms Q/DQ vs 0.02 ms "
                            "FP16"),) if slow_conv and quantized else ()  # fmt: skip
        return LatencyReport(
            model="model.qdq.onnx", target=str(target), gpu="a100-sxm4-40gb",
            gpu_label="NVIDIA A100 SXM4 40 GB", gpu_note="", total_ms=total, fp16_total_ms=fp16,
            speedup_vs_fp16=fp16 / total, layers=(conv, rest), fp16_layers=(rest,),
            not_paying=paying,
        )  # fmt: skip

    monkeypatch.setattr(latency, "predict_latency", predict_latency)


def test_a_gpu_target_reports_the_predicted_engine_time(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(_argv(inputs, out, "--target", "trt10-a100")) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    lat = report["latency"]
    assert lat["gpu"] == "a100-sxm4-40gb" and report["latency_reason"] is None
    assert lat["total_ms"] > 0 and lat["fp16_total_ms"] > 0
    assert lat["speedup_vs_fp16"] == pytest.approx(lat["fp16_total_ms"] / lat["total_ms"], rel=1e-3)
    assert "gpu_note" in lat and lat["layers"], lat
    assert {"name", "precision", "ms"} <= set(lat["layers"][0])
    assert report["objective"] == {"name": "accuracy"}
    assert report["settings"]["objective"] == "accuracy"
    assert "latency" in report["timings_s"]
    line = next(s for s in printed.splitlines() if s.startswith("predicted on "))
    assert line.startswith("predicted on NVIDIA A100") and " ms vs FP16 " in line
    assert line.endswith(f"({lat['speedup_vs_fp16']:.2f}x)")
    page = (out / "report.html").read_text()
    assert 'id="latency-card"' in page and "Predicted engine time" in page
    chart = page[page.index('id="latency-chart"') :]
    assert chart.index("<svg") < chart.index("</svg>")
    assert "predicted time per layer (ms)" in chart


def test_a_target_without_gpu_has_no_latency_and_says_why(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(_argv(inputs, out)) == 0  # default target trt10
    assert "predicted on " not in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["latency"] is None
    assert "names no GPU" in report["latency_reason"]
    assert "latency" not in report["timings_s"] and report["stage_errors"] == []
    page = (out / "report.html").read_text()
    assert 'id="latency-card"' not in page and "names no GPU" in page


@pytest.mark.parametrize("speedup", [1.0, 1.5])
def test_an_engine_predicted_under_1_05x_warns_naming_the_layers_that_do_not_pay(
    speedup: float,
    inputs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from qdq.pipeline import quantize

    calls: list[Any] = []
    _fake_prediction(monkeypatch, speedup, slow_conv=True, calls=calls)
    with caplog.at_level(logging.WARNING, logger="qdq.pipeline.speed"):
        res = quantize(f"{inputs['py']}:build", str(inputs["npy"]), out=tmp_path / "out",
                       exporter="torchscript", show_progress=False, ptq="none",
                       target="trt10-a100", batch_size=4)  # fmt: skip
    # the export has a dynamic batch: predicted at the job's batch and sample shape
    assert calls == [("model.qdq.onnx", True, {"input": (4, 3, 8, 8)})]
    slow = [w for w in res.report["warnings"] if "faster than FP16" in w]
    logged = [r.getMessage() for r in caplog.records if "faster than FP16" in r.getMessage()]
    if speedup >= 1.05:
        assert slow == [] and logged == []
        return
    assert len(slow) == 1 and "1.00x" in slow[0] and CONV in slow[0]
    assert "--objective speed" in slow[0]
    assert len(logged) == 1 and CONV in logged[0]
    assert res.report["latency"]["not_paying"][0]["name"] == CONV


def test_objective_speed_keeps_a_layer_that_does_not_pay_in_fp16(
    inputs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[Any] = []
    _fake_prediction(monkeypatch, 1.0, slow_conv=True, calls=calls)
    out = tmp_path / "out"
    argv = _argv(inputs, out, "--target", "trt10-a100", "--objective", "speed", "--max-drop", "0.5")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    # predicted on the first export, on the re-planned one, then on the job's export
    assert [quantized for _, quantized, _ in calls] == [True, False, False]
    objective = report["objective"]
    assert objective["name"] == "speed" and report["settings"]["objective"] == "speed"
    [kept] = objective["kept_fp16"]
    assert kept["module"] == "0" and kept["layer"] == CONV and kept["rule"] == "T01"
    assert "0.0500 ms quantized vs 0.0200 ms FP16 on NVIDIA A100" in kept["reason"]
    assert objective["before"]["speedup_vs_fp16"] == pytest.approx(1.0)
    assert objective["after"]["speedup_vs_fp16"] == pytest.approx(1.2)
    # the plan, the coverage and the export say so: module 0 is float, by rule T01
    points = [p for p in report["plan"]["points"] if p["owner"] == "0"]
    assert points and all(p["decision"] == "skip" and p["rule"] == "T01" for p in points)
    assert {"name": "0", "type": "Conv2d", "status": "float", "rule": "T01",
            "reason": kept["reason"]} in report["skipped_layers"]  # fmt: skip
    assert report["export"]["num_quantize"] == 0 and report["latency"]["speedup_vs_fp16"] > 1.05
    # the accuracy guard ran on the speed objective's plan, and the figures are the final export's
    assert report["fallback"]["within_budget"] and report["fallback"]["fallback"] == []
    assert report["int8_metric"] >= report["fp32_metric"] - 0.5
    assert "--objective speed: first export" in printed and "T01" in printed
    assert "T01" in (out / "report.html").read_text()


def test_objective_speed_keeps_everything_when_every_layer_pays(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qdq.pipeline import quantize

    calls: list[Any] = []
    _fake_prediction(monkeypatch, 1.5, slow_conv=False, calls=calls)
    res = quantize(f"{inputs['py']}:build", str(inputs["npy"]), out=tmp_path / "out",
                   exporter="torchscript", show_progress=False, ptq="none",
                   target="trt10-a100", objective="speed")  # fmt: skip
    assert [q for _, q, _ in calls] == [True, True]  # the first export and the job's: no re-plan
    assert res.report["objective"]["kept_fp16"] == [] and res.report["export"]["num_quantize"] > 0
    assert "no quantized layer is predicted slower" in res.report["objective"]["summary"]


def test_objective_speed_without_a_gpu_in_the_target_is_refused_up_front(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from qdq.pipeline import quantize

    out = tmp_path / "out"
    assert main(_argv(inputs, out, "--objective", "speed")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qdq quantize: error: --objective speed")
    assert "'trt10'" in err[0] and "trt10-a100" in err[0]
    assert not out.exists()
    # the API refuses it before loading anything (the model does not exist)
    with pytest.raises(ValueError, match="names none"):
        quantize("no-such-model", out=tmp_path / "o", objective="speed", target="trt10")
    with pytest.raises(ValueError, match="unknown objective 'fast'"):
        quantize("no-such-model", out=tmp_path / "o", objective="fast", target="trt10-a100")


def test_a_failing_prediction_is_recorded_and_the_job_still_writes_everything(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qdq.lint.speed import latency

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(latency, "predict_latency", boom)
    out = tmp_path / "out"
    assert main(_argv(inputs, out, "--target", "trt10-a100", "--objective", "speed")) == 0
    report = json.loads((out / "report.json").read_text())
    assert [e["stage"] for e in report["stage_errors"]] == ["speed", "latency"]
    assert report["latency"] is None and "stage_errors" in report["latency_reason"]
    assert report["objective"]["failed"] and report["export"]["num_quantize"] > 0
