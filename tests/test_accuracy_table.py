"""The accuracy benchmark's bookkeeping (``benchmarks/accuracy_table.py``): rows, JSON, tables,
the qdq-vs-peer comparison and the calibration ``.npz`` the peer environment reads. No model runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from accuracy_qdq import module_of
from accuracy_table import (
    Row,
    compare,
    format_table,
    read_calib,
    row_from_dict,
    write_calib,
    write_json,
)


def _row(tool: str, method: str, placement: str, metric: float, int8: int) -> Row:
    return Row(
        tool, method, placement, onnx=f"{tool}-{method}.onnx", metric=metric, fp32_metric=0.92,
        cosine=0.999, cosine_min=0.99, int8_layers=int8, weighted_layers=10, lint="PASS",
        calib_s=1.0, calib_x=10.0,
    )  # fmt: skip


def test_calib_npz_round_trip(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((5, 1, 4, 4)).astype(np.float64)
    write_calib(tmp_path / "calib.npz", "input", x)
    name, back = read_calib(tmp_path / "calib.npz")
    assert name == "input"
    assert back.dtype == np.float32 and back.flags.c_contiguous
    np.testing.assert_array_equal(back, x.astype(np.float32))


def test_calib_npz_needs_one_array(tmp_path: Path) -> None:
    np.savez(tmp_path / "two.npz", a=np.zeros(2), b=np.zeros(2))
    with pytest.raises(ValueError, match="one array"):
        read_calib(tmp_path / "two.npz")


def test_row_round_trips_through_json(tmp_path: Path) -> None:
    row = _row("modelopt-onnx", "entropy", "default", 0.9195, 9)
    row.lint_rules = ["P05"]
    write_json(tmp_path / "r.json", {"rows": [row]})
    data = json.loads((tmp_path / "r.json").read_text())["rows"][0]
    assert data["label"] == "ModelOpt ONNX entropy [default]"
    assert data["coverage"] == "9/10"
    assert data["drop_pt"] == pytest.approx(0.05)
    assert row_from_dict(data) == row
    with pytest.raises(ValueError, match="lacks"):
        row_from_dict({"tool": "qdq"})


def test_table_lists_not_run_rows_and_notes() -> None:
    rows = [
        Row("fp32", "-", "-", onnx="fp32.onnx", metric=0.92, fp32_metric=0.92, cosine=1.0,
            cosine_min=1.0, int8_layers=0, weighted_layers=10, lint="ERROR"),
        _row("qdq", "mse", "full", 0.921, 10),
        Row("modelopt-torch", "max", "INT8_DEFAULT_CFG", note="not run: no peer environment"),
    ]  # fmt: skip
    rows[1].note = "a remark"
    rows[1].figures = {"rpa_10c": 0.93, "median_cents_error": 3.0}
    text = format_table("== title", "top1_accuracy", rows)
    lines = text.splitlines()
    assert lines[0] == "== title"
    assert "top1_accuracy" in lines[1] and "x FP32" in lines[1]
    fp32_line = next(ln for ln in lines if ln.startswith("FP32"))
    assert "92.00" in fp32_line and "ERROR" not in fp32_line  # FP32 has no Q/DQ to lint
    qdq_line = next(ln for ln in lines if ln.startswith("qdq mse [full]"))
    assert "92.10" in qdq_line and "-0.10" in qdq_line and "10/10" in qdq_line
    assert any("ModelOpt torch" in ln and "not run: no peer environment" in ln for ln in lines)
    assert lines[-1] == "  qdq mse [full]: a remark"
    assert "task metric figures:" in lines
    assert any(ln.startswith("  qdq mse [full]") and "rpa_10c 0.93, median_cents_error 3" in ln
               for ln in lines)  # fmt: skip


def test_compare_at_equal_coverage() -> None:
    rows = [
        _row("qdq", "mse", "default", 0.9190, 9),
        _row("qdq", "max", "default", 0.9200, 9),
        _row("qdq", "mse", "full", 0.9180, 10),
        _row("ort", "MinMax", "TensorRT-style", 0.9190, 10),
        _row("modelopt-onnx", "max", "default", 0.9195, 9),
        _row("modelopt-torch", "max", "INT8_DEFAULT_CFG", 0.9150, 3),
    ]
    lines = compare(rows)
    assert len(lines) == 3
    assert lines[0].startswith("ORT quantize_static MinMax [TensorRT-style] (10/10)")
    assert "LOSES (cos mean" in lines[0]  # qdq mse full drops 0.40 pt, ORT 0.30 pt
    assert "best qdq max [default] +0.00 pt: LOSES" in lines[1]
    assert lines[2].endswith("no qdq row at this coverage")


def test_module_of_torchscript_node_names() -> None:
    modules = {"_fc", "_blocks.0._depthwise_conv", "layer1"}
    assert module_of("/_fc/Gemm", modules) == "_fc"
    assert module_of("/_blocks.0/_depthwise_conv/Conv", modules) == "_blocks.0._depthwise_conv"
    assert module_of("/layer1/conv9/Conv", modules) is None  # no such module
    assert module_of("Conv_12", modules) is None  # a name without scopes
