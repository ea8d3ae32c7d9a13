"""FP8 (E4M3FN) fake quantization equals ONNX Runtime's QuantizeLinear/DequantizeLinear bit for bit
(issue 49): every finite E4M3 value, every rounding midpoint and its float32 neighbours, the
saturation and special values, scales that are not powers of two, float16/bfloat16 inputs; the
STE and LSQ gradients on the FP8 grid; the spec's validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qdq.config import QuantSpec
from qdq.quant import Quantizer
from qdq.quant.primitives import FP8_MAX, fake_quant, quant_range, scale_from_amax

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _ort_qdq(x: np.ndarray, scale: float) -> np.ndarray:
    """``DequantizeLinear(QuantizeLinear(x))`` with a float8e4m3fn zero point, opset 19."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fp8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [
            numpy_helper.from_array(np.array(scale, dtype=np.float32), "s"),
            helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


def _probe() -> torch.Tensor:
    """Every finite E4M3 value, every midpoint between neighbours and the float32 values just
    either side of it, values past the range, infinities, NaN and signed zeros (in code units)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    values = torch.unique(codes[torch.isfinite(codes)])
    mids = ((values[:-1].double() + values[1:].double()) / 2).float()
    up, down = torch.tensor(float("inf")), torch.tensor(-float("inf"))
    special = torch.tensor([448.0, 449.0, 464.0, 465.0, 500.0, 1e9, float("inf"), float("nan"),
                            -0.0, 0.0, 2.0**-10, 2.0**-11, 1e-30])  # fmt: skip
    return torch.cat(
        [values, mids, torch.nextafter(mids, up), torch.nextafter(mids, down), special, -special]
    )


@pytest.mark.parametrize("scale", [1.0, 0.3, 1.7e-3, 3.1, 2.0**-20])
def test_fp8_fake_quant_equals_onnx_runtime_bit_for_bit(scale: float) -> None:
    x = (_probe().double() * scale).float()
    amax = torch.tensor(np.float32(scale) * np.float32(FP8_MAX))
    ours = fake_quant(x, amax, fmt="fp8")
    assert float(scale_from_amax(amax, fmt="fp8")) == np.float32(amax) / np.float32(448.0)
    theirs = torch.from_numpy(_ort_qdq(x.numpy(), float(scale_from_amax(amax, fmt="fp8"))))
    same = ours.view(torch.int32) == theirs.view(torch.int32)  # signed zero included
    both_nan = torch.isnan(ours) & torch.isnan(theirs)
    assert bool((same | both_nan).all()), x[~(same | both_nan)][:8]
    assert torch.isnan(ours).sum() == 2  # NaN stays NaN; infinities saturate
    assert float(ours.nan_to_num().abs().max()) == pytest.approx(
        448.0 * float(scale_from_amax(amax, fmt="fp8"))
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_half_inputs_are_computed_in_float32(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(4096) * 3).to(dtype)
    amax = torch.tensor(5.7)
    ours = fake_quant(x, amax, fmt="fp8")
    assert ours.dtype == dtype
    expected = fake_quant(x.float(), amax, fmt="fp8").to(dtype)
    assert torch.equal(ours, expected)
    theirs = _ort_qdq(x.float().numpy(), float(scale_from_amax(amax, fmt="fp8")))
    assert torch.equal(ours, torch.from_numpy(theirs).to(dtype))


def test_fp8_per_channel_and_the_grid() -> None:
    torch.manual_seed(1)
    w = torch.randn(8, 4, 3, 3)
    amax = w.abs().amax(dim=(1, 2, 3))
    out = fake_quant(w, amax, axis=0, fmt="fp8")
    for c in range(8):
        assert torch.equal(out[c], fake_quant(w[c], amax[c], fmt="fp8"))
    codes = out / scale_from_amax(amax, fmt="fp8").reshape(-1, 1, 1, 1)
    grid = codes.to(torch.float8_e4m3fn).float()  # on the E4M3 grid, up to q*s/s rounding
    assert torch.allclose(codes, grid, rtol=1e-6, atol=0) and grid.abs().max() == 448
    assert quant_range(fmt="fp8") == (-448, 448)


def test_fp8_ste_passes_inside_the_range_and_lsq_uses_qmax_448() -> None:
    x = torch.tensor([-3.0, -1.0, 0.37, 1.0, 2.5], requires_grad=True)
    amax = torch.tensor(2.0, requires_grad=True)
    out = fake_quant(x, amax, fmt="fp8")
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    scale = 2.0 / 448.0
    codes = (x.detach() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    inside = x.detach().abs() <= 2.0
    expected = torch.where(inside, codes - x.detach() / scale, codes).sum() / 448.0
    assert amax.grad is not None and float(amax.grad) == pytest.approx(float(expected), rel=1e-5)


def test_fp8_quantizer_forward_export_and_repr() -> None:
    q = Quantizer(QuantSpec(format="fp8"), name="x")
    q.set_amax(torch.tensor(4.0))
    x = torch.linspace(-6, 6, 101)
    assert torch.equal(q(x), fake_quant(x, torch.tensor(4.0), fmt="fp8"))
    assert "fp8" in repr(q) and "bits=" not in repr(q)
    with torch.no_grad(), torch.inference_mode():
        assert torch.equal(q(x), fake_quant(x, torch.tensor(4.0), fmt="fp8"))


def test_fp8_spec_is_validated() -> None:
    with pytest.raises(ValueError, match="E4M3FN"):
        QuantSpec(format="fp8", num_bits=4)
    with pytest.raises(ValueError, match="narrow_range"):
        QuantSpec(format="fp8", narrow_range=True)
    with pytest.raises(ValueError, match="unknown quantization format 'fp4'"):
        QuantSpec(format="fp4")
    with pytest.raises(ValueError, match="unknown quantization format"):
        fake_quant(torch.ones(2), 1.0, fmt="int4")


def test_learned_rounding_is_refused_for_an_fp8_weight() -> None:
    q = Quantizer(QuantSpec(axis=0, format="fp8"), name="conv:weight")
    w = torch.randn(4, 3)
    q.set_amax(w.abs().amax(dim=1))
    with pytest.raises(ValueError, match="FP8"):
        q.set_rounding(torch.zeros(4, 3, dtype=torch.int8), w, {})
