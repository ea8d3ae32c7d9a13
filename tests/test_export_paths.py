"""The exported path is the calibrated path (``qdq.export.paths``): a model that takes another
path while an exporter traces it is exported on its eager path, or refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qdq
from qdq.backends.onnxruntime import parity
from qdq.export.errors import ExportError

pytest.importorskip("onnxruntime")


class Pyramid(nn.Module):
    """segmentation-models-pytorch's PSP block: an adaptive pool module in eager mode, an 'area'
    interpolation of the same tensor when ``torch.onnx.is_in_onnx_export()`` (or, with
    ``flag="exporting"``, when ``torch.compiler.is_exporting()``)."""

    def __init__(self, flag: str = "onnx") -> None:
        super().__init__()
        self.flag = flag
        self.stem = nn.Conv2d(3, 32, 3, 1, 1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.conv = nn.Conv2d(32, 32, 1)
        self.out = nn.Conv2d(64, 32, 1)

    def _exporting(self) -> bool:
        if self.flag == "onnx":
            return torch.onnx.is_in_onnx_export()
        return torch.compiler.is_exporting()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        p = F.interpolate(x, size=(2, 2), mode="area") if self._exporting() else self.pool(x)
        p = F.interpolate(self.conv(p), size=x.shape[2:], mode="nearest")
        return self.out(torch.cat([p, x], 1))


def _prepared(model: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(model.eval(), (x[:1],))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    return prepared, x


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_model_branching_on_onnx_export_is_exported_on_its_eager_path(
    exporter: str, tmp_path: Path
) -> None:
    prepared, x = _prepared(Pyramid())
    with pytest.warns(UserWarning, match="is_in_onnx_export"):
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter=exporter)
    graph = onnx.load(str(out.path)).graph
    producer = {o: n for n in graph.node for o in n.output}
    pools = [n for n in graph.node if n.op_type in ("AveragePool", "GlobalAveragePool")]
    # the pool reads the quantized tensor, as the fake-quant model's pool does
    assert pools and all(producer[p.input[0]].op_type == "DequantizeLinear" for p in pools)
    report = parity(prepared, out.path, [x[:1]], per_layer=True)
    assert report.first_unexplained is None and report.min_cosine > 0.9999


def test_a_path_qdq_cannot_restore_is_refused_naming_the_sites(tmp_path: Path) -> None:
    prepared, x = _prepared(Pyramid(flag="exporting"))
    target = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ExportError, match="another path") as err:
            qdq.export_onnx(prepared, (x[:1],), target, exporter="dynamo")
    assert "pool" in str(err.value)  # the planned site the export never reached
    assert not target.exists()
