"""``qdq quantize --format nvfp4|mxfp8|int4w`` end to end (issue 60): the plan's block formats,
the export in TensorRT's forms at the opset its types need, ONNX Runtime (through the exact
reference of :mod:`qdq.backends.blocks_reference`) agreeing with the torch fake-quant model, the
linter's format counts, the report's block sizes, ``--max-drop``; targets without the kernels or
whose parser cannot read the opset refused before anything runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qdq.cli.main import main
from qdq.pipeline import quantize

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Block(nn.Module):
        '''A pre-norm MLP block with a residual, and a head: three GEMMs (K 32, 64, 32).'''

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = nn.LayerNorm(32)
            self.fc1 = nn.Linear(32, 64)
            self.fc2 = nn.Linear(64, 32)
            self.head = nn.Linear(32, 16)

        def forward(self, x):
            x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
            return self.head(x)


    def build():
        return Block().eval()
    """
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("blockjob")
    model = root / "block.py"
    model.write_text(MODEL_PY)
    data = root / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((48, 8, 32)).astype(np.float32))
    return model, data


@pytest.mark.parametrize(
    ("fmt", "opset", "target", "quantizers", "lint_field"),
    [
        ("nvfp4", 23, "trt10.12-blackwell", {"nvfp4": 6}, "nvfp4_weighted_layers"),
        # MXFP8 for TensorRT 10.12 (the default): TensorRT's form, UINT8 exponents at opset 19
        ("mxfp8", 19, "trt10.12-blackwell", {"mxfp8": 6}, "mxfp8_weighted_layers"),
        ("int4w", 21, "trt10.12", {"int4": 3}, "int4w_weighted_layers"),
    ],
)
def test_block_job_end_to_end(
    files, tmp_path: Path, capsys, fmt, opset, target, quantizers, lint_field
):
    model, data = files
    out = tmp_path / fmt
    res = quantize(f"{model}:build", str(data), out=out, format=fmt, ptq="none",
                   show_progress=False)  # fmt: skip
    report = res.report
    assert report["settings"]["format"] == quantizers
    assert report["settings"]["opset"] == opset
    assert report["settings"]["target"] == target
    assert report["settings"]["block_form"] == ("trt" if fmt == "mxfp8" else "onnx")
    assert report["settings"]["method"] == (
        "max (INT4 weights)" if fmt == "int4w" else "max (NVFP4/MXFP8 per-tensor amax)"
    )
    # the exported ONNX in ONNX Runtime agrees with the fake-quant model
    ort_fq, torch_fq = report["int8"], report["int8_torch"]
    assert ort_fq["cosine_mean"] == pytest.approx(torch_fq["cosine_mean"], abs=1e-4)
    assert ort_fq["cosine_mean"] > 0.9
    assert report["lint"][lint_field] == 3
    sizes = {q["path"]: q["block_size"] for q in report["quantizers"]}
    assert sizes["fc1.weight_quantizer"] == {"nvfp4": 16, "mxfp8": 32, "int4w": 32}[fmt]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["opset"] == opset
    page = (out / "report.html").read_text()
    assert f"{fmt.replace('w', '').upper()}/" in page  # the plan table's format and block size
    # qdq parity plans the model again in the recorded formats: per layer, every activation
    # quantizer's Q/DQ equals torch's bit for bit, and no code differs beyond a rounding flip
    capsys.readouterr()
    code = main(["parity", str(out / "model.qdq.onnx"), "--model", f"{model}:build",
                 "--data", str(data), "--json"])  # fmt: skip
    assert code == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    if fmt == "int4w":
        assert layers == {}  # weight-only: no activation quantizer
    else:
        assert sorted(layers) == ["fc1.input_quantizer", "fc2.input_quantizer",
                                  "head.input_quantizer"]  # fmt: skip
        for row in layers.values():
            assert row["elements"] > 0 and row["qdq_mismatches"] == 0
            assert row["unexplained_codes"] == 0


def test_block_formats_from_the_cli_and_refused_targets(files, tmp_path, capsys) -> None:
    model, data = files
    out = tmp_path / "cli"
    code = main(["quantize", "--model", f"{model}:build", "--data", str(data), "--out", str(out),
                 "--format", "nvfp4", "--recipe", "none", "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "opset 23" in printed
    # the quantized model is named by its format, not INT8; the engine time is priced in FP4
    assert "Q/DQ (ONNX Runtime)" in printed and "  NVFP4 vs FP32 (output 0): " in printed
    assert "  INT8 " not in printed.split("predicted TensorRT")[0]
    report = json.loads((out / "report.json").read_text())
    gemms = [ly for ly in report["latency"]["layers"] if ly["type"] == "gemm"]
    assert gemms and {ly["precision"] for ly in gemms} == {"nvfp4"}
    assert report["latency"]["unsized"] == []
    page = (out / "report.html").read_text()
    assert "NVFP4 vs FP32" in page and "INT8 vs FP32" not in page
    for fmt, target, why in [
        ("nvfp4", "trt10-hopper", "NVFP4 needs TensorRT 10.8"),
        ("nvfp4", "trt10.12-ada", "needs a Blackwell GPU"),
        ("nvfp4", "trt10.8-blackwell", "reads up to opset 20"),
        ("mxfp8", "trt10-hopper", "MXFP8 needs TensorRT 10.12"),
        ("mxfp8", "trt10.8-blackwell", "MXFP8 needs TensorRT 10.12"),
        ("int4w", "trt10", "reads up to opset 20"),
    ]:
        with pytest.raises(ValueError, match=why):
            quantize(f"{model}:build", str(data), out=tmp_path / "x", format=fmt, target=target)
        assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="optimises a per-tensor grid"):
        quantize(f"{model}:build", str(data), out=tmp_path / "y", format="nvfp4", calib="mse")


@pytest.mark.parametrize(("fmt", "form"), [("nvfp4", "onnx"), ("mxfp8", "trt")])
def test_block_max_drop_fallback_keeps_the_format(files, tmp_path: Path, monkeypatch, fmt, form):
    """The fallback keeps the format, and its lint-cost exports (like the speed stage's) are
    written in the job's form (MXFP8 on trt10.12-blackwell: TensorRT's, opset 19)."""
    import qdq.export

    model, data = files
    real, forms = qdq.export.export_onnx, []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        forms.append(kwargs.get("block_form", "onnx"))
        return real(*args, **kwargs)

    monkeypatch.setattr(qdq.export, "export_onnx", recording)
    res = quantize(f"{model}:build", str(data), out=tmp_path / "f", format=fmt, ptq="none",
                   max_drop=0.0, show_progress=False)  # fmt: skip
    fb = res.report["fallback"]
    assert fb is not None and fb["max_drop"] == 0.0
    kept = {q["format"] for q in res.report["quantizers"]}
    assert kept <= {fmt}
    assert forms and set(forms) == {form}, forms
    assert res.report["settings"]["block_form"] == form


def test_int4w_job_runs_the_awq_clip_search_unless_recipe_none(files, tmp_path: Path) -> None:
    model, data = files
    res = quantize(f"{model}:build", str(data), out=tmp_path / "awq", format="int4w",
                   show_progress=False)  # fmt: skip
    report = res.report
    assert "int4_clip" in report["timings_s"]
    clip = report["ptq"]["awq_clip"]
    assert [r["name"] for r in clip["rows"]] == ["fc1:weight", "fc2:weight", "head:weight"]
    assert all(r["sqnr_after_db"] >= r["sqnr_before_db"] for r in clip["rows"])
    assert report["ptq"]["steps"].startswith("AWQ clip (INT4 weights)")
    manifest = json.loads((tmp_path / "awq" / "manifest.json").read_text())
    assert {q["method"] for q in manifest["quantizers"]} == {"awq"}
    assert report["int8"]["cosine_mean"] == pytest.approx(report["int8_torch"]["cosine_mean"],
                                                          abs=1e-4)  # fmt: skip
    none = quantize(f"{model}:build", str(data), out=tmp_path / "none", format="int4w",
                    ptq="none", show_progress=False)  # fmt: skip
    assert "int4_clip" not in none.report["timings_s"]
    # the search keeps each row's amax only where it lowers the layer's output error in-sample
    assert report["int8"]["cosine_mean"] >= none.report["int8"]["cosine_mean"] - 1e-3
