"""Golden text summaries of exported graphs (op sequence + where Q/DQ sit) for ResNet-18 and a
YOLO-style model. Regenerate after an intended change with ``QDQ_UPDATE_GOLDEN=1``."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
import torch

import qdq
from qdq.export import graph_summary

GOLDEN = Path(__file__).parent / "golden"


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "resnet18":
        tv = pytest.importorskip("torchvision.models")
        return tv.resnet18().eval()
    from models.yolo import YoloStyleNet

    return YoloStyleNet().eval()


@pytest.mark.parametrize(("name", "size"), [("resnet18", 64), ("yolo_style", 64)])
def test_golden_graph_summary(name: str, size: int, tmp_path: Path) -> None:
    x = torch.randn(2, 3, size, size)
    prepared = qdq.prepare(_model(name), (x,))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter="dynamo", opset=17)
    text = graph_summary(onnx.load(str(out.path)))
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("QDQ_UPDATE_GOLDEN") == "1" or not golden.exists():
        golden.write_text(text)
    assert text == golden.read_text(), f"graph summary of {name} changed; see {golden}"
