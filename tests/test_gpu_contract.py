"""The device contract of issue 32 on a real model: prepare, calibrate, evaluate and export a CUDA
model without moving it by hand. Skipped without CUDA (marked ``gpu``); CI has none.

Measured on CUDA in issue 32: after ``qdq.calibrate`` every amax was on the CPU (the quantizers were
created on the CPU and the weight amax copied there), so the next forward failed with "Expected all
tensors to be on the same device"; ``export_onnx`` of a CUDA model lost its weight Q/DQ in the
dynamo export. Now each quantizer is created on the device of the module it serves, and the
exporters trace a CPU copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import qdq

pytestmark = pytest.mark.gpu


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).eval()  # fmt: skip


@pytest.mark.parametrize("method", ["max", "entropy", "mse", "percentile"])
def test_calibrate_keeps_every_amax_on_cuda_and_the_model_runs(method: str) -> None:
    model = _net().cuda()
    x = torch.randn(8, 3, 16, 16, device="cuda")
    prepared = qdq.prepare(model, (x[:1],))
    qdq.calibrate(prepared, [x[:4], x[4:]], method=method, show_progress=False)
    devices = {q.amax.device.type for q in qdq.quantizers_of(prepared).values()}
    assert devices == {"cuda"}
    with torch.no_grad():
        out = prepared(x)
    assert out.device.type == "cuda" and torch.isfinite(out).all()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_onnx_of_a_cuda_model_is_the_onnx_of_its_cpu_copy(
    exporter: str, tmp_path: Path
) -> None:
    import onnx

    x = torch.randn(8, 3, 16, 16)
    prepared = qdq.prepare(_net().cuda(), (x[:1].cuda(),))
    qdq.calibrate(prepared, [x.cuda()], show_progress=False)
    cpu = qdq.prepare(_net(), (x[:1],))
    qdq.calibrate(cpu, [x], show_progress=False)
    a = qdq.export_onnx(prepared, (x[:1].cuda(),), tmp_path / "cuda.onnx", exporter=exporter)
    b = qdq.export_onnx(cpu, (x[:1],), tmp_path / "cpu.onnx", exporter=exporter)
    assert next(prepared.parameters()).device.type == "cuda"  # the user's model stays there
    ga, gb = onnx.load(a.path).graph, onnx.load(b.path).graph
    assert [n.op_type for n in ga.node] == [n.op_type for n in gb.node]
    assert (a.num_quantize, a.num_dequantize) == (b.num_quantize, b.num_dequantize)
