"""End-to-end: the ``qdq`` command and the demo it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qdq._io import atomic_write_text
from qdq.cli.main import main


def test_demo_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("qdq.zoo.fashion_mnist")
    out = tmp_path / "demo-out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qdq",
            "demo",
            "--out",
            str(out),
            "--limit",
            "1000",
            "--calib-samples",
            "128",
            "--no-progress",
            # the method table below needs --compare-methods, which the default budget drops
            # when the machine is busy (a parallel test run); the search keeps its demo size
            "--time-budget",
            "900",
            "--search-budget",
            "10",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "top1_accuracy: FP32" in proc.stdout and "lint PASS" in proc.stdout
    assert "exported ONNX in ONNX Runtime" in proc.stdout and "<- exported" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.qdq.onnx",
        "report.html",
        "report.json",
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["evaluation_samples"] == 1000
    assert report["data"]["calibration_samples"] == 128
    assert report["lint_verdict"] == "PASS"
    assert report["plan"]["coverage"][0]["status"] == "int8"
    assert [s["name"] for s in report["skipped_layers"]] == ["fc"]  # P14: 10 outputs
    # what ONNX Runtime measures on the export is what torch fake-quant measures
    assert abs(report["int8_metric"] - report["int8_torch"]["metric"]) <= 0.002
    assert report["int8_torch"]["vs_onnxruntime"]["top1_agreement"] >= 0.998
    methods = report["calibration_methods"]
    assert set(methods) == {"max", "entropy", "mse", "percentile"}
    assert methods["mse"]["metric"] == report["int8_torch"]["metric"]  # mse is the one exported
    fp32 = report["fp32_metric"]
    assert fp32 > 0.9
    acts = [q for q in report["quantizers"] if q["kind"] == "input"]
    # one per activation scale group: fc stays float (P14), and so does layer3's downsample skip
    # (P03: the last block's fused conv+Add writes float, so it reads its residual in float)
    assert len(acts) == 8
    for method in ("max", "mse", "percentile"):  # entropy clips this model hard (see docs)
        res = methods[method]
        assert abs(res["metric"] - fp32) < 0.01, method
        assert res["cosine_mean"] > 0.999, method


def test_demo_replaces_only_its_own_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("not a demo")
    assert main(["demo", "--out", str(out), "--limit", "10", "--no-progress"]) == 2
    assert "not empty; pass --overwrite" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_demo_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["demo", "--out", str(out), "--time-budget", "-1", "--no-progress"]) == 2
    assert "time_budget must be a number of seconds > 0" in capsys.readouterr().err
    assert not out.exists()
    assert main(["demo", "--limit", "0"]) == 2
    assert "--limit must be >= 1" in capsys.readouterr().err


def test_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    with pytest.raises(FileExistsError, match="overwrite"):
        atomic_write_text(path, "three", overwrite=False)
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temporary files left
