"""``torch.addmm(bias, x, W)`` on a parameter ``W`` of shape ``(in, out)`` is a GEMM layer
(transformers' ``Conv1D``: every projection of GPT-2): its input and its weight are quantized,
the weight per output column (``W``'s last axis), exported as a ``Gemm`` whose ``B`` reads the
weight's DequantizeLinear. Before, such a layer was not recognized and stayed float unreported
(GPT-2: 0 of 8 GEMMs INT8)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import qdq
from qdq.backends.onnxruntime import run, session
from qdq.lint import lint


class Conv1D(nn.Module):
    """transformers' ``Conv1D`` as GPT-2 defines it: a Linear with its weight transposed."""

    def __init__(self, nf: int, nx: int, method: bool = False) -> None:
        super().__init__()
        self.nf, self.method = nf, method
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = (*x.size()[:-1], self.nf)
        flat = x.view(-1, x.size(-1))
        y = (
            self.bias.addmm(flat, self.weight)
            if self.method
            else torch.addmm(self.bias, flat, self.weight)
        )
        return y.view(size_out)


class Mlp(nn.Module):
    def __init__(self, width: int = 32, method: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = Conv1D(4 * width, width, method)
        self.proj = Conv1D(width, 4 * width, method)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(x)))


@pytest.mark.parametrize("method", [False, True], ids=["torch.addmm", "Tensor.addmm"])
def test_addmm_on_a_parameter_is_a_quantized_gemm(method: bool) -> None:
    plan = qdq.plan_of(qdq.prepare(Mlp(method=method).eval(), (torch.randn(2, 5, 32),)))
    for layer, out in (("fc", 128), ("proj", 32)):
        weight = plan.point(f"{layer}.addmm:weight")
        assert (weight.decision, weight.rule) == ("quantize", "P01")
        assert weight.spec is not None and weight.spec.axis == 1  # W is (in, out): per column
        assert weight.producer == f"{layer}.weight".replace(".", "_")
        assert plan.point(f"{layer}.addmm:input").decision == "quantize"
        q = qdq.quantizers_of(qdq.prepare(Mlp(method=method).eval(), (torch.randn(1, 5, 32),)))
        assert q[f"{layer}.weight_quantizer"].amax.numel() == out


def test_a_small_addmm_stays_float_with_p14() -> None:
    plan = qdq.plan_of(qdq.prepare(Conv1D(8, 32).eval(), (torch.randn(2, 32),)))
    assert {(p.decision, p.rule) for p in plan.points} == {("skip", "P14")}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_addmm_exports_int8_gemms_that_onnxruntime_runs_as_torch(
    exporter: str, tmp_path: Path
) -> None:
    torch.manual_seed(1)
    x = torch.randn(8, 5, 32)
    prepared = qdq.prepare(Mlp().eval(), (x[:1],))
    qdq.calibrate(prepared, [x], show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = qdq.export_onnx(prepared, (x[:1],), tmp_path / "m.onnx", exporter=exporter)
    report = lint(out.path)
    gemms = [ly for ly in report.layers if ly.kind == "weighted"]
    assert len(gemms) == 2 and {ly.input_precision for ly in gemms} == {"int8"}
    assert report.verdict == "PASS"
    ours = run(session(out.path), [x[:3]])[0]
    with torch.no_grad():
        ref = prepared(x[:3]).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
