"""Rule P17 end to end: PP-OCR's RSE ``x + x * se(x)`` and an FPN top-down Add, planned, exported
with both exporters and linted — the gating Mul and the Add are one INT8 PointWise layer, and no
residual (P03), fan-out (P04) or epilogue (P02) finding remains. The same block left float keeps
its P04 finding but gets no P03: no conv can absorb an Add whose operands have other readers."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import qdq
from lint_graphs import G
from models.rse import RSE, RSEFPN
from qdq.lint import lint

PLACEMENT = {"P02", "P03a", "P03b", "P03c", "P04", "P05"}


def _export(model: nn.Module, tmp: Path, exporter: str) -> Path:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 16, 16)
    prepared = qdq.prepare(model.eval(), (x,))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qdq.export_onnx(prepared, (x,), tmp / "m.onnx", exporter=exporter).path


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_rse_fpn_exports_with_int8_pointwise_mul_add_and_no_placement_warning(
    exporter: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    report = lint(_export(RSEFPN(), tmp_path, exporter))
    assert not {f.rule for f in report.findings} & PLACEMENT, report.format()
    pointwise = [lay for lay in report.layers if lay.kind == "pointwise"]
    gated = [lay for lay in pointwise if any("Mul" in n for n in lay.nodes)]
    assert len(gated) == 4  # one PointWise layer per RSE: Mul + Add, INT8 in and out
    assert all(any("Add" in n for n in lay.nodes) for lay in gated)
    assert all(lay.input_precision == lay.output_precision == "int8" for lay in gated)
    top_down = [lay for lay in pointwise if lay not in gated and any("Add" in n for n in lay.nodes)]
    assert [(lay.input_precision, lay.output_precision) for lay in top_down] == [("int8", "int8")]


def test_the_float_rse_add_is_no_residual_fusion() -> None:
    """``x`` quantized for the SE pool only, the Mul and the Add read it in float (the placement
    before P17): P04 names the mixed readers; P03a does not fire (no conv can absorb the Add:
    ``x`` has three readers)."""
    g = G(32)
    x = g.conv(g.qdq("x"), 32, 32)
    xq = g.q(x, 0.02)
    h = g.op("Relu", [g.conv(g.qdq(g.op("GlobalAveragePool", [g.dq_of(xq)])), 32, 16, 1)])
    gate = g.op("HardSigmoid", [g.conv(g.qdq(h), 16, 32, 1)])
    y = g.op("Add", [x, g.op("Mul", [x, gate])])
    out = g.conv(g.qdq(y), 32, 32)
    report = lint(g.model([out], (1, 32, 8, 8)), target="trt10")
    rules = report.rules("WARN")
    assert "P04" in rules and not rules & {"P03a", "P03b", "P03c"}


def test_rse_block_alone_is_numerically_unchanged_by_the_placement(tmp_path: Path) -> None:
    """The prepared RSE with quantizers bypassed computes the float block (P17 only places)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), RSE(), nn.Conv2d(32, 8, 1)).eval()
    x = torch.randn(2, 16, 8, 8)
    prepared = qdq.prepare(model, (x,))
    assert [pt.rule for pt in qdq.plan_of(prepared).points if pt.owner == "1.add"] == ["P17"] * 2
    with qdq.quantizer_mode(prepared, "bypass"), torch.no_grad():
        np.testing.assert_allclose(prepared(x).numpy(), model(x).numpy(), atol=1e-5)


class ReXNetSE(nn.Module):
    """ReXNet's block tail: ``conv_pwl(relu6(x * sigmoid(se(x))))`` with ``x = bn(dwconv(.))``:
    the SE pool and the Mul read ``x``, a ReLU6 sits between the Mul and the next conv."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.BatchNorm2d(c))
        self.fc1 = nn.Conv2d(c, 8, 1)
        self.fc2 = nn.Conv2d(8, c, 1)
        self.pwl = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw(x)
        gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        return self.pwl(nn.functional.relu6(x * gate))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_gating_mul_followed_by_relu6_is_one_int8_pointwise_layer(
    exporter: str, tmp_path: Path
) -> None:
    """P04 reaches the Mul's quantized reader through the ReLU6 (TensorRT fuses Mul + Clip into
    one PointWise layer): ``x`` is read INT8 by the SE pool and the Mul, no P04 finding."""
    model = nn.Sequential(nn.Conv2d(16, 16, 1), ReXNetSE()).eval()
    report = lint(_export(model, tmp_path, exporter))
    assert not {f.rule for f in report.findings} & PLACEMENT, report.format()
    gated = [lay for lay in report.layers if any(n.endswith("/Mul") for n in lay.nodes)]
    assert len(gated) == 1, [lay.nodes for lay in report.layers]
    assert gated[0].input_precision == gated[0].output_precision == "int8"
    assert any("Clip" in n or "Relu" in n for n in gated[0].nodes), gated[0].nodes


class SEBasicBlock(nn.Module):
    """TResNet's / SE-ResNet's basic block: ``drop_path(se(conv(x))) + x``, the SE gate's Mul the
    Add's operand (through the stochastic-depth identity), its ``x`` read by the SE pool too."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.fc1 = nn.Conv2d(c, 16, 1)
        self.fc2 = nn.Conv2d(16, c, 1)
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return torch.relu(self.drop_path(y * gate) + x)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_se_gate_feeding_a_residual_add_joins_its_int8_pointwise_layer(
    exporter: str, tmp_path: Path
) -> None:
    """P17 takes the SE Mul into the Add's PointWise layer: its operands are the layer's inputs
    (``y`` INT8 once, for the pool and the Mul), no Q/DQ between the Mul and the Add, no P04."""
    model = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), SEBasicBlock(), nn.Conv2d(32, 8, 1))
    torch.manual_seed(0)
    x = torch.randn(1, 16, 16, 16)
    plan = qdq.plan_of(qdq.prepare(model.eval(), (x,)))
    mul = [pt for pt in plan.points if pt.owner == "2.mul"]
    assert [(pt.quantized, pt.rule) for pt in mul] == [(True, "P17")] * 2
    assert not [pt for pt in plan.points if pt.owner == "2.drop_path" and pt.quantized]
    report = lint(_export(model, tmp_path, exporter))
    assert not {f.rule for f in report.findings} & PLACEMENT, report.format()
    gated = [lay for lay in report.layers if any(n.endswith("/Mul") for n in lay.nodes)]
    assert len(gated) == 1 and any("Add" in n for n in gated[0].nodes), gated
    assert gated[0].input_precision == gated[0].output_precision == "int8"
