"""``qdq quantize`` end to end on tiny models and small data; the Python API it wraps."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import qdq
from qdq.cli.main import main
from qdq.pipeline import (
    DataOptions,
    PtqOptions,
    quantize,
)
from qdq.pipeline.report import STABLE_KEYS

pytest.importorskip("onnxruntime")

MODEL_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            y = F.relu(self.conv1(x))
            y = F.relu(self.conv2(y)) + y
            return self.fc(y.mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net()


    def broken():
        raise RuntimeError("factory exploded")
    """
)
FILES = ["manifest.json", "model.qdq.onnx", "report.html", "report.json"]
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantize")
    (root / "tiny_model.py").write_text(MODEL_PY)
    x = torch.randn(48, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(root / "labelled.npz", x=x, y=np.arange(48) % 10)
    np.save(root / "plain.npy", x)
    return {
        "root": root,
        "py": root / "tiny_model.py",
        "npz": root / "labelled.npz",
        "npy": root / "plain.npy",
    }


def _cli(i: dict[str, Path], out: Path, *extra: str, model: str | None = None) -> list[str]:
    spec = model if model is not None else f"{i['py']}:build"
    return ["quantize", "--model", spec, "--out", str(out), *FAST, *extra]


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_happy_path_and_api_agree(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli"
    assert main(_cli(inputs, out, "--data", str(inputs["npz"]), "--compare-methods")) == 0
    printed = capsys.readouterr().out
    assert "top1_accuracy: FP32" in printed and "predicted TensorRT INT8 coverage: 2/3" in printed
    assert f"wrote {out}/" in printed and "<- exported" in printed
    assert sorted(p.name for p in out.iterdir()) == FILES and not _leftovers(tmp_path)
    report = json.loads((out / "report.json").read_text())
    assert set(STABLE_KEYS) <= set(report)
    assert report["metric_name"] == "top1_accuracy" and report["data"]["labelled"]
    assert (
        report["data"]["calibration_samples"] == 24 and report["data"]["evaluation_samples"] == 24
    )
    assert 0.0 <= report["int8_metric"] <= 1.0
    assert report["lint"]["weighted_layers"] == 3 and report["lint_verdict"] == "PASS"
    assert report["skipped_layers"] == [
        {
            "name": "fc",
            "type": "Linear",
            "status": "float",
            "rule": "P14",
            "reason": report["skipped_layers"][0]["reason"],
        }
    ]
    assert set(report["timings_s"]) >= {"capture_plan", "calibrate", "export", "int8_eval", "lint"}
    assert set(report["calibration_methods"]) == {"max", "entropy", "mse", "percentile"}
    assert report["int8_torch"]["vs_onnxruntime"]["cosine_min"] > 0.9999  # ORT computes torch's
    assert report["plan"]["coverage"][0]["module"] == "conv1"

    api = quantize(
        f"{inputs['py']}:build",
        str(inputs["npz"]),
        out=tmp_path / "api",
        exporter="torchscript",
        show_progress=False,
        ptq=PtqOptions(),
    )
    for key in ("metric_name", "fp32_metric", "int8_metric", "fp32", "int8", "lint"):
        assert api.report[key] == report[key], key
    assert api.onnx_path.is_file() and api.manifest_path.name == "manifest.json"


def test_json_output_is_the_report(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "j"
    assert main(_cli(inputs, out, "--data", str(inputs["npy"]), "--json")) == 0
    printed = json.loads(capsys.readouterr().out)  # nothing else on stdout
    assert printed == json.loads((out / "report.json").read_text())
    assert printed["metric_name"] == "top1_agreement" and printed["fp32_metric"] == 1.0


def test_parity_finds_manifest_json(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "q"
    assert main(_cli(inputs, out, "--data", str(inputs["npy"]))) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["onnx"]["file"] == "model.qdq.onnx"
    assert qdq.export.find_manifest(out / "model.qdq.onnx") == out / "manifest.json"
    args = [
        "parity",
        str(out / "model.qdq.onnx"),
        "--model",
        f"{inputs['py']}:build",
        "--data",
        str(inputs["npy"]),
    ]
    assert main(args) == 0
    assert "verdict: PASS" in capsys.readouterr().out


def test_without_labels_the_metric_is_agreement(inputs, tmp_path: Path) -> None:
    res = quantize(
        f"{inputs['py']}:build",
        str(inputs["npy"]),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        data_options=DataOptions(calib_samples=8, eval_samples=10),
        ptq=PtqOptions(),
    )
    assert res.metric_name == "top1_agreement" and res.fp32_metric == 1.0
    assert res.report["data"]["evaluation_samples"] == 10 and not res.report["data"]["labelled"]
    assert res.int8_metric == res.report["int8"]["top1_agreement"]
    assert res.report["int8"]["cosine_mean"] > 0.99


def test_model_is_not_mutated(inputs, tmp_path: Path) -> None:
    from qdq.specs import load_model_spec

    model = load_model_spec(f"{inputs['py']}:build").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantize(
        model,
        str(inputs["npy"]),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        ptq=PtqOptions(),
    )
    assert model.training and not any(isinstance(m, qdq.Quantizer) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_overwrite(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    args = _cli(inputs, out, "--data", str(inputs["npy"]))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq quantize: error: ") and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    assert main([*args, "--overwrite"]) == 0  # replaces qdq's own files only
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, "precious.txt"])
    assert (out / "precious.txt").read_text() == "keep" and not _leftovers(tmp_path)


def test_failure_after_staging_leaves_nothing(inputs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(_cli(inputs, out, "--data", str(inputs["npy"]), "--opset", "99")) == 2
    assert "opset must be an int in 13..21" in capsys.readouterr().err
    assert not out.exists() and not _leftovers(tmp_path)


def _bad_cases(i: dict[str, Path]) -> list[tuple[list[str], str]]:
    root, py, npy = i["root"], i["py"], str(i["npy"])
    np.save(root / "gray.npy", np.zeros((6, 1, 8, 8), np.float32))
    np.savez(root / "odd.npz", a=np.zeros((4, 3, 8, 8)), b=np.zeros(4))
    np.savez(root / "big_labels.npz", x=np.load(npy)[:8], y=np.full(8, 50))
    (root / "garbage.npy").write_bytes(b"not numpy")
    (root / "notes.txt").write_text("hello")
    (root / "notes.md").write_text("hello")
    torch.save({"w": torch.zeros(2)}, root / "state.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(root / "scripted.pt"))
    (root / "imgs").mkdir(exist_ok=True)
    _png(root / "imgs" / "a.png", np.zeros((8, 8, 3), np.uint8))
    return [
        (
            ["--model", "resnet9000", "--data", npy],
            "built-in zoo models: crepe-tiny, efficientnet-lite0, fashion-mnist-resnet, mtcnn-onet",
        ),
        (["--model", f"{root}/nope.py:build", "--data", npy], "no model file at"),
        (["--model", f"{py}:nothing", "--data", npy], "has no attribute 'nothing'"),
        (["--model", f"{py}:broken", "--data", npy], "RuntimeError: factory exploded"),
        (["--model", f"{py}:build", "--data", f"{root}/missing.npy"], "no data file at"),
        (
            ["--model", f"{py}:build", "--data", "imagenet"],
            "built-in datasets: crepe-tones, fashion-mnist, lfw-faces-24",
        ),
        (["--model", f"{py}:build"], "--data is required"),
        (["--model", f"{py}:build", "--data", f"{root}/gray.npy"], "shape (1, 1, 8, 8)"),
        (["--model", f"{py}:build", "--data", f"{root}/garbage.npy"], "cannot read data file"),
        (["--model", f"{py}:build", "--data", f"{root}/odd.npz"], "expected one input array"),
        (["--model", f"{py}:build", "--data", f"{root}/big_labels.npz"], "labels up to 50"),
        (["--model", f"{py}:build", "--data", f"{root}/notes.md"], "expected an image folder"),
        (["--model", f"{py}:build", "--data", f"{root}/notes.txt"], "give --tokenizer DIR"),
        (["--model", f"{py}:build", "--data", npy, "--tokenizer", str(root)], "for text files"),
        (["--model", f"{py}:build", "--data", f"{root}/imgs"], "--image-size"),
        (["--model", f"{root}/state.pt", "--data", npy], "not a TorchScript archive"),
        (["--model", f"{root}/scripted.pt", "--data", npy], "TorchScript archive: qdq cannot"),
        (["--model", f"{py}:build", "--data", npy, "--target", "trt7"], "trt7"),
        (["--model", f"{py}:build", "--data", npy, "--calib-samples", "0"], "calib_samples"),
    ]


def _png(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(pixels).save(path)


def test_bad_inputs_one_line_no_output(inputs, tmp_path: Path, capsys) -> None:
    for args, message in _bad_cases(inputs):
        out = tmp_path / "out"
        assert main(["quantize", *args, "--out", str(out), *FAST]) == 2, args
        captured = capsys.readouterr()
        err = captured.err
        assert err.startswith("qdq quantize: error: ") and message in err, (args, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert not out.exists() and not _leftovers(tmp_path), args


def test_shape_mismatch_names_both_shapes(inputs, capsys, tmp_path: Path) -> None:
    np.save(tmp_path / "gray.npy", np.zeros((6, 1, 8, 8), np.float32))
    args = ["--model", f"{inputs['py']}:build", "--data", str(tmp_path / "gray.npy")]
    assert main(["quantize", *args, "--out", str(tmp_path / "o"), *FAST]) == 2
    err = capsys.readouterr().err
    assert "shape (1, 1, 8, 8)" in err and "Conv2d with 3 input channels" in err


def test_onnx_without_onnx2torch(inputs, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx2torch", None)  # as if not installed (import fails)
    (tmp_path / "m.onnx").write_bytes(b"")
    args = ["--model", str(tmp_path / "m.onnx"), "--data", str(inputs["npy"])]
    assert main(["quantize", *args, "--out", str(tmp_path / "o"), *FAST]) == 2
    assert "needs onnx2torch: pip install onnx2torch" in capsys.readouterr().err


@pytest.mark.parametrize("dynamic", [False, True])
def test_pt2(inputs, tmp_path: Path, dynamic: bool) -> None:
    from qdq.specs import load_model_spec

    model = load_model_spec(f"{inputs['py']}:build")
    example = torch.randn(4, 3, 8, 8)
    shapes = ({0: torch.export.Dim("batch", min=2)},) if dynamic else None
    ep = torch.export.export(model, (example,), dynamic_shapes=shapes)
    torch.export.save(ep, tmp_path / "m.pt2")
    res = quantize(
        str(tmp_path / "m.pt2"),
        str(inputs["npy"]),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        ptq=PtqOptions(),
    )
    assert res.report["model"]["static_batch"] == (None if dynamic else 4)
    assert res.report["model"]["kind"] == "pt2"
    # the ATen convolutions were seen and quantized like the module's
    assert res.report["lint"]["int8_weighted_layers"] == 2
    assert res.report["int8"]["top1_agreement"] == 1.0


def test_image_folder(inputs, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for k in range(5):
            _png(tmp_path / "imgs" / cls / f"{k}.png", rng.integers(0, 255, (12, 10, 3), np.uint8))
    opts = DataOptions(image_size=(8, 8), mean=(0.5,), std=(0.25,))
    res = quantize(
        f"{inputs['py']}:build",
        str(tmp_path / "imgs"),
        out=tmp_path / "o",
        exporter="torchscript",
        data_options=opts,
        show_progress=False,
        ptq=PtqOptions(),
    )
    data = res.report["data"]
    assert data["labelled"] and data["input_shape"] == [3, 8, 8]
    assert data["calibration_samples"] == 5 and data["evaluation_samples"] == 5
    assert "labels from 2 sub-folders" in data["split"] and res.metric_name == "top1_accuracy"

    flat = tmp_path / "flat"
    flat.mkdir()
    for k in range(4):
        _png(flat / f"{k}.png", rng.integers(0, 255, (8, 8, 3), np.uint8))
    res = quantize(
        f"{inputs['py']}:build",
        str(flat),
        out=tmp_path / "o2",
        exporter="torchscript",
        data_options=opts,
        show_progress=False,
        ptq=PtqOptions(),
    )
    assert res.metric_name == "top1_agreement" and not res.report["data"]["labelled"]


def test_zoo_preprocessing_of_an_image_folder(tmp_path: Path) -> None:
    """Fashion-MNIST test images saved as PNGs in one folder per class, read back with the zoo
    model's preprocessing, are the dataset's own tensors with their own labels."""
    fm = pytest.importorskip("qdq.zoo.fashion_mnist")
    try:
        images, labels = fm.load_split("test")
    except FileNotFoundError:
        pytest.skip("dataset-fashion-mnist is not installed")
    chosen = [int(i) for c in range(10) for i in torch.nonzero(labels == c).flatten()[:3]]
    for i in chosen:
        d = tmp_path / "imgs" / str(int(labels[i]))
        d.mkdir(parents=True, exist_ok=True)
        pixels = ((images[i, 0] * fm.STD + fm.MEAN) * 255).round().clamp(0, 255).byte().numpy()
        _png(d / f"{i}.png", pixels)
    from qdq.pipeline import resolve_data
    from qdq.zoo.registry import get_model

    data = resolve_data(str(tmp_path / "imgs"), get_model("fashion-mnist-resnet"))
    assert data.evaluation.shape[1:] == (1, 28, 28) and data.labels is not None
    assert len(data.calibration) == 15 and len(data.evaluation) == 15
    pool = images[chosen]
    for x, y in zip(data.evaluation, data.labels, strict=True):
        diff = (pool - x).abs().flatten(1).amax(1)
        j = int(diff.argmin())
        assert float(diff[j]) < 1e-4 and int(labels[chosen[j]]) == int(y)


def test_zoo_list(capsys) -> None:
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert "fashion-mnist-resnet" in out and "efficientnet-lite0" in out
    assert "metric: top-1 agreement with FP32 and logit cosine" in out


def test_help_warns_about_user_code(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    assert "EXECUTES" in capsys.readouterr().out
