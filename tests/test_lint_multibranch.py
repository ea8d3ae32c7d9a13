"""The linter on re-parameterizable multi-branch blocks (RepVGG in train form): several parallel
conv branches of one input summed, ``Add(Add(conv1x1_bn(x), conv3x3_bn(x)), bn(x))``. The predictor
used to crash (``KeyError`` in ``_fuses_add``) on the second Add of such a block once the first had
been fused into a conv."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

import qdq
from lint_graphs import G
from qdq.lint import lint


class _ConvBN(nn.Sequential):
    def __init__(self, c: int, k: int) -> None:
        super().__init__(nn.Conv2d(c, c, k, padding=k // 2, bias=False), nn.BatchNorm2d(c))


class _RepBlock(nn.Module):
    """timm's ``RepVggBlock`` forward in train form: 1x1 + 3x3 branches, then the BN identity."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.identity = nn.BatchNorm2d(c)
        self.conv_kxk = _ConvBN(c, 3)
        self.conv_1x1 = _ConvBN(c, 1)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.identity(x)
        y = self.conv_1x1(x) + self.conv_kxk(x)
        return self.act(y + identity)


class _RepNet(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(_RepBlock(c), _RepBlock(c))
        self.head = nn.Conv2d(c, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _assert_each_node_in_one_layer(report) -> None:
    counts = Counter(n for ly in report.layers for n in ly.nodes)
    assert all(c == 1 for c in counts.values()), counts.most_common(3)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_repvgg_train_form_block_lints(exporter: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    prepared = qdq.prepare(_RepNet().eval(), (x,))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = qdq.export_onnx(prepared, (x[:1],), tmp_path / "rep.onnx", exporter=exporter).path
    report = lint(path)
    assert "L00" not in report.rules(), report.format()
    assert report.summary["int8_weighted_layers"] == report.summary["weighted_layers"] == 6
    _assert_each_node_in_one_layer(report)
    assert report.rules("WARN") == set(), report.format()
    adds = [ly for ly in report.layers if any("Add" in n for n in ly.nodes)]
    # per block: the branch sum fuses into one conv; the identity BatchNorm reads the block input's
    # INT8 version (P04) and runs with the identity sum and the ReLU as one INT8 PointWise
    assert sorted(ly.kind for ly in adds) == ["pointwise", "pointwise", "weighted", "weighted"]
    assert all(sum("Add" in n for n in ly.nodes) == 1 for ly in adds)
    for ly in adds:
        assert ly.input_precision == ly.output_precision == "int8", report.format(True)
        if ly.kind == "pointwise":
            assert "BatchNormalization" in ly.nodes[0] and "Relu" in ly.nodes[-1], ly


def _three_branch(quantize_identity: bool) -> onnx.ModelProto:
    """Add(Add(conv_bn(x), conv_bn(x)), bn(x)) built by hand, both branch sums read in float."""
    g = G()
    x = g.qdq("x")
    a = g.bn(g.conv(x, k=1))
    b = g.bn(g.conv(x))
    ident = g.bn("x")
    s = g.op("Add", [a, b])
    y = g.op("Relu", [g.op("Add", [s, g.qdq(ident) if quantize_identity else ident])])
    return g.model([g.conv(g.qdq(y))])


@pytest.mark.parametrize("quantize_identity", [False, True])
def test_three_branch_sum_fuses_one_add_per_conv(quantize_identity: bool) -> None:
    report = lint(_three_branch(quantize_identity))
    assert "L00" not in report.rules(), report.format()
    _assert_each_node_in_one_layer(report)
    weighted = [ly for ly in report.layers if ly.kind == "weighted"]
    # the first sum fuses into the conv computed last; a second residual Add never joins it
    assert [sum(n.startswith("add") for n in ly.nodes) for ly in weighted] == [0, 1, 0]
    second = next(
        ly for ly in report.layers if ly.kind == "pointwise" and ly.nodes[0].startswith("add")
    )
    assert [n.split("_")[0].rstrip("0123456789") for n in second.nodes] == ["add", "relu"]


class _LayerScale(nn.Module):
    """A ConvNeXt block: depthwise conv, channels-last LayerNorm + Linear MLP, LayerScale, Add."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))
        self.head = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.norm(self.conv_dw(x).permute(0, 2, 3, 1))
        y = self.fc2(torch.nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return self.head(y.mul(self.gamma.reshape(1, -1, 1, 1)) + x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_layerscale_add_fuses_into_the_linear_through_transpose_and_scale(
    exporter: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    prepared = qdq.prepare(_LayerScale().eval(), (x,))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = qdq.export_onnx(prepared, (x,), tmp_path / "ls.onnx", exporter=exporter).path
    report = lint(path)
    assert report.rules("WARN") == set() and report.rules("ERROR") == set(), report.format()
    _assert_each_node_in_one_layer(report)
    (fused,) = [ly for ly in report.layers if ly.kind == "weighted" and "fc2" in ly.nodes[0]]
    # fc2's MatMul, its bias, the Transpose back to NCHW, LayerScale's Mul and the residual Add
    assert len(fused.nodes) == 5 and any("Transpose" in n for n in fused.nodes), fused
    assert fused.output_precision == "int8", report.format(True)


def _split_block(float_slice: bool) -> onnx.ModelProto:
    """SKNet's split-input selective kernel: ``x`` is quantized for the shortcut conv and split
    into two paths, each read by a conv through Q/DQ of the same scale (one quantizer planned
    for all three uses); with ``float_slice`` the second path reads its slice in float."""
    import numpy as np
    from onnx import helper

    g = G(64)
    x = g.op("Relu", [g.conv(g.qdq("x"), 64, 64)])
    shortcut = g.conv(g.qdq(x, 0.02), 64, 32)
    sizes = g.const(np.array([32, 32], dtype=np.int64), "split")
    g.nodes.append(helper.make_node("Split", [x, sizes], ["xa", "xb"], name="split", axis=1))
    a = g.conv(g.qdq("xa", 0.02), 32, 32)
    b = g.op("Relu", ["xb"]) if float_slice else g.conv(g.qdq("xb", 0.02), 32, 32)
    out = g.op("Add", [g.op("Add", [a, b]), shortcut])
    return g.model([out])


def test_p04_counts_a_split_read_only_through_q_as_a_quantized_reader() -> None:
    """TensorRT swaps a Slice with the Quantize after it (the rule specification's
    VanillaSwapWithFollowingQ): a Split whose every output is read through Q is a quantized
    use of its input, like a MaxPool or a Reshape. A slice read in float is a float use (P04)."""
    assert "P04" not in lint(_split_block(False), target="trt10").rules("WARN")
    assert "P04" in lint(_split_block(True), target="trt10").rules("WARN")
