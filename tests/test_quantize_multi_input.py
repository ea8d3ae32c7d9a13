"""``qdq quantize`` on models whose forward takes several inputs or keyword inputs: ``.npz``
arrays named after forward's parameters, and :class:`QuantData` of dicts and tuples."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.cli.main import main
from qdq.pipeline import (
    PtqOptions,
    QuantData,
    quantize,
)
from qdq.pipeline.inputs import batches, bind_inputs, describe, num_samples, take

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

MODELS_PY = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 4)

        def forward(self, image, mask):
            y = F.relu(self.conv(image)) * mask
            return self.fc(y.mean((2, 3)))


    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(20, 16)
            self.types = nn.Embedding(2, 16)
            self.fc = nn.Linear(16, 3)

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
            h = self.words(input_ids)
            if token_type_ids is not None:
                h = h + self.types(token_type_ids)
            if attention_mask is not None:
                h = h * attention_mask.unsqueeze(-1).to(h.dtype)
            return self.fc(F.relu(h).mean(1))


    class KeywordOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, *, scale):
            return self.fc(x) * scale


    def masked():
        torch.manual_seed(0)
        return Masked()


    def tokens():
        torch.manual_seed(0)
        return Tokens()


    def keyword_only():
        return KeywordOnly()
    """
)
FILES = ["manifest.json", "model.qdq.onnx", "report.html", "report.json"]
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multi")
    (root / "models.py").write_text(MODELS_PY)
    rng = np.random.default_rng(0)
    np.savez(
        root / "masked.npz",
        mask=(rng.random((16, 1, 6, 6)) > 0.3).astype(np.float32),  # not in forward's order
        image=rng.standard_normal((16, 3, 6, 6)).astype(np.float32),
        y=np.arange(16) % 4,
    )
    np.savez(
        root / "tokens.npz",
        input_ids=rng.integers(0, 20, (16, 5)),
        token_type_ids=rng.integers(0, 2, (16, 5)),  # attention_mask left out: its default
        labels=np.arange(16) % 3,  # labels, although forward has a parameter of that name
    )
    np.savez(
        root / "unknown.npz",
        image=np.zeros((4, 3, 6, 6), np.float32),
        mask=np.ones((4, 1, 6, 6), np.float32),
        depth=np.zeros((4, 1, 6, 6), np.float32),
    )
    return {"root": root, "py": root / "models.py"}


def _onnx_inputs(path: Path) -> list[tuple[str, int, list[int | str]]]:
    graph = onnx.load(str(path)).graph
    return [
        (
            i.name,
            i.type.tensor_type.elem_type,
            [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim],
        )
        for i in graph.input
    ]


def test_cli_two_named_inputs_in_a_subprocess(files, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "qdq", "quantize", "--model", f"{files['py']}:masked"]
    cmd += ["--data", str(files["root"] / "masked.npz"), "--out", str(out), *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == FILES
    report = json.loads((out / "report.json").read_text())
    data = report["data"]
    assert data["inputs"] == [
        {"name": "image", "shape": [3, 6, 6], "dtype": "float32"},
        {"name": "mask", "shape": [1, 6, 6], "dtype": "float32"},
    ]
    assert data["calibration_samples"] == 8 and data["evaluation_samples"] == 8
    assert report["metric_name"] == "top1_accuracy" and data["labelled"]
    assert report["int8"]["cosine_mean"] > 0.99
    assert report["int8_torch"]["vs_onnxruntime"]["cosine_min"] > 0.999  # both inputs fed
    # both inputs, in forward's order, with a dynamic batch
    float_type = onnx.TensorProto.FLOAT
    assert _onnx_inputs(out / "model.qdq.onnx") == [
        ("input", float_type, ["batch", 3, 6, 6]),
        ("input1", float_type, ["batch", 1, 6, 6]),
    ]
    assert "image" in (out / "report.html").read_text()


def test_cli_keyword_inputs_keep_integer_dtype(files, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    data = str(files["root"] / "tokens.npz")
    args = ["quantize", "--model", f"{files['py']}:tokens", "--data", data, "--out", str(out)]
    assert main([*args, *FAST]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == FILES
    report = json.loads((out / "report.json").read_text())
    assert [(i["name"], i["dtype"]) for i in report["data"]["inputs"]] == [
        ("input_ids", "int64"),
        ("token_type_ids", "int64"),
    ]
    assert report["metric_name"] == "top1_accuracy"  # labels were labels, not an input
    assert report["int8_torch"]["vs_onnxruntime"]["cosine_min"] > 0.999
    int64 = onnx.TensorProto.INT64
    assert _onnx_inputs(out / "model.qdq.onnx") == [
        ("input", int64, ["batch", 5]),
        ("input1", int64, ["batch", 5]),
    ]


def test_cli_unknown_array_is_named(files, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    data = str(files["root"] / "unknown.npz")
    args = ["quantize", "--model", f"{files['py']}:masked", "--data", data, "--out", str(out)]
    assert main([*args, *FAST]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qdq quantize: error: ") and err.count("\n") == 1
    assert "['depth'] match no parameter of Masked.forward(image, mask)" in err
    assert not out.exists()


def _split(inputs: dict[str, torch.Tensor] | tuple[torch.Tensor, ...]) -> QuantData:
    return QuantData(take(inputs, slice(0, 8)), take(inputs, slice(8, 16)), None, "memory", "8 + 8")


def _masked_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "image": torch.randn(16, 3, 6, 6, generator=g),
        "mask": (torch.rand(16, 1, 6, 6, generator=g) > 0.3).float(),
    }


def test_python_dict_and_tuple_quant_data(files, tmp_path: Path) -> None:
    from qdq.specs import load_model_spec

    model = load_model_spec(f"{files['py']}:masked")
    named = _masked_inputs()
    res = quantize(
        model,
        _split(named),
        out=tmp_path / "dict",
        exporter="torchscript",
        show_progress=False,
        ptq=PtqOptions(),
    )
    assert res.metric_name == "top1_agreement" and res.fp32_metric == 1.0
    assert len(_onnx_inputs(res.onnx_path)) == 2
    positional = (named["image"], named["mask"])
    again = quantize(
        model, _split(positional), out=tmp_path / "tuple", exporter="torchscript",
        show_progress=False, ptq=PtqOptions()
    )  # fmt: skip
    assert [i["name"] for i in again.report["data"]["inputs"]] == ["input", "input1"]
    assert again.int8_metric == res.int8_metric  # the same calls, by position or by name


def test_improvements_take_the_named_batches(files, tmp_path: Path) -> None:
    """Equalization, the fallback search and QAT get the example and the calibration batches."""
    from qdq.pipeline import PtqOptions, QatOptions
    from qdq.specs import load_model_spec

    res = quantize(
        load_model_spec(f"{files['py']}:masked"),
        _split(_masked_inputs()),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        batch_size=4,
        max_drop=0.5,
        ptq=PtqOptions(equalize=True),
        qat=QatOptions(epochs=1),
    )
    assert {"equalize", "fallback", "qat"} <= set(res.report["timings_s"])
    assert res.report["qat"]["steps"] == 2  # 8 calibration samples in batches of 4


def test_debug_and_sensitivity_on_named_arrays(files, capsys) -> None:
    data = str(files["root"] / "masked.npz")
    common = ["--model", f"{files['py']}:masked", "--data", data, "--no-progress", "--json"]
    assert main(["debug", *common, "--samples", "8", "--batch-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]
    assert main(["sensitivity", *common, "--metric", "task", "--samples", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["scored_by"] == "metric"


def test_static_batch_pt2_with_two_inputs_is_padded(files, tmp_path: Path) -> None:
    from qdq.specs import load_model_spec

    model = load_model_spec(f"{files['py']}:masked")
    named = _masked_inputs()
    ep = torch.export.export(model, (named["image"][:3], named["mask"][:3]))
    torch.export.save(ep, tmp_path / "m.pt2")
    res = quantize(
        str(tmp_path / "m.pt2"),
        str(files["root"] / "masked.npz"),
        out=tmp_path / "o",
        exporter="torchscript",
        show_progress=False,
        ptq=PtqOptions(),
    )
    assert res.report["model"]["static_batch"] == 3
    assert res.report["data"]["evaluation_samples"] == 8  # 3 + 3 + 2 padded to 3
    assert [d[2][0] for d in _onnx_inputs(res.onnx_path)] == [3, 3]


def test_inputs_that_do_not_fit_forward(files) -> None:
    from qdq.specs import load_model_spec

    masked = load_model_spec(f"{files['py']}:masked")
    with pytest.raises(ValueError, match=r"needs input\(s\) \['mask'\]"):
        bind_inputs(masked, {"image": torch.zeros(2, 3, 6, 6)})
    with pytest.raises(ValueError, match=r"\['scale'\] are keyword-only parameters"):
        bind_inputs(
            load_model_spec(f"{files['py']}:keyword_only"),
            {"x": torch.zeros(2, 4), "scale": torch.ones(2, 1)},
        )
    with pytest.raises(ValueError, match="different numbers of samples"):
        QuantData(
            {"image": torch.zeros(4, 3), "mask": torch.zeros(3, 1)},
            {"image": torch.zeros(2, 3), "mask": torch.zeros(2, 1)},
            None,
            "memory",
            "",
        )
    with pytest.raises(ValueError, match="differ; give both in the same form"):
        QuantData({"image": torch.zeros(4, 3)}, torch.zeros(2, 3), None, "memory", "")


def test_batches_pad_every_input() -> None:
    named = {"ids": torch.arange(5).reshape(5, 1), "mask": torch.ones(5, 2, dtype=torch.bool)}
    chunks = list(batches(named, 2, static=True))
    assert [real for _, real in chunks] == [2, 2, 1]
    last = chunks[-1][0]
    assert isinstance(last, dict) and last["ids"].flatten().tolist() == [4, 4]
    assert last["mask"].dtype == torch.bool and num_samples(last) == 2
    assert describe(named) == [
        {"name": "ids", "shape": [1], "dtype": "int64"},
        {"name": "mask", "shape": [2], "dtype": "bool"},
    ]
