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
    out = tmp_path / "rep"
    proc = subprocess.run(
        [sys.executable, "-m", "qdq", "demo", "--out", str(out), "--limit", "2000"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "FP32 accuracy" in proc.stdout and "lint verdict: PASS" in proc.stdout
    assert "ONNX Runtime INT8 accuracy" in proc.stdout and "bit-exact: True" in proc.stdout
    report = json.loads((out / "demo.json").read_text())
    assert report["test_images"] == 2000
    assert report["lint"]["verdict"] == "PASS"
    assert report["plan"]["coverage"][0]["status"] == "int8"
    assert Path(report["onnx"]["path"]).is_file() and report["onnx"]["qdq_bit_exact"]
    best = report["int8"][report["best_method"]]["accuracy"]
    assert abs(report["onnx"]["accuracy"] - best) <= 0.002  # ORT accuracy == torch accuracy
    assert set(report["int8"]) == {"max", "entropy", "mse", "percentile"}
    fp32 = report["fp32"]["accuracy"]
    assert fp32 > 0.9
    for method, res in report["int8"].items():
        assert len(res["amax"]) == 9, method  # one per scale group (fc stays float, P14)
        assert all(a <= report["int8"]["max"]["amax"][k] for k, a in res["amax"].items())
    for method in ("max", "mse", "percentile"):  # entropy clips this model hard (see docs)
        res = report["int8"][method]
        assert abs(res["accuracy"] - fp32) < 0.01, method
        assert res["mean_cosine"] > 0.999, method


def test_demo_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
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
