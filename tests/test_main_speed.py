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
from qdq.pipeline.speed import speedup_text

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
    assert line.endswith(f"({speedup_text(lat['speedup_vs_fp16'])}x)")
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
    slow = [w for w in res.report["warnings"] if "as fast as FP16" in w]
    logged = [r.getMessage() for r in caplog.records if "as fast as FP16" in r.getMessage()]
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


# --------------------------------------------------------------------------- T02, the budget
MIXED_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16),
        )
    """
)


def _calibrated_gemms(x: torch.Tensor) -> torch.nn.Module:
    """Two Linear(512, 512) on 8 x 128 tokens, planned FP8 (F01) and calibrated: large enough
    for the RTX 4090's INT8 to be predicted faster than its FP8 beyond the 2 % tie."""
    import qdq
    from qdq import QuantConfig

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    prepared = qdq.prepare(net.eval(), (x[:1],), QuantConfig(format="mixed"))
    qdq.calibrate(prepared, [x], show_progress=False)
    return prepared


def test_per_layer_int8_and_fp8_times_follow_the_gpus_peaks() -> None:
    """The real time model: INT8 and FP8 move the same bytes, so a dense aligned layer takes the
    same time where the two peaks are equal (H100, L40S) and INT8 is faster where FP8 runs at half
    the INT8 rate (RTX 4090, FP32 accumulation); a convolution whose 24 channels do not fill the
    16-byte vectors runs on CUDA cores, INT8 (dp4a) faster everywhere; no FP8, no times."""
    from qdq.accuracy.format_time import LayerShape, cost_layer, faster, format_times
    from qdq.lint.speed.gpus import find_gpu

    shapes = {
        "conv": LayerShape("conv", (32, 64, 56, 56), (64, 64, 3, 3), (32, 64, 56, 56)),
        "gemm": LayerShape("gemm", (32, 197, 768), (3072, 768)),
        "odd": LayerShape("conv", (32, 24, 56, 56), (24, 24, 3, 3), (32, 24, 56, 56)),
    }
    conv = cost_layer("conv", shapes["conv"], "int8")
    assert conv.macs == 32 * 56 * 56 * 64 * 64 * 9 and conv.gemm == (32 * 56 * 56, 64, 576)
    assert cost_layer("gemm", shapes["gemm"], "fp8").gemm == (32 * 197, 3072, 768)
    for name in ("h100", "l40s"):
        times = format_times(shapes, find_gpu(name))
        assert times["conv"][0] == pytest.approx(times["conv"][1])
        assert faster(*times["conv"]) is None and faster(*times["gemm"]) is None
        assert faster(*times["odd"]) == "int8"
    times = format_times(shapes, find_gpu("rtx4090"))
    assert all(faster(*times[k]) == "int8" for k in shapes), times
    assert format_times(shapes, find_gpu("a100")) == {}


def test_mixed_with_a_gpu_breaks_ties_by_predicted_time_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every tensor a tie (the margin patched to 100 dB): no GPU keeps each planned format
    (rule F07, untimed); on the RTX 4090 the two FP8 GEMMs move to INT8 (T02, real times); the
    H100 times both formats the same and keeps the planned ones; a timing where FP8 is faster
    keeps them FP8 by T02. A measurable accuracy difference (the real 3 dB margin) decides
    alone."""
    from qdq.accuracy import formats
    from qdq.lint.speed.gpus import find_gpu

    x = torch.randn(8, 128, 512, generator=torch.Generator().manual_seed(0))
    prepared = _calibrated_gemms(x)
    honest = formats.choose_formats(prepared, x, gpu=find_gpu("h100"))
    # Gaussian tensors: FP8's 3-bit mantissa loses by > 3 dB, so INT8 by the measure (F07)
    assert {(r.layer, r.chosen, r.rule) for r in honest.rows} == {
        ("0", "int8", "F07"), ("2", "int8", "F07")}  # fmt: skip
    monkeypatch.setattr(formats, "MARGIN_DB", 100.0)
    plain = formats.choose_formats(prepared, x)
    assert {(r.layer, r.planned, r.chosen, r.rule) for r in plain.rows} == {
        ("0", "fp8", "fp8", "F07"), ("2", "fp8", "fp8", "F07")}  # fmt: skip
    assert plain.overrides == () and plain.timed_on == "" and "T02" not in plain.summary()
    assert all(r.int8_ms is None for r in plain.rows)

    ada = formats.choose_formats(prepared, x, gpu=find_gpu("rtx4090"))
    assert {(r.layer, r.chosen, r.rule) for r in ada.rows} == {
        ("0", "int8", "T02"), ("2", "int8", "T02")}  # fmt: skip
    row = ada.rows[0]
    assert row.int8_ms is not None and row.fp8_ms is not None and row.int8_ms < row.fp8_ms
    assert "INT8 predicted faster on NVIDIA GeForce RTX 4090" in row.reason
    assert sorted((o.name, o.format) for o in ada.overrides) == [("0", "int8"), ("2", "int8")]
    assert ada.timed_on == "NVIDIA GeForce RTX 4090" and "2 by predicted time" in ada.summary()
    # the plan without the moves (kept when they would cost reformats) moves nothing
    assert ada.unchanged is not None and not ada.unchanged.changes

    hopper = formats.choose_formats(prepared, x, gpu=find_gpu("h100"))
    assert [(r.chosen, r.rule) for r in hopper.rows] == [(r.chosen, r.rule) for r in plain.rows]
    assert all("predicted as fast in either format" in r.reason for r in hopper.rows)

    monkeypatch.setattr(formats, "format_times", lambda shapes, gpu: {
        k: (2.0, 1.0) for k in shapes})  # fmt: skip
    fp8_faster = formats.choose_formats(prepared, x, gpu=find_gpu("h100"))
    assert {(r.chosen, r.rule) for r in fp8_faster.rows} == {("fp8", "T02")}
    assert fp8_faster.overrides == () and "FP8 predicted faster" in fp8_faster.rows[0].reason


def test_mixed_with_objective_speed_records_t02_in_the_plan_and_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job on the RTX 4090 with every tensor a tie and INT8 timed faster: the FP8 GEMM moves
    to INT8 by rule T02 (report.json settings.format_choice, the plan's format_rule, the
    manifest); the budget planned the speed stage first. Without --objective speed the same job
    times nothing and takes the all-INT8 plan, which measures less noise."""
    from qdq.accuracy import formats
    from qdq.pipeline import quantize

    calls: list[str] = []

    def times(shapes: Any, gpu: Any) -> dict[str, tuple[float, float]]:
        calls.append(gpu.name)
        return {k: (1.0, 1.5) for k in shapes}

    monkeypatch.setattr(formats, "MARGIN_DB", 100.0)
    monkeypatch.setattr(formats, "format_times", times)
    (tmp_path / "mixed.py").write_text(MIXED_PY)
    np.save(tmp_path / "x.npy", torch.randn(16, 3, 8, 8,
            generator=torch.Generator().manual_seed(0)).numpy())  # fmt: skip
    reports = {}
    for objective in ("speed", "accuracy"):
        res = quantize(f"{tmp_path / 'mixed.py'}:build", str(tmp_path / "x.npy"),
                       out=tmp_path / objective, exporter="torchscript", show_progress=False,
                       ptq="none", target="trt10-rtx4090", format="mixed",
                       objective=objective)  # fmt: skip
        reports[objective] = res.report
    assert calls == ["rtx4090"]  # timed once: only the speed job
    assert (
        reports["speed"]["stage_errors"] == [] and reports["speed"]["objective"]["name"] == "speed"
    )
    choice = reports["speed"]["settings"]["format_choice"]
    rows = {r["layer"]: r for r in choice["rows"]}
    assert (rows["8"]["planned"], rows["8"]["chosen"], rows["8"]["rule"]) == ("fp8", "int8", "T02")
    assert rows["2"]["rule"] == "T02" and choice["timed_on"] == "NVIDIA GeForce RTX 4090"
    points = {p["name"]: p for p in reports["speed"]["plan"]["points"]}
    assert points["8:input"]["format_rule"] == "T02" and "T02: INT8 and FP8" in points[
        "8:input"]["reason"]  # fmt: skip
    manifest = json.loads((tmp_path / "speed" / "manifest.json").read_text())
    assert {q["path"]: q["format"] for q in manifest["quantizers"]}["8.input_quantizer"] == "int8"
    planned = reports["speed"]["budget"]["planned"]
    assert next(iter(planned)) == "speed" and planned["speed"] > 2 * planned["export"]
    assert "speed" in reports["speed"]["budget"]["spent_by_stage"]

    # without it nothing is timed; the tie is no move by the measure, but the all-INT8 plan
    # measures less noise than the planned FP8 GEMM, so the accuracy objective takes it
    plain = reports["accuracy"]["settings"]["format_choice"]
    assert plain["timed_on"] == "" and all(r["rule"] == "F07" for r in plain["rows"])
    assert {r["layer"]: r["chosen"] for r in plain["rows"]} == {"2": "int8", "8": "int8"}
    assert plain["single"] == "int8" and "the all-INT8 plan" in plain["summary"]
    assert set(plain["reformats"]) == {"all INT8"}  # no measured change to weigh against it
    assert "speed" not in reports["accuracy"]["budget"]["planned"]


def test_the_budget_plans_the_speed_stage_without_changing_the_search() -> None:
    """--objective speed plans two exports, their lint and a calibration on every calibration
    sample before the export; the search's counted work stays the same (the recipe does not
    depend on the objective), its seconds under a given budget shrink by the stage."""
    from qdq.pipeline import budget as b

    plans = {}
    for on in (False, True):
        plans[on] = b.Budget(100.0, eval_samples=64, calib_samples=128, speed_stage=on)
        plans[on].plan(points=40, fp32=0.01, int8=0.02, nominal=0.02)
    export = b.EXPORT_FIXED + b.EXPORT_PER_POINT * 40
    lint = b.REPORT_FIXED + b.REPORT_PER_EXPORT * export
    speed = plans[True].planned["speed"]
    assert speed == pytest.approx(2 * (export + lint) + 3.0 * 0.02 * 128)
    assert next(iter(plans[True].planned)) == "speed" and "speed" not in plans[False].planned
    assert plans[True].search_work() == pytest.approx(plans[False].search_work())
    with_, without = plans[True].search_seconds(), plans[False].search_seconds()
    assert with_ is not None and without is not None
    assert without - with_ == pytest.approx(speed, abs=0.05)
    default = {on: b.Budget(calib_samples=128, speed_stage=on) for on in (False, True)}
    for d in default.values():
        d.plan(points=40, fp32=0.01, int8=0.02, nominal=0.02)
    assert default[True].total is not None and default[False].total is not None
    assert default[True].total - default[False].total == pytest.approx(speed, abs=0.05)
