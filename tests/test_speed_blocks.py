"""The engine-time model on the block formats (issue 60, kernel rule K08): TensorRT's dynamic block
quantize and blocked DequantizeLinear sized through shape inference, NVFP4/MXFP8/INT4
weight-only GEMMs priced at their tensor-core math and their bytes with block scales, the FP16
build of the same graph stripped of every block Q/DQ, on the hand-built graphs of
``block_graphs`` (qdq's forms and ModelOpt's) and on qdq's own exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from block_graphs import (
    Builder,
    int4w_mlp,
    modelopt_int4w_mlp,
    modelopt_mxfp8_mlp,
    mxfp8_mlp,
)
from qdq.lint import lint
from qdq.lint.graph import LintGraph
from qdq.lint.speed.cost import (
    ELEMENT_BYTES,
    CostLayer,
    UnsupportedPrecisionError,
    layer_time,
    math_precision,
)
from qdq.lint.speed.gpus import find_gpu
from qdq.lint.speed.latency import predict_latency
from qdq.lint.speed.onnx_layers import engine_layers, strip_qdq

HIDDEN, WIDTH, ROWS = 64, 32, 2 * 8  # the block_graphs MLPs: Linear(32, 64) -> Linear(64, 32)


def nvfp4_mlp_23() -> onnx.ModelProto:
    """Two NVFP4 Linears (ModelOpt's activation and weight forms) with a ReLU, at opset 23, the
    first whose DequantizeLinear reads FLOAT4E2M1."""
    b = Builder()
    h = b.nvfp4_linear("x", "fc1", HIDDEN, WIDTH)
    b.node("Relu", [h], ["act"], "relu")
    y = b.nvfp4_linear("act", "fc2", WIDTH, HIDDEN)
    return b.model([2, 8, WIDTH], y, 23)


GRAPHS = {
    "nvfp4": (nvfp4_mlp_23, "trt10.12-blackwell"),
    "mxfp8": (mxfp8_mlp, "trt11-b200"),
    "modelopt-mxfp8": (modelopt_mxfp8_mlp, "trt10.12-blackwell"),
    "int4w": (int4w_mlp, "trt10.12-blackwell"),
    "modelopt-int4w": (modelopt_int4w_mlp, "trt10.12-blackwell"),
}
PRECISION = {"nvfp4": "nvfp4", "mxfp8": "mxfp8", "modelopt-mxfp8": "mxfp8", "int4w": "int4w",
             "modelopt-int4w": "int4w"}  # fmt: skip


def _gemms(layers: list) -> list:
    return [e.cost for e in layers if e.cost.op == "gemm"]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_layer_of_a_block_graph_is_sized(name: str) -> None:
    build, target = GRAPHS[name]
    model = build()
    layers = engine_layers(model, lint(model, target=target).layers)
    assert all(e.sized for e in layers), [e.cost.name for e in layers if not e.sized]
    gemms = _gemms(layers)
    assert [c.precision for c in gemms] == [PRECISION[name]] * 2
    # each MatMul: 16 rows; (N, K) = (64, 32) then (32, 64)
    assert [c.macs for c in gemms] == [ROWS * HIDDEN * WIDTH] * 2
    assert [c.gemm for c in gemms] == [(ROWS, HIDDEN, WIDTH), (ROWS, WIDTH, HIDDEN)]


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8"])
def test_block_gemm_reads_values_and_block_scales(name: str) -> None:
    build, target = GRAPHS[name]
    model = build()
    layers = engine_layers(model, lint(model, target=target).layers)
    fc1 = _gemms(layers)[0]
    per_value = {"nvfp4": 0.5 + 1 / 16, "mxfp8": 1 + 1 / 32}[name]
    assert fc1.read_bytes == pytest.approx(ROWS * WIDTH * per_value)
    assert fc1.weight_bytes == pytest.approx(HIDDEN * WIDTH * per_value)
    dyn = next(e.cost for e in layers if e.cost.op == "qdq")
    assert dyn.precision == PRECISION[name]  # the dynamic quantize writes values and scales
    assert dyn.write_bytes == pytest.approx(ROWS * WIDTH * per_value)


def test_int4_weight_only_reads_a_float_activation_and_4bit_weights() -> None:
    model = int4w_mlp()
    fc1 = _gemms(engine_layers(model, lint(model, target="trt10.12-blackwell").layers))[0]
    assert fc1.read_bytes == ROWS * WIDTH * 2  # FP16 activation
    assert fc1.weight_bytes == pytest.approx(HIDDEN * WIDTH * ELEMENT_BYTES["int4w"])
    assert ELEMENT_BYTES["int4w"] < 0.55


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_strip_qdq_removes_every_block_qdq(name: str) -> None:
    model = GRAPHS[name][0]()
    stripped = strip_qdq(model)
    ops = {(n.domain, n.op_type) for n in stripped.graph.node}
    assert not {op for op in ops if op[0] == "trt" or "Quantize" in op[1]}, ops
    assert {op for _, op in ops} >= {"MatMul", "Relu"}
    g = LintGraph(stripped)
    weights = [n.input[1] for n in stripped.graph.node if n.op_type == "MatMul"]
    assert all(g.is_const(w) for w in weights)


def test_strip_qdq_dequantizes_block_weights_exactly() -> None:
    """NVFP4's two levels (FP4 1.0 x E4M3 1.0 x 0.001), INT4 by block (1 x 0.01)."""
    stripped = strip_qdq(nvfp4_mlp_23())
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in stripped.graph.initializer}
    w = inits["fc1.wq"]
    assert w.shape == (HIDDEN, WIDTH) and w.dtype == np.float32
    np.testing.assert_allclose(w, 0.001, rtol=1e-6)
    assert "fc1.ws" not in inits  # the scale's own DequantizeLinear is gone with it
    stripped = strip_qdq(int4w_mlp(block=16))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in stripped.graph.initializer}
    assert inits["fc1.wq"].shape == (WIDTH, HIDDEN)
    np.testing.assert_allclose(inits["fc1.wq"], 0.01, rtol=1e-6)


def test_stripped_block_graph_predicts_the_same_fp16_engine_as_a_float_graph() -> None:
    quantized = predict_latency(nvfp4_mlp_23(), target="trt10.12-blackwell")
    assert {ly.precision for ly in quantized.fp16_layers if ly.op == "gemm"} == {"fp16"}
    assert quantized.unsized == ()


def test_k08_math_of_the_block_formats() -> None:
    b200, h100 = find_gpu("b200"), find_gpu("h100")
    assert math_precision("nvfp4", b200) == "fp4"
    assert math_precision("mxfp8", b200) == "fp8"
    assert math_precision("int4w", b200) == "fp16"
    assert math_precision("int4w", h100) == "fp16"
    with pytest.raises(UnsupportedPrecisionError, match="no FP4 kernels"):
        math_precision("nvfp4", h100)
    big = CostLayer("fc", "gemm", "nvfp4", macs=float(8192**3), gemm=(8192, 8192, 8192))
    with pytest.raises(UnsupportedPrecisionError, match="layer 'fc'"):
        layer_time(big, h100)


def _gemm(precision: str, m: int, n: int, k: int) -> CostLayer:
    act = ELEMENT_BYTES["fp16" if precision in ("int4w", "fp16") else precision]
    return CostLayer(
        "fc", "gemm", precision, macs=float(m * n * k), read_bytes=m * k * act,
        write_bytes=m * n * 2.0, weight_bytes=n * k * ELEMENT_BYTES[precision], gemm=(m, n, k),
    )  # fmt: skip


def test_a_compute_bound_gemm_is_fastest_in_nvfp4_and_int4w_is_fp16_math() -> None:
    b200 = find_gpu("b200")
    ms = {p: layer_time(_gemm(p, 8192, 8192, 8192), b200).ms
          for p in ("fp16", "fp8", "mxfp8", "nvfp4", "int4w")}  # fmt: skip
    assert ms["nvfp4"] < ms["mxfp8"] < ms["fp16"]
    assert ms["mxfp8"] == pytest.approx(ms["fp8"], rel=0.05)
    assert ms["nvfp4"] == pytest.approx(ms["fp8"] / 2, rel=0.1)  # twice the FP8 rate on a B200
    assert ms["int4w"] == pytest.approx(ms["fp16"], rel=0.05)  # the same FP16 math


def test_a_memory_bound_gemm_is_faster_with_int4_weights() -> None:
    """One row (a decode step): the weights' bytes are the time."""
    b200 = find_gpu("b200")
    fp16 = layer_time(_gemm("fp16", 1, 8192, 8192), b200)
    int4w = layer_time(_gemm("int4w", 1, 8192, 8192), b200)
    assert int4w.memory_ms < fp16.memory_ms / 3.5
    assert int4w.ms < fp16.ms / 2


def test_qdq_nvfp4_export_is_timed_not_floored(tmp_path: Path) -> None:
    """qdq's own NVFP4 export of a wide MLP (the job's file): every layer sized, its GEMMs at the
    FP4 rate and faster than their FP16 build's."""
    import torch
    from torch import nn

    from qdq.pipeline import quantize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).eval()
    x = torch.randn(32, 64, 256)
    res = quantize(model, x, out=tmp_path, format="nvfp4", ptq="none", show_progress=False)
    onnx_path = Path(res.onnx_path)
    r = predict_latency(onnx_path, target="trt10.12-blackwell", shapes={"input": (32, 64, 256)})
    assert r.unsized == ()
    q = [ly for ly in r.layers if ly.op == "gemm"]
    f = [ly for ly in r.fp16_layers if ly.op == "gemm"]
    assert [ly.precision for ly in q] == ["nvfp4", "nvfp4"]
    assert len(f) == 2 and all(a.ms < b.ms for a, b in zip(q, f, strict=True))
