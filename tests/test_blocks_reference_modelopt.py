"""TensorRT Model Optimizer's own block forms in ONNX Runtime through
``qdq.backends.blocks_reference.runnable`` (issue 60): ModelOpt 0.47 writes MXFP8 at opset 20 as
``trt::TRT_MXFP8DynamicQuantize`` + ``trt::TRT_MXFP8DequantizeLinear`` with its E8M0 scales typed
UINT8 (the exponent byte, bias 127) and ``output_dtype`` FLOAT16 while the graph declares the
output float32, and INT4 weights as ``trt::DequantizeLinear`` (blocked, opset 20). The values
equal ``qdq.quant.blocks.block_fake_quant`` bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from block_checks import same
from qdq.backends.blocks_reference import needs_reference, runnable
from qdq.backends.ort_session import run, session
from qdq.quant.blocks import INT4, INT4_MAX, INT4_MIN, MXFP8, block_fake_quant, block_scales
from qdq.quant.blocks_fp4 import e4m3_round, e8m0_scale

_INT4_32 = INT4.with_block_size(32)


def _mx_weight(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """ModelOpt's MXFP8 weight initializers for ``w`` blocked along its last axis: E4M3 codes
    and UINT8 exponent bytes (``compute_scales``: ``e8m0 + 127``)."""
    e, _ = block_scales(w, MXFP8, None, -1)  # float32 exponents in [-127, 127]
    codes = e4m3_round(w / e8m0_scale(e).repeat_interleave(32, dim=-1))
    return codes.numpy().astype(ml_dtypes.float8_e4m3fn), (e + 127).to(torch.uint8).numpy()


def _int4_weight(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """INT4 codes and float32 scales of ``w`` blocked by 32 along axis 0 (ModelOpt's MatMul form)."""
    s, _ = block_scales(w, _INT4_32, None, 0)
    codes = (w / s.repeat_interleave(32, dim=0)).round().clamp(INT4_MIN, INT4_MAX)
    return codes.to(torch.int8).numpy().astype(ml_dtypes.int4), s.numpy()


def _activation() -> torch.Tensor:
    """Rows of two MX blocks: an amax of exactly 448·2**e, just above it, zero, subnormal."""
    rows = []
    for e in range(-140, 120, 7):
        a = 448.0 * 2.0**e
        above = float(np.nextafter(np.float32(a), np.float32(np.inf)))
        rows.append([a] + [a * 0.3] * 31 + [above] + [-above / 3] * 31)
    rows.append([0.0] * 32 + [2.0**-149] + [0.0] * 31)
    return torch.tensor(rows, dtype=torch.float32)


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(7)
    w = torch.randn(16, 64) * torch.logspace(-6, 6, 16).unsqueeze(1)  # MX weight [n, k]
    w[3, :32] = 0.0  # a zero block: exponent byte 0 (2**-127)
    w4 = torch.randn(64, 16) * torch.logspace(-3, 3, 16)  # INT4 MatMul weight [k, n]
    return w, w4


def _modelopt_graph(out_dtype: int = TensorProto.FLOAT) -> tuple[object, torch.Tensor]:
    """``y = MX(x) @ MX(w).T``, and an INT4 ``trt::DequantizeLinear`` weight, as ModelOpt 0.47
    writes them; outputs: the activation's, the weight's and the INT4 weight's dequantized
    values and ``y``."""
    x = _activation()
    w, w4 = _weights()
    w8, wbytes = _mx_weight(w)
    codes4, s4 = _int4_weight(w4)
    inits = [
        numpy_helper.from_array(w8, "fc.weight"),
        numpy_helper.from_array(wbytes, "fc/weight_quantizer/scale"),
        numpy_helper.from_array(codes4, "trt::DequantizeLinear_1"),
        numpy_helper.from_array(s4, "fc2/weight_quantizer/scale"),
    ]
    mx = {"domain": "trt", "axis": -1, "block_size": 32}
    nodes = [
        helper.make_node("TRT_MXFP8DynamicQuantize", ["x"], ["x8", "xs"], name="fc/in/dynq",
                         output_dtype=TensorProto.FLOAT8E4M3FN, **mx),
        helper.make_node("TRT_MXFP8DequantizeLinear", ["x8", "xs"], ["xq"], name="fc/in/dq",
                         output_dtype=TensorProto.FLOAT16, **mx),
        helper.make_node("TRT_MXFP8DequantizeLinear", ["fc.weight", "fc/weight_quantizer/scale"],
                         ["wq"], name="fc/w/dq", output_dtype=TensorProto.FLOAT16, **mx),
        helper.make_node("Transpose", ["wq"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["xq", "wt"], ["y"]),
        helper.make_node("DequantizeLinear", ["trt::DequantizeLinear_1",
                         "fc2/weight_quantizer/scale"], ["w4q"], name="fc2/w/dq", domain="trt",
                         axis=0, block_size=32),
    ]  # fmt: skip
    outs = [helper.make_tensor_value_info(n, out_dtype, None) for n in ("xq", "wq", "w4q")]
    outs.append(helper.make_tensor_value_info("y", out_dtype, None))
    graph = helper.make_graph(
        nodes, "modelopt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        outs, inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("trt", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model, x


def test_modelopt_mxfp8_and_int4_trt_forms_run_bit_exact():
    model, x = _modelopt_graph()
    assert needs_reference(model)
    xq, wq, w4q, y = run(session(model), [x])  # qdq's session rewrites the trt ops
    w, w4 = _weights()
    assert same(block_fake_quant(x, MXFP8, None, -1), xq)
    assert same(block_fake_quant(w, MXFP8, None, -1), wq)
    assert same(block_fake_quant(w4, _INT4_32, None, 0), w4q)
    assert y.dtype == np.float32 and y.shape == (x.shape[0], 16)
    rewritten = runnable(model)
    assert all(n.domain != "trt" for n in rewritten.graph.node)
    assert all(i.data_type != TensorProto.UINT8 for i in rewritten.graph.initializer)


def test_output_dtype_float16_when_the_graph_declares_nothing():
    """Undeclared, the output has ``output_dtype``'s type (FLOAT16, exact for these values)."""
    w, _ = _weights()
    w8, wbytes = _mx_weight(w)
    nodes = [
        helper.make_node("TRT_MXFP8DequantizeLinear", ["w", "s"], ["wq"], domain="trt", axis=-1,
                         block_size=32, output_dtype=TensorProto.FLOAT16),
        helper.make_node("Cast", ["wq"], ["z"], to=TensorProto.FLOAT),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w8, "w"), numpy_helper.from_array(wbytes, "s")],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("trt", 1)]
    )
    model.ir_version = 9
    rewritten = runnable(model)
    assert rewritten.graph.node[-2].op_type == "Cast"  # the DequantizeLinear's, to FLOAT16
    (z,) = run(session(model), [])
    want = block_fake_quant(w, MXFP8, None, -1)
    assert same(want.half().float(), z)  # the float32 product rounded once to FLOAT16
    inside = (want.abs() >= 2.0**-14) & (want.abs() <= 65504)  # FLOAT16's normal range
    assert bool(inside.any()) and bool((~inside).any())
    assert same(want[inside], z[inside.numpy()])  # exact there: E4M3 codes times 2**k


def test_every_exponent_byte_decodes_exactly():
    """All 256 UINT8 exponents: ``2**(byte - 127)``, ``2**-127`` a subnormal, 255 NaN."""
    byte = np.arange(256, dtype=np.uint8).reshape(1, 256)
    ones = np.ones((1, 512), ml_dtypes.float8_e4m3fn)
    node = helper.make_node("TRT_MXFP8DequantizeLinear", ["w", "s"], ["z"], domain="trt",
                            axis=-1, block_size=2, output_dtype=TensorProto.FLOAT)  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(ones, "w"), numpy_helper.from_array(byte, "s")],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("trt", 1)]
    )
    model.ir_version = 9
    (z,) = run(session(model), [])
    want = torch.tensor([float(b) - 127 for b in range(255)] + [float("nan")])
    assert same(e8m0_scale(want).repeat_interleave(2).reshape(1, 512), z)


def test_modelopt_gemm_axis_and_zero_point_are_refused():
    model, _ = _modelopt_graph()
    dq = next(n for n in model.graph.node if n.name == "fc2/w/dq")
    next(a for a in dq.attribute if a.name == "axis").i = 1  # the scale [2, 16] fits axis 0 only
    with pytest.raises(ValueError, match=r"fc2/w/dq: block scale \[2, 16\] does not fit"):
        runnable(model)
    model, _ = _modelopt_graph()
    dq = next(n for n in model.graph.node if n.name == "fc2/w/dq")
    dq.input.append("zp")
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((2, 16), np.int8), "zp"))
    with pytest.raises(ValueError, match="fc2/w/dq: trt::DequantizeLinear with a zero point"):
        runnable(model)
    model, _ = _modelopt_graph()
    scale = next(i for i in model.graph.initializer if i.name == "fc/weight_quantizer/scale")
    scale.CopyFrom(numpy_helper.from_array(np.ones((16, 2), np.float32), scale.name))
    with pytest.raises(ValueError, match="fc/w/dq: TRT_MXFP8DequantizeLinear scale"):
        runnable(model)
