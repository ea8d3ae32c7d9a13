"""Linter validity rules V01–V12 on the acceptance graphs of the rule specification (§8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import qdq
from qdq.lint.findings import exit_code
from qdq.lint.validity import check_validity


def _model(nodes, inits, opset=13, inputs=(("x", [1, 64, 8, 8]),)):
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _conv_block(x_q_zp, w_scale=None, w_axis=0, x_scale=0.02, opset=13, extra=()):
    w = np.random.default_rng(0).normal(size=(64, 64, 3, 3)).astype(np.float32)
    ws = np.full(64, 0.01, np.float32) if w_scale is None else w_scale
    inits = {
        "xs": np.float32(x_scale), "xz": x_q_zp, "w": w, "ws": ws,
        "wz": np.zeros(ws.shape, np.int8),
    }  # fmt: skip
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="qw", axis=w_axis),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw", axis=w_axis),
        helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        *extra,
    ]
    return _model(nodes, inits, opset)


def rules(model) -> set[str]:
    return {f.rule for f in check_validity(model)}


def test_clean_graph_has_no_validity_findings() -> None:
    assert rules(_conv_block(np.int8(0))) == set()


def test_t10_uint8_and_nonzero_zero_point() -> None:
    findings = check_validity(_conv_block(np.uint8(128)))
    assert {f.rule for f in findings} == {"V01", "V02"}
    assert all(f.severity == "ERROR" for f in findings) and exit_code(findings) == 2


def test_t11_int32_bias_dequantize() -> None:
    bias = [
        helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], name="dqb"),
    ]
    m = _conv_block(np.int8(0), extra=bias)
    m.graph.initializer.extend([
        numpy_helper.from_array(np.zeros(64, np.int32), "b"),
        numpy_helper.from_array(np.full(64, 2e-4, np.float32), "bs"),
    ])  # fmt: skip
    assert "V06" in rules(m)


def test_t12_per_channel_activation() -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q", axis=1),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq", axis=1),
    ]
    m = _model(nodes, {"s": np.full(64, 0.1, np.float32), "z": np.zeros(64, np.int8)})
    assert rules(m) == {"V05"}


def test_t13_scale_issues() -> None:
    assert "V04" in rules(_conv_block(np.int8(0), w_scale=np.full(63, 0.01, np.float32)))
    dead = np.full(64, 0.01, np.float32)
    dead[7] = 0.0
    assert "V03" in rules(_conv_block(np.int8(0), w_scale=dead))
    w = np.ones((256, 256), np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], name="qw", axis=1),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dqw", axis=1),
        helper.make_node("Gemm", ["x", "wd"], ["y"], name="gemm", transB=1),
    ]
    m = _model(nodes, {"w": w, "s": np.full(256, 0.01, np.float32), "z": np.zeros(256, np.int8)},
               inputs=(("x", [1, 256]),))  # fmt: skip
    found = check_validity(m)
    assert [(f.rule, f.severity) for f in found] == [("V04b", "WARN")]


def test_t21_qoperator_and_t22_old_opset() -> None:
    node = helper.make_node(
        "QLinearConv", ["a", "b", "c", "d", "e", "f", "g", "h"], ["y"], name="qc"
    )
    assert "V08" in rules(_model([node], {}))
    assert "V07" in rules(_conv_block(np.int8(0), opset=11))


def test_dynamic_scale_and_missing_zero_point() -> None:
    nodes = [
        helper.make_node("Abs", ["x"], ["s"], name="abs"),
        helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s"], ["y"], name="dq"),
    ]
    assert {"V09", "V02"} <= rules(_model(nodes, {}))


def test_conv_transpose_per_channel_is_flagged() -> None:
    w = np.ones((64, 32, 2, 2), np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], name="qw", axis=1),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dqw", axis=1),
        helper.make_node("ConvTranspose", ["x", "wd"], ["y"], name="deconv", strides=[2, 2]),
    ]
    m = _model(nodes, {"w": w, "s": np.full(32, 0.01, np.float32), "z": np.zeros(32, np.int8)})
    assert [f.rule for f in check_validity(m)] == ["V12"]


def test_qdq_exports_are_valid(tmp_path: Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3)
    )
    x = torch.randn(2, 3, 12, 12)
    prepared = qdq.prepare(model.eval(), (x,))
    qdq.calibrate(prepared, [x], show_progress=False)
    for exporter in ("dynamo", "torchscript"):
        out = qdq.export_onnx(prepared, (x,), tmp_path / f"{exporter}.onnx", exporter=exporter)
        assert check_validity(onnx.load(str(out.path))) == [], exporter


@pytest.mark.parametrize("severity", ["WARNING", "error"])
def test_bad_severity_is_rejected(severity: str) -> None:
    from qdq.lint.findings import Finding

    with pytest.raises(ValueError, match="severity must be one of"):
        Finding("V01", severity, (), "x")
