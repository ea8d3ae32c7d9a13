"""qdq.ptq.kernel_sums: data-free rounding that keeps every convolution kernel's sum."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import qdq
from qdq.config import QuantConfig
from qdq.pipeline.improve import PtqOptions, improver
from qdq.ptq.kernel_sums import kernel_sum_codes, kernel_sum_rounding
from qdq.quant import QuantMode, quantizer_mode, scale_from_amax


def _high_pass() -> nn.Module:
    """A depthwise 3x3 conv of zero-sum (high-pass) kernels after a conv, then a BatchNorm that
    amplifies its channels: nearest rounding leaks a DC response of several steps per kernel."""
    g = torch.Generator().manual_seed(3)
    conv = nn.Conv2d(3, 16, 3)
    dw = nn.Conv2d(16, 16, 3, groups=16, bias=False)
    bn = nn.BatchNorm2d(16)
    with torch.no_grad():
        k = torch.randn(16, 1, 3, 3, generator=g) * 0.02 + 0.0037  # no tap on the grid
        k[:, :, 1, 1] = 0.0
        k[:, 0, 1, 1] = -k.sum(dim=(1, 2, 3))  # each kernel sums to zero
        dw.weight.copy_(k)
        bn.weight.fill_(20.0)
        bn.bias.fill_(1.0)
    return nn.Sequential(conv, nn.ReLU(), dw, bn, nn.ReLU()).eval()


def _data(n: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return [torch.rand(8, 3, 16, 16, generator=g) + 0.5 for _ in range(n)]


def _prepared(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    m = qdq.prepare(model, (data[0][:2],))
    qdq.calibrate(m, data, method="max", show_progress=False)
    return m


def test_codes_are_floor_or_ceil_keep_the_sum_and_move_the_cheapest() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.randn(500, 9, generator=g) * 30
    y[0] = torch.tensor([126.9, 127.0, -127.0, 0.5, -0.5, 1.5, 2.5, 0.49, 0.0])
    codes = kernel_sum_codes(y, -127, 127)
    nearest = torch.round(y)
    assert torch.all((codes == torch.floor(y)) | (codes == torch.ceil(y)))
    assert torch.all((codes - y).sum(dim=1).abs() <= 0.5 + 1e-4)
    assert codes.abs().max() <= 127
    # optimal for its sum: no kept code has a larger residual toward the sum than a moved one
    moved = codes != nearest
    toward = (y - nearest) * torch.sign(codes - nearest).sum(dim=1, keepdim=True).sign()
    for row in range(y.shape[0]):
        if moved[row].any():
            assert toward[row][moved[row]].min() >= toward[row][~moved[row]].max() - 1e-6
    # nothing to fix: nearest rounding already keeps the sum
    exact = torch.tensor([[0.1, -0.1, 3.0, 4.0]])
    assert torch.equal(kernel_sum_codes(exact, -127, 127), torch.round(exact))


def test_saturated_taps_are_left_alone() -> None:
    y = torch.tensor([[140.0, 0.4, 0.4, 0.4]])  # amax clipped the first tap
    codes = kernel_sum_codes(y, -127, 127)
    assert codes[0, 0] == 127 and codes[0, 1:].sum() == 1


def test_a_high_pass_depthwise_layer_gets_its_dc_response_back() -> None:
    model = _high_pass()
    data = _data()
    m = _prepared(model, data)
    flat = torch.full((4, 3, 16, 16), 0.8)  # a locally constant input: the high-pass answers 0

    def error(x: torch.Tensor) -> float:
        with torch.no_grad():
            return float((m(x) - model(x)).pow(2).mean())

    before_flat, before_data = error(flat), error(data[1])
    report = kernel_sum_rounding(m, data)
    after_flat, after_data = error(flat), error(data[1])
    assert after_flat < 0.1 * before_flat
    assert after_data < before_data
    rows = {r.name: r for r in report.rows}
    assert list(rows) == ["0:weight", "2:weight"]  # both convolutions, forward order
    dw = rows["2:weight"]
    assert dw.taps == 9 and dw.kernels == 16 and 0 < dw.changed < 0.5
    assert dw.max_sum_error_nearest > 1.0 and dw.max_sum_error <= 0.5 + 1e-4
    assert dw.weight_sqnr < dw.weight_sqnr_nearest  # a little weight error buys the sum
    assert m[2].weight_quantizer.learned["rounding"]["method"] == "kernel-sum"
    assert "2:weight" in report.format() and report.summary() in report.format()
    assert json.loads(report.to_json())["method"] == "kernel-sum"
    with torch.no_grad(), quantizer_mode(m, QuantMode.BYPASS):  # the float weights are untouched
        assert torch.equal(m(data[0]), model(data[0]))


def test_linear_and_pointwise_layers_keep_nearest_rounding() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Flatten(), nn.Linear(8 * 4 * 4, 4)).eval()
    data = [torch.rand(4, 3, 4, 4) for _ in range(2)]
    m = _prepared(model, data)
    report = kernel_sum_rounding(m, data)
    assert report.rows == () and "no code changed" in report.summary()
    assert not any(q.has_rounding for q in qdq.quantizers_of(m).values())


def test_bad_input() -> None:
    model = _high_pass()
    data = _data(1)
    m = qdq.prepare(model, (data[0][:2],))
    with pytest.raises(ValueError, match="calibrate first"):
        kernel_sum_rounding(m, data)
    qdq.calibrate(m, data, show_progress=False)
    with pytest.raises(ValueError, match="no batches"):
        kernel_sum_rounding(m, [])
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        kernel_sum_rounding(model, data)
    with pytest.raises(ValueError, match="unknown rounding"):
        PtqOptions(rounding="kernelsum")


def test_export_writes_the_codes_and_onnx_runtime_agrees(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    data = _data()
    m = _prepared(_high_pass(), data)
    improve, reports = improver(PtqOptions(rounding="kernel-sum"), data, show_progress=False)
    improve(m)
    assert reports["kernel_sum"]["summary"].startswith("kernel-sum rounding on 2/2")
    out = qdq.export_onnx(  # check_inputs: ORT vs torch fake quant, inside the export
        m, (data[0][:2],), tmp_path / "m.onnx", exporter="torchscript", check_inputs=[data[1]]
    )
    model = onnx.load(str(out.path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    (dw,) = [n for n in model.graph.node if n.op_type == "Conv" and n.name.startswith("2")]
    q_node = producers[producers[dw.input[1]].input[0]]
    w, scale = inits[q_node.input[0]], inits[q_node.input[1]]
    codes = np.clip(np.round(w / scale.reshape(-1, 1, 1, 1)), -128, 127)
    quantizer = m[2].weight_quantizer
    assert np.array_equal(codes, quantizer._buffers["rounding_codes"].numpy().astype(np.float32))
    s = scale_from_amax(quantizer.amax, 8).reshape(-1, 1, 1, 1).numpy()
    assert np.allclose(scale.reshape(-1, 1, 1, 1), s)


def test_an_exactly_representable_kernel_reports_null_sqnr_in_json() -> None:
    conv = nn.Conv2d(2, 2, 3, bias=False)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # amax 127/128: every tap a multiple of the scale 1/128, exactly
        conv.weight.copy_(torch.randint(-127, 128, conv.weight.shape, generator=g).float() / 128)
        conv.weight[:, 0, 0, 0] = 127 / 128
    data = [torch.rand(4, 2, 6, 6) for _ in range(2)]
    full = QuantConfig.tensorrt(disable=("performance",))  # a 2-channel conv is INT8 here too
    m = qdq.prepare(nn.Sequential(conv).eval(), (data[0][:2],), full)
    qdq.calibrate(m, data, method="max", show_progress=False)
    (row,) = kernel_sum_rounding(m, data).rows
    assert row.changed == 0 and row.weight_sqnr == float("inf")
    assert row.to_dict()["weight_sqnr"] is None
    json.loads(json.dumps(row.to_dict(), allow_nan=False))
