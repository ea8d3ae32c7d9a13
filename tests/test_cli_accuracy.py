"""``qdq debug``, ``qdq sensitivity`` and ``qdq quantize --max-drop`` on a model with one fragile layer."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from qdq.cli.main import main

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Fragile(nn.Module):
        # conv2 ignores channel 0, which carries huge spikes: its per-tensor max scale crushes
        # every other channel
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
            self.fc = nn.Linear(32 * 36, 16)
            with torch.no_grad():
                self.conv2.weight[:, 0] = 0.0

        def forward(self, x):
            y = torch.relu(self.conv1(x))
            spikes = torch.zeros_like(y)
            spikes[:, 0, 0, 0] = 200.0
            y = torch.relu(self.conv2(y + spikes))
            y = torch.relu(self.conv3(y))
            return self.fc(nn.functional.avg_pool2d(y, 2).flatten(1))


    def build():
        torch.manual_seed(0)
        return Fragile().eval()
    """
)
COMMON = ("--calib", "max", "--calib-samples", "64", "--batch-size", "16", "--no-progress")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("accuracy")
    (root / "fragile.py").write_text(MODEL_PY)
    x = torch.randn(192, 3, 12, 12, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(root / "x.npy", x)
    return {"model": f"{root / 'fragile.py'}:build", "data": str(root / "x.npy")}


def test_debug_ranks_the_fragile_layer_first(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sub" / "errors.json"
    args = ["debug", "--model", inputs["model"], "--data", inputs["data"], *COMMON]
    assert main([*args, "--top", "2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[2].split()[0] in ("conv2:input", "conv3:input") and "isolated" in lines[1]
    assert f"wrote {out}" in text
    saved = json.loads(out.read_text())
    iso = {r["name"]: r["isolated"]["sqnr_db"] for r in saved["rows"]}
    assert min(iso, key=iso.__getitem__) == "conv2:input"  # on its own, conv2 is the damage
    assert saved["samples"] == 64 and saved["calibration"] == "max"
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["name"] == saved["rows"][0]["name"]


@pytest.mark.parametrize("metric", ["proxy", "task"])
def test_sensitivity_ranks_the_fragile_layer_first(inputs, capsys, metric: str) -> None:
    args = ["sensitivity", "--model", inputs["model"], "--data", inputs["data"], *COMMON]
    assert main([*args, "--metric", metric, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"][0]["name"] == "conv2:input" and result["mode"] == "one-off"
    assert result["scored_by"] == ("metric" if metric == "task" else "output_sqnr_db")
    assert len(result["rows"]) == 5


def test_quantize_max_drop_falls_back_the_fragile_layer_only(
    inputs, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--recipe", "none", *COMMON]  # fmt: skip
    assert main([*args, "--max-drop", "0.05"]) == 0
    text = capsys.readouterr().out
    assert "kept in float: conv2" in text and "float: conv2:input" in text
    report = json.loads((out / "report.json").read_text())
    fb = report["fallback"]
    assert fb["fallback"] == ["conv2"] and fb["within_budget"]
    assert fb["full_int8_metric"] < fb["int8_metric"]
    # the published figure is the exported model's: within the budget in ONNX Runtime too
    assert report["fp32_metric"] - report["int8_metric"] <= 0.05 + 1e-9
    assert report["settings"]["max_drop"] == 0.05
    assert {s["name"]: s["rule"] for s in report["skipped_layers"]} == {"conv2": "USER"}
    graph = onnx.load(str(out / "model.qdq.onnx")).graph
    conv_inputs = {n.input[0] for n in graph.node if n.op_type == "Conv"}
    fed_by_dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    assert len(conv_inputs & fed_by_dq) == 2  # conv1 and conv3 read Q/DQ, conv2 reads float
    html = (out / "report.html").read_text()
    assert "Fallback within" in html and "<code>conv2:input</code>" in html


def test_bad_arguments_are_one_line(inputs, capsys) -> None:
    args = ["sensitivity", "--model", inputs["model"], "--data", inputs["data"], *COMMON]
    assert main([*args, "--samples", "0"]) == 2
    assert "--samples must be >= 1" in capsys.readouterr().err
    assert main(["debug", "--model", "nowhere.py:build", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq debug: error:") and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["quantize", "--model", inputs["model"], "--max-drop", "lots"])
    capsys.readouterr()
    assert main(["quantize", "--model", inputs["model"], "--data", inputs["data"],
                 "--max-drop", "-1", "--no-progress"]) == 2  # fmt: skip
    assert "max_drop must be a number >= 0" in capsys.readouterr().err


def test_quantize_with_the_method_per_quantizer(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--calib-per-quantizer", "--compare-methods",
            *COMMON]  # fmt: skip
    assert main(args) == 0
    assert "PTQ: method per quantizer" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    choice = report["ptq"]["method_per_quantizer"]
    assert report["settings"]["ptq"] == "method per quantizer" and choice["rows"]
    methods = {q["name"]: q["method"] for q in report["quantizers"] if "input" in q["name"]}
    chosen = {r["name"]: r["chosen"].split()[0] for r in choice["rows"]}
    assert set(chosen) <= set(methods)
    assert all(methods[n] == m for n, m in chosen.items())
    # comparing every method (on a copy) left the exported choice in place: the report's amax
    # are the manifest's, which are the ONNX's
    manifest = {q["path"]: q for q in json.loads((out / "manifest.json").read_text())["quantizers"]}
    acts = [q for q in report["quantizers"] if not q["per_channel"]]
    assert acts and all(q["amax"] == manifest[q["path"]]["amax"] for q in acts)
    assert all(q["method"] == manifest[q["path"]]["method"] for q in acts)
    assert set(report["calibration_methods"]) == {"max", "entropy", "mse", "percentile"}


def test_quantize_with_adaround_and_bias_correction(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--rounding", "adaround", "--bias-correction",
            "--calib", "mse", "--calib-samples", "32", "--batch-size", "16",
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "PTQ: AdaRound + bias correction" in text and "adaround on" in text
    report = json.loads((out / "report.json").read_text())
    assert report["ptq"]["adaround"]["rows"] and report["ptq"]["bias_correction"]["rows"]
    manifest = (out / "manifest.json").read_text()
    assert "adaround" in manifest  # the manifest says which weights carry learned rounding
    html = (out / "report.html").read_text()
    assert "PTQ improvements: AdaRound + bias correction" in html
    assert "<li>adaround on" in html and "<li>bias correction" in html
    # the exported model passed the export's ORT verification; its metric is the ORT one
    assert report["int8_metric"] >= report["int8_torch"]["metric"] - 0.02


def test_quantize_with_kernel_sum_rounding(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--rounding", "kernel-sum", "--calib-samples", "32",
            "--batch-size", "16", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "PTQ: kernel-sum rounding" in text and "kernel-sum rounding on" in text
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["ptq"] == "kernel-sum rounding"
    rows = report["ptq"]["kernel_sum"]["rows"]
    assert rows and all(r["max_sum_error"] <= 0.5 + 1e-4 for r in rows)
    assert "kernel-sum" in (out / "manifest.json").read_text()


def test_quantize_with_a_recipe_name(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--recipe", "bias+kernel-sum", "--calib-samples", "32",
            "--batch-size", "16", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "PTQ: kernel-sum rounding + bias correction" in text
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["recipe"] == report["ptq"]["recipe"] == "kernel-sum+bias"
    assert set(report["ptq"]) >= {"kernel_sum", "bias_correction"}
    clash = [*args[:-1], "--bias-correction", "--no-progress", "--overwrite"]
    assert main(clash) == 2
    assert "--recipe bias+kernel-sum and --bias-correction both set" in capsys.readouterr().err
    assert main([*args[:9], "--recipe", "sharpen", "--overwrite", "--no-progress"]) == 2
    assert "unknown recipe part" in capsys.readouterr().err


def test_quantize_with_equalization(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["quantize", "--model", inputs["model"], "--data", inputs["data"], "--out", str(out),
            "--exporter", "torchscript", "--equalize", "--calib-samples", "32",
            "--batch-size", "16", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "PTQ: equalization" in text and "cross-layer equalization of 1/1 pair(s)" in text
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["ptq"] == "equalization"
    # conv2 -> relu -> conv3 is the one pair: conv1's output meets the spikes' add first, and
    # conv3 reaches fc only through a flatten
    rows = report["ptq"]["equalize"]["rows"]
    assert [(r["producer"], r["consumers"]) for r in rows] == [("conv2", ["conv3"])]
    assert "equalize" in report["timings_s"] and "ptq" not in report["timings_s"]
    html = (out / "report.html").read_text()
    assert "PTQ improvements: equalization" in html
    assert "<li>cross-layer equalization of 1/1 pair(s)" in html
    assert "<td><code>conv2</code></td>" in html and "<td><code>conv3</code></td>" in html
    # the exported INT8 model carries the equalized float weights (conv2's rows, conv3's input
    # columns); conv1, in no pair, is exported as the user wrote it
    exported = onnx.load(str(out / "model.qdq.onnx"))
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in exported.graph.initializer}
    sys.path.insert(0, str(Path(inputs["model"].rpartition(":")[0]).parent))
    try:
        import fragile  # the test's own model file
    finally:
        sys.path.pop(0)
    user = {k: v.numpy() for k, v in fragile.build().state_dict().items()}
    assert np.array_equal(weights["conv1.weight"], user["conv1.weight"])
    for name in ("conv2.weight", "conv2.bias", "conv3.weight"):
        assert weights[name].shape == user[name].shape
        assert not np.allclose(weights[name], user[name], rtol=1e-3, atol=0), name
