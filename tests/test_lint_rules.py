"""The linter on real exports (placement zoo, peers) and against real TensorRT engine reports: layer by
layer, the prediction for the same network structure agrees with what TensorRT built."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import qdq
from lint_graphs import G
from qdq.lint import diff_engine, lint, load_engine_report
from trt_engines import engine_file


# ------------------------------------------------------- real exports + engine
def _export(model: torch.nn.Module, tmp: Path, config: qdq.QuantConfig | None = None) -> Path:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    prepared = qdq.prepare(model.eval(), (x,), config)
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qdq.export_onnx(prepared, (x[:1],), tmp / "m.onnx", exporter="torchscript").path


NAIVE = ("residual", "pooling", "performance")  # Q/DQ on conv inputs and weights only


def test_naive_resnet18_prediction_matches_the_real_engine(tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    # the fixture engine's ONNX: Q/DQ on conv inputs and weights only (residual + GAP float)
    report = lint(_export(tv.resnet18(), tmp_path, qdq.QuantConfig.tensorrt(disable=NAIVE)))
    engine = load_engine_report(engine_file("resnet18-a100-qat"))
    assert report.summary["weighted_layers"] == len(engine.weighted_layers()) == 21
    int8_engine = [lay for lay in engine.weighted_layers() if lay.input_precision == "int8"]
    assert report.summary["int8_weighted_layers"] == len(int8_engine) == 21
    assert report.summary["unfused_qdq"] == len(engine.qdq_reformats()) == 10
    assert [f.rule for f in report.findings].count("P03a") == 8  # every residual Add falls back
    assert "P06" in report.rules("WARN")
    diff = diff_engine(report, engine)
    # layer by layer: every conv (with its fused BN/ReLU/residual Add), the pools and each
    # standalone Quantize line up with the engine, with the same INT8-vs-float input and output
    assert diff.matched_by == "order" and len(diff.matches) == len(report.layers) == 33
    assert diff.mismatches == () and diff.only_predicted == () and diff.only_engine == ()
    fused_adds = [m for m in diff.matches if "Add" in m.engine and m.kind == "weighted"]
    assert len(fused_adds) == 8 and all(m.predicted_output == "fp16" for m in fused_adds)
    assert all("Add" in m.predicted for m in fused_adds)


def test_naive_mobilenet_v2_prediction_matches_the_real_engine(tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    report = lint(_export(tv.mobilenet_v2(), tmp_path, qdq.QuantConfig.tensorrt(disable=NAIVE)))
    engine = load_engine_report(engine_file("mobilenet-qat"))
    diff = diff_engine(report, engine)
    assert diff.compare == {
        "weighted_layers": (53, 53),
        "int8_weighted_layers": (53, 53),
        "unfused_qdq": (17, 17),
    }
    assert len(diff.matches) == len(report.layers) == 71
    assert diff.mismatches == () and diff.only_engine == ()
    # the projection convs whose output feeds a float residual Add run INT8 -> float
    float_out = [m for m in diff.matches if m.kind == "weighted" and m.engine_output != "int8"]
    assert len(float_out) == 17 and all(m.predicted_output == "fp16" for m in float_out)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "yolo_style"])
def test_default_placement_lints_clean(name: str, tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    if name == "yolo_style":
        from models.yolo import YoloStyleNet

        model = YoloStyleNet()
    else:
        model = getattr(tv, name)()
    report = lint(_export(model, tmp_path))
    assert report.verdict == "PASS", report.format()
    if name == "resnet18":
        assert report.summary["unfused_qdq"] == 1  # only the network-input Quantize (P13)


def test_cli_exit_codes_json_targets_and_engine_diff(tmp_path: Path) -> None:
    g = G()
    clean = tmp_path / "clean.onnx"
    onnx.save(g.model([g.conv(g.qdq("x"))]), str(clean))
    g = G()
    warn = tmp_path / "warn.onnx"
    onnx.save(g.model([g.conv("x")]), str(warn))
    bad = tmp_path / "bad.onnx"
    onnx.save(_bad_model(), str(bad))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qdq", "lint", *args], capture_output=True, text=True
        )

    assert run(str(clean)).returncode == 0
    assert run(str(warn)).returncode == 1
    assert run(str(bad)).returncode == 2
    doc = json.loads(run(str(warn), "--json").stdout)
    assert {"findings", "summary"} <= doc.keys()
    assert {"weighted_layers", "int8_weighted_layers", "unfused_qdq", "float_islands"} <= doc[
        "summary"
    ].keys()
    assert {"rule", "severity", "nodes", "message", "fix"} <= doc["findings"][0].keys()
    missing = run(str(tmp_path / "missing.onnx"))
    assert missing.returncode == 3 and "missing.onnx: no such file" in missing.stderr
    wrong = run(str(clean), "--target", "tensorrt10")
    assert wrong.returncode == 3 and "target must look like" in wrong.stderr
    assert run(str(clean), "--flags", "fp16").returncode == 2  # V13: Q/DQ without --int8
    shown = run(str(clean), "--layers", "--target", "trt10.5")
    assert "predicted engine layers" in shown.stdout and "(trt10.5)" in shown.stdout
    engine = str(engine_file("resnet18-a100-qat"))
    doc = json.loads(run(str(clean), "--json", "--engine-report", engine).stdout)
    assert doc["engine"]["compare"]["weighted_layers"] == [1, 21]
    assert {"matched_by", "layer_mismatches", "only_engine"} <= doc["engine"].keys()
    text = run(str(clean), "--engine-report", engine).stdout
    assert "engine report vs prediction" in text
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert run(str(clean), "--engine-report", str(broken)).returncode == 3


def _bad_model() -> onnx.ModelProto:
    g = G()
    x = g.op("QuantizeLinear", ["x", g.const(np.float32(0.1)), g.const(np.uint8(128))])
    return g.model([x])
