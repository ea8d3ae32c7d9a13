"""``qdq qat`` and ``qdq quantize --qat-epochs`` end to end on a tiny model and small data."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qdq.cli.main import main

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
            self.bn1 = nn.BatchNorm2d(32)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.fc = nn.Linear(32, 16)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.conv2(y)) + y
            return self.fc(y.mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net().eval()
    """
)
FAST = ("--exporter", "torchscript", "--recipe", "none", "--no-progress", "--batch-size", "8")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qat")
    (root / "tiny_model.py").write_text(MODEL_PY)
    x = torch.randn(48, 3, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    np.savez(root / "labelled.npz", x=x, y=np.arange(48) % 16)
    return {"py": root / "tiny_model.py", "npz": root / "labelled.npz"}


def test_qdq_qat_fine_tunes_before_export(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["qat", "--model", f"{files['py']}:build", "--data", str(files["npz"]),
            "--out", str(out), "--qat-bn", "fold", "--qat-learn-amax", "lsq", "--qat-lr", "1e-3",
            *FAST]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "QAT fine-tuning" in text and "PTQ" in text and "→ QAT" in text
    report = json.loads((out / "report.json").read_text())
    qat = report["qat"]
    assert qat["epochs"] == 2 and qat["steps"] > 0 and qat["steps"] % 2 == 0
    assert len(qat["losses"]) == qat["steps"]
    assert qat["state"]["bn"] == "fold" and qat["state"]["folded"] == [["conv1", "bn1"]]
    assert isinstance(qat["ptq_metric_torch"], float)
    assert report["settings"]["qat_epochs"] == 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["qat"]["learn_amax"] == "lsq" and manifest["qat"]["steps"] == qat["steps"]
    assert report["timings_s"]["qat"] > 0
    html = (out / "report.html").read_text()
    assert '<h3 id="qat">QAT fine-tuning</h3>' in html and qat["summary"] in html


def test_quantize_without_qat_has_no_qat_entry(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["quantize", "--model", f"{files['py']}:build", "--data", str(files["npz"]),
            "--out", str(out), *FAST]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "report.json").read_text())["qat"] is None
    assert "qat" not in json.loads((out / "manifest.json").read_text())
    html = (out / "report.html").read_text()
    assert 'id="qat"' not in html and 'id="ptq"' not in html


def test_bad_qat_options_are_one_line_errors(
    files: dict[str, Path], tmp_path: Path, capsys
) -> None:
    base = ["--model", f"{files['py']}:build", "--data", str(files["npz"]), *FAST]
    assert main(["qat", *base, "--out", str(tmp_path / "a"), "--qat-epochs", "0"]) == 2
    assert "--qat-epochs must be >= 1" in capsys.readouterr().err
    assert main(["quantize", *base, "--out", str(tmp_path / "b"), "--qat-epochs", "-1"]) == 2
    err = capsys.readouterr().err
    assert "qat epochs must be an int >= 0" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
