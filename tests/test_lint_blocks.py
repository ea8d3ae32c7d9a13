"""The linter on block-format graphs (issue 60): NVFP4, MXFP8 and INT4 weight-only layers in
ModelOpt's ONNX forms (tests/block_graphs.py), their summary counts, rules M01-M05 and the
Blackwell targets."""

from __future__ import annotations

import pytest

from block_graphs import (
    Builder,
    int4w_mlp,
    modelopt_int4w_mlp,
    modelopt_mxfp8_conv,
    modelopt_mxfp8_mlp,
    mxfp8_mlp,
    nvfp4_conv,
    nvfp4_mlp,
)
from qdq.lint import lint, parse_target
from qdq.lint.blocks import require_kernels


def _weighted(report):
    return {ly.name: ly.input_precision for ly in report.layers if ly.kind == "weighted"}


def test_modelopt_nvfp4_mlp_names_every_4bit_layer():
    report = lint(nvfp4_mlp(), target="trt10.8-blackwell")
    assert _weighted(report) == {"fc1.matmul": "nvfp4", "fc2.matmul": "nvfp4"}
    assert report.block_layers["nvfp4"] == ("fc1.matmul", "fc2.matmul")
    assert report.summary["nvfp4_weighted_layers"] == 2
    assert report.summary["int8_weighted_layers"] == report.summary["fp8_weighted_layers"] == 0
    assert report.verdict == "PASS", report.format()
    dynq = [ly for ly in report.layers if ly.kind == "qdq"]  # the two dynamic quantize layers
    assert [ly.name for ly in dynq] == ["fc1.dynq", "fc2.dynq"]
    assert all(ly.output_precision == "nvfp4" for ly in dynq)
    assert "NVFP4 weighted layers 2/2" in report.format()


def test_mxfp8_and_int4_weight_only_layers():
    mx = lint(mxfp8_mlp(), target="trt10.12-blackwell")
    assert set(_weighted(mx).values()) == {"mxfp8"} and len(_weighted(mx)) == 2
    assert mx.summary["mxfp8_weighted_layers"] == 2 and not mx.rules() - {"V07"}
    w4 = lint(int4w_mlp(), target="trt10.12-blackwell")
    assert set(_weighted(w4).values()) == {"int4w"}
    assert w4.summary["int4w_weighted_layers"] == 2
    assert "P01" not in w4.rules()  # a float activation is the weight-only form, not half a Q/DQ


@pytest.mark.parametrize("target", ["trt10.12-blackwell", "trt11-b200"])
def test_modelopt_trt_mxfp8_dequantize_is_mxfp8(target):
    """ModelOpt 0.47's MXFP8 form: trt::TRT_MXFP8DequantizeLinear, UINT8 exponents, opset 20."""
    report = lint(modelopt_mxfp8_mlp(), target=target)
    assert set(_weighted(report).values()) == {"mxfp8"} and len(_weighted(report)) == 2
    assert report.summary["mxfp8_weighted_layers"] == 2
    assert {"fc1.matmul", "fc2.matmul"} <= set(report.block_layers["mxfp8"])
    # not an unknown operator (V16), not an unquantized model (L01), no block-rule finding
    assert not report.rules() & {"L01", "V16", "V03", "V09", "M01", "M02", "M03", "M04", "M05"}
    assert "MXFP8 weighted layers 2/2" in report.format()


def test_modelopt_trt_mxfp8_refused_on_hopper_m02():
    report = lint(modelopt_mxfp8_mlp(), target="trt10.12-hopper")
    assert "M02" in report.rules("ERROR"), report.format()
    (nodes,) = [f.nodes for f in report.findings if f.rule == "M02"]
    assert {"fc1.act_dq", "fc1.w_dq", "fc2.act_dq", "fc2.w_dq"} <= set(nodes)  # the trt DQs too
    assert "M02" in lint(modelopt_mxfp8_mlp(), target="trt10.8-blackwell").rules("ERROR")


def test_modelopt_trt_mxfp8_convolution_m01():
    report = lint(modelopt_mxfp8_conv(), target="trt10.12-blackwell")
    conv = next(ly for ly in report.layers if ly.name == "conv")
    assert conv.input_precision == "fp16" and "no MXFP8 convolution" in conv.reason
    assert report.summary["mxfp8_weighted_layers"] == 0
    assert report.rules("WARN") == {"M01"}


def test_modelopt_trt_mxfp8_exponent_bytes_are_scales():
    """UINT8 E8M0 bytes: 0 is 2**-127 (a positive scale), 255 is NaN (V03)."""
    from onnx import numpy_helper

    model = modelopt_mxfp8_mlp()
    scale = next(i for i in model.graph.initializer if i.name == "fc1.weight_quantizer/scale")
    value = numpy_helper.to_array(scale).copy()
    value[0, 0] = 0
    scale.CopyFrom(numpy_helper.from_array(value, scale.name))
    assert "V03" not in lint(model, target="trt10.12-blackwell").rules()
    value[0, 0] = 255
    scale.CopyFrom(numpy_helper.from_array(value, scale.name))
    report = lint(model, target="trt10.12-blackwell")
    assert [f.nodes for f in report.findings if f.rule == "V03"] == [("fc1.w_dq",)]


def test_modelopt_trt_mxfp8_blocked_axis_m03_and_block_size_m04():
    b = Builder()
    y = b.modelopt_mxfp8_linear("x", "fc", 32, 64)
    w_dq = next(n for n in b.nodes if n.name == "fc.w_dq")
    next(a for a in w_dq.attribute if a.name == "block_size").i = 16  # 64 = 4 blocks of 16
    report = lint(b.model([2, 64], y, 20), target="trt10.12-blackwell")
    assert [f.nodes for f in report.findings if f.rule == "M04"] == [("fc.w_dq",)]
    b = Builder()
    y = b.modelopt_mxfp8_linear("x", "fc", 32, 48)  # 48: 1.5 blocks of 32
    report = lint(b.model([2, 48], y, 20), target="trt10.12-blackwell")
    assert [f.nodes for f in report.findings if f.rule == "M03"] == [("fc.w_dq",)]


def test_modelopt_trt_dequantize_int4_weight_only():
    report = lint(modelopt_int4w_mlp(), target="trt10.12-blackwell")
    assert set(_weighted(report).values()) == {"int4w"}
    assert report.summary["int4w_weighted_layers"] == 2
    assert not report.rules() & {"L01", "V16", "P01"}


def test_4bit_convolution_runs_float_k01():
    report = lint(nvfp4_conv(), target="trt10.8-blackwell")
    conv = next(ly for ly in report.layers if ly.name == "conv")
    assert conv.input_precision == "fp16" and "no NVFP4 convolution" in conv.reason
    assert report.summary["nvfp4_weighted_layers"] == 0
    assert report.rules("WARN") == {"M01"}


@pytest.mark.parametrize(
    ("target", "severity"),
    [
        ("trt10.8-blackwell", None),
        ("trt11-b200", None),
        ("trt10.8-sm120", None),
        ("trt10.8", "INFO"),  # no GPU named
        ("trt10.5-blackwell", "ERROR"),  # FP4 from 10.8
        ("trt10.12-hopper", "ERROR"),  # FP4 on Blackwell only
        ("trt10.12-sm90", "ERROR"),
    ],
)
def test_nvfp4_target_k02(target, severity):
    report = lint(nvfp4_mlp(), target=target)
    found = {f.severity for f in report.findings if f.rule == "M02"}
    assert found == ({severity} if severity else set()), report.format()


def test_mxfp8_needs_trt_10_12():
    assert "M02" in lint(mxfp8_mlp(), target="trt10.8-blackwell").rules("ERROR")
    assert "M02" not in lint(int4w_mlp(), target="trt10").rules()  # INT4 weight-only from 10.0


def test_blocked_axis_not_whole_blocks_k03_and_block_size_k04():
    b = Builder()
    y = b.int4w_linear("x", "fc", 32, 40, block=16)  # k = 40: 2.5 blocks of 16
    report = lint(b.model([2, 40], y, 21), target="trt10.12")
    assert [f.nodes for f in report.findings if f.rule == "M03"] == [("fc.w_dq",)]
    b = Builder()
    y = b.int4w_linear("x", "fc", 32, 64, block=8)
    assert "M04" in lint(b.model([2, 64], y, 21), target="trt10.12").rules("WARN")


@pytest.mark.parametrize(
    "build", [nvfp4_mlp, mxfp8_mlp, modelopt_mxfp8_mlp, int4w_mlp, modelopt_int4w_mlp]
)
def test_scales_that_fit_their_axis_raise_no_m05(build):
    assert "M05" not in lint(build(), target="trt10.12-blackwell").rules()


def test_a_scale_blocked_along_another_axis_m05():
    """ModelOpt 0.47's INT4 export of a transB Gemm: W [N, K] with its scale blocked along K
    (axis 1) but the node saying axis 0."""
    from onnx import TensorProto

    b = Builder()
    w = b.init("fc.w_int4", TensorProto.INT4, [32, 64], 1.0)
    sc = b.init("fc.w_scale", TensorProto.FLOAT, [32, 4], 0.01)
    b.node("DequantizeLinear", [w, sc], ["fc.wq"], "fc.w_dq", axis=0, block_size=16)
    b.node("Gemm", ["x", "fc.wq"], ["y"], "fc", transB=1)
    report = lint(b.model([2, 64], "y", 21), target="trt10.12")
    found = [f for f in report.findings if f.rule == "M05"]
    assert [(f.severity, f.nodes) for f in found] == [("ERROR", ("fc.w_dq",))]
    assert (
        "scale [32, 4] does not fit values [32, 64] blocked by 16 along axis 0" in found[0].message
    )
    assert "(it fits axis 1)" in found[0].message and found[0].fix == "write axis=1"


def test_blackwell_targets_and_refusal():
    assert parse_target("trt10.8-blackwell").compute_capability == (10, 0)
    assert parse_target("trt11-b200").compute_capability == (10, 0)
    assert parse_target("trt10.12-sm100").compute_capability == (10, 0)
    assert parse_target("trt10.12-sm120").compute_capability == (12, 0)
    require_kernels(parse_target("trt10.12-sm120"), "mxfp8")
    with pytest.raises(ValueError, match="cannot run NVFP4: NVFP4 needs a Blackwell GPU"):
        require_kernels(parse_target("trt10.12-ada"), "nvfp4")
    with pytest.raises(ValueError, match="NVFP4 needs TensorRT 10.8"):
        require_kernels(parse_target("trt10.5-blackwell"), "nvfp4")
    with pytest.raises(ValueError, match="no block format"):
        require_kernels(parse_target("trt10.8-blackwell"), "int8")
