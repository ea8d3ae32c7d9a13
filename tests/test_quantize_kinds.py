"""``qdq quantize`` end to end on tiny models: degenerate FP32 outputs are warned about (report,
summary, page), an image-to-image output is headlined by PSNR, and ``--output-kind`` /
``output_kind=`` overrides the guess."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import PtqOptions, QuantData, quantize

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        '''Conv -> ReLU -> Conv at the input's size (an image), or pooled class logits.'''

        def __init__(self, head="image", scale=1.0):
            super().__init__()
            self.head, self.scale = head, scale
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(8, 3, 3, padding=1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            y = torch.relu(self.a(x))
            if self.head == "image":
                return self.b(y)
            logits = self.fc(y.mean((2, 3)))
            if self.head == "constant":
                return logits * 0 + 1.0
            if self.head == "nan":
                return logits * float("nan")
            return logits * self.scale


    def image():
        torch.manual_seed(0)
        return Net("image")


    def nan():
        torch.manual_seed(0)
        return Net("nan")
    """
)
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    (root / "net.py").write_text(MODEL_PY)
    x = torch.randn(24, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    np.save(root / "x.npy", x.numpy())
    return {"py": root / "net.py", "npy": root / "x.npy"}


def _net(files: dict[str, Path], head: str, scale: float = 1.0) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("kinds_net", files["py"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.Net(head, scale).eval()


def _data() -> QuantData:
    x = torch.randn(24, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return QuantData(x[:12], x[12:], None, "tensors", "12 + 12")


def _quantize(model: torch.nn.Module, out: Path, **kw: object) -> dict:
    res = quantize(model, _data(), out=out, exporter="torchscript", show_progress=False,
                   ptq=PtqOptions(), **kw)  # type: ignore[arg-type]  # fmt: skip
    return res.report


@pytest.mark.parametrize(
    ("head", "scale", "problem"),
    [("logits", 1e-41, "underflow"), ("constant", 1.0, "constant"), ("nan", 1.0, "non_finite")],
)
def test_degenerate_fp32_is_warned_about(files, tmp_path: Path, head, scale, problem) -> None:
    r = _quantize(_net(files, head, scale), tmp_path / "o")
    found = r["fp32"]["degenerate"]
    assert [(d["output"], d["problem"], d["headline"]) for d in found] == [(0, problem, True)]
    assert any(w.startswith("the FP32 model is degenerate: output ") for w in r["warnings"])
    assert any("the INT8 figures (the headline top1_agreement" in w for w in r["warnings"])
    page = (tmp_path / "o" / "report.html").read_text(encoding="utf-8")
    assert "The FP32 model is degenerate: the INT8 figures mean nothing" in page


def test_degenerate_fp32_on_the_first_sample_skips_the_recipe_search(files, tmp_path) -> None:
    """Logits that underflow on the check sample: no recipe can be chosen against them, so the
    search does not run (it ran to its end before, then reported top-1 agreement 5 %)."""
    res = quantize(_net(files, "logits", 1e-41), _data(), out=tmp_path / "o",
                   exporter="torchscript", show_progress=False)  # fmt: skip
    search = res.report["ptq"]["recipe_search"]
    assert search["rows"] == [] and res.report["ptq"]["recipe"] == "none"
    assert search["reason"].startswith("not run: the FP32 outputs are degenerate on the first "
                                       "sample (output underflow: its largest |value| is")  # fmt: skip
    assert "recipe_search" not in res.report["timings_s"]


def test_cosine_of_tiny_outputs_is_the_cosine_at_unit_scale(files, tmp_path: Path) -> None:
    unit = _quantize(_net(files, "logits"), tmp_path / "unit")
    tiny = _quantize(_net(files, "logits", 2.0**-100), tmp_path / "tiny")  # about 7.9e-31
    assert unit["fp32"]["degenerate"] == [] and unit["int8"]["cosine_mean"] < 1.0
    assert tiny["int8"]["cosine_mean"] == pytest.approx(unit["int8"]["cosine_mean"], abs=1e-9)
    assert tiny["outputs"][0]["cosine_min"] == pytest.approx(unit["outputs"][0]["cosine_min"])
    assert [d["problem"] for d in tiny["fp32"]["degenerate"]] == ["underflow"]


def test_an_image_output_is_headlined_by_psnr(files, tmp_path: Path) -> None:
    r = _quantize(_net(files, "image"), tmp_path / "o")
    assert r["metric_name"] == "psnr" and r["fp32_metric"] == 100.0
    assert 30.0 < r["int8_metric"] < 100.0 and r["fp32"]["degenerate"] == []
    assert r["headline"]["kind"] == "image" and r["headline"]["source"] == "output"
    assert "image: (N, 3, 16, 16), the input's 3 channels at its size" in r["headline"]["text"]
    row = r["outputs"][0]
    assert (row["kind"], row["figure"], row["value"]) == ("image", "psnr", r["int8_metric"])
    assert r["int8"]["top1_agreement"] is None and set(r["int8"]["figures"]) == {
        "psnr",
        "psnr_min",
        "cosine",
    }
    page = (tmp_path / "o" / "report.html").read_text(encoding="utf-8")
    assert '<div class="v">100.00 dB' in page and "3 channels at its size" in page


def test_output_kind_overrides_the_guess_from_the_cli(files, tmp_path: Path, capsys) -> None:
    base = ["quantize", "--model", f"{files['py']}:image", "--data", str(files["npy"]), *FAST]
    assert main([*base, "--out", str(tmp_path / "psnr")]) == 0
    printed = capsys.readouterr().out
    assert "psnr: FP32 100.0000 (torch)" in printed and " dB)" in printed
    assert "headline: psnr of output 0 with FP32" in printed

    assert main([*base, "--out", str(tmp_path / "map"), "--output-kind", "class_map"]) == 0
    printed = capsys.readouterr().out
    r = json.loads((tmp_path / "map" / "report.json").read_text())
    assert r["metric_name"] == "pixel_agreement" and r["outputs"][0]["kind"] == "class_map"
    assert r["outputs"][0]["kind_reason"] == (
        "class_map: (N, 3, 16, 16), as given (output_kind='class_map')"
    )
    assert "headline: pixel_agreement of output 0 with FP32; class_map: (N, 3, 16, 16)" in printed

    assert main([*base, "--out", str(tmp_path / "bad"), "--output-kind", "segmentation"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq quantize: error: unknown output kind 'segmentation'; choose one")
    assert not (tmp_path / "bad").exists()
    assert main([*base, "--out", str(tmp_path / "bad"), "--output-kind", "class_vector"]) == 2
    assert "does not fit output 0 of shape (N, 3, 16, 16)" in capsys.readouterr().err


def test_degenerate_fp32_in_the_cli_summary(files, tmp_path: Path, capsys) -> None:
    spec = f"{files['py']}:nan"
    assert main(["quantize", "--model", spec, "--data", str(files["npy"]),
                 "--out", str(tmp_path / "o"), *FAST]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert (
        "  WARNING: FP32 output non_finite: 120 of 120 values are NaN or infinite; the INT8 "
        in printed
    )


def test_output_kind_is_refused_where_labels_decide_the_headline(files, tmp_path: Path) -> None:
    data = _data()
    labelled = QuantData(data.calibration, data.evaluation, torch.arange(12) % 10, "t", "12 + 12")
    with pytest.raises(ValueError, match=r"output_kind 'tensor' sets the kind of output 0.* the "
                       r"labels \(top-1 accuracy\) decide"):  # fmt: skip
        quantize(_net(files, "logits"), labelled, out=tmp_path / "o", output_kind="tensor",
                 show_progress=False, ptq=PtqOptions())  # fmt: skip
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_is_quantized_from_a_float32_copy(
    files, tmp_path: Path, dtype: torch.dtype
) -> None:
    """A model whose weights are float16/bfloat16 (an ultralytics ``.pt`` loads so) runs the
    main job on a float32 copy, says so, and is left as it was; before, its first layer refused
    the float32 calibration samples."""
    model = _net(files, "logits").to(dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = _quantize(model, tmp_path / "o")
    assert report["int8"]["metric"] == pytest.approx(report["fp32_metric"], abs=0.1)
    assert any(
        str(dtype).removeprefix("torch.") in w and "float32 copy" in w for w in report["warnings"]
    )
    assert all(t.dtype == dtype for t in model.state_dict().values())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
