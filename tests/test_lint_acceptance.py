"""The linter on every acceptance graph of the rule specification (§8): exactly the WARN/ERROR rule
ids the spec expects and no others, plus the predicted engine layers for the residual cases, and the
target/build-configuration rules."""

from __future__ import annotations

import numpy as np
import pytest

from lint_graphs import CASES, G, block, t01, t09, t17, t20, t23
from qdq.lint import lint, parse_target


@pytest.mark.parametrize("case", list(CASES))
def test_acceptance_graph_fires_exactly_the_expected_rules(case: str) -> None:
    build, target, expected, info = CASES[case]
    report = lint(build(), target=target)
    assert report.rules("WARN") | report.rules("ERROR") == expected, report.format()
    assert info <= report.rules("INFO"), report.format()
    assert report.exit_code == (2 if report.rules("ERROR") else 1 if expected else 0)


def _layers(report) -> list[tuple[str, str, str]]:
    """(kind, input precision, output precision) per predicted layer."""
    return [(ly.kind, ly.input_precision, ly.output_precision) for ly in report.layers]


def test_t01_predicts_fp16_residual_fusion_and_standalone_quantize() -> None:
    report = lint(t01())
    residual = next(ly for ly in report.layers if any("add" in n for n in ly.nodes))
    assert residual.kind == "weighted" and residual.nodes[0].startswith("conv")
    assert [n.split("_")[0].rstrip("0123456789") for n in residual.nodes] == [
        "conv", "batchnormalization", "add", "relu",
    ]  # fmt: skip
    assert (residual.input_precision, residual.output_precision) == ("int8", "fp16")
    after = report.layers[report.layers.index(residual) + 1]
    assert after.kind == "qdq" and after.nodes[0].startswith("quantizelinear")
    # the input Quantize, the Quantize of x (read in float by the Add) and the one after the Add
    assert report.summary["unfused_qdq"] == 3


def test_t02_predicts_int8_in_and_out_everywhere() -> None:
    report = lint(block("shared"))
    weighted = [ly for ly in report.layers if ly.kind == "weighted"]
    assert [(ly.input_precision, ly.output_precision) for ly in weighted[:-1]] == [
        ("int8", "int8")
    ] * 3
    assert any("add" in n for n in weighted[2].nodes)  # Conv2 + BN + Add + Relu, one layer
    assert report.summary["unfused_qdq"] == 1  # the network input only


def test_t03_predicts_a_separate_int8_pointwise_add() -> None:
    report = lint(block("both"))
    pw = [ly for ly in report.layers if ly.kind == "pointwise"]
    assert len(pw) == 1 and pw[0].int8 and pw[0].output_precision == "int8"
    assert [n.split("_")[0].rstrip("0123456789") for n in pw[0].nodes] == ["add", "relu"]


def test_t17_predicts_a_float_pool_between_two_reformats() -> None:
    kinds = _layers(lint(t17(False)))
    assert kinds[2:4] == [("pooling", "fp16", "fp16"), ("qdq", "fp16", "int8")]
    assert ("pooling", "int8", "int8") in _layers(lint(t17(True)))


def test_a_float_output_fusion_dequantizes_its_quantized_residual_standalone() -> None:
    """ResNet's last block before an unquantized pool: Conv2+BN+Add+Relu writes FP16, so it
    reads the quantized skip in FP16 too, behind a standalone DequantizeLinear (P03d, WARN: the
    fix is to quantize the pool input, after which neither reformat remains)."""
    report = lint(block("shared", "pool"))
    fused = next(ly for ly in report.layers if ly.kind == "weighted" and "add" in str(ly.nodes))
    assert (fused.input_precision, fused.output_precision) == ("int8", "fp16")
    standalone = [ly for ly in report.layers if ly.kind == "qdq"]
    assert [ly.nodes[0].split("_")[0].rstrip("0123456789") for ly in standalone] == [
        "quantizelinear",  # the network input
        "dequantizelinear",  # the skip, read in FP16
        "quantizelinear",  # the pool output, quantized for the Gemm
    ]
    assert standalone[1].reason.startswith("the residual input of " + fused.name)
    (p03d,) = [f for f in report.findings if f.rule == "P03d"]
    assert p03d.severity == "WARN" and "quantize" in p03d.fix and "pool input" in p03d.fix
    fixed = lint(block("shared", "qpool"))
    assert fixed.summary["unfused_qdq"] == 1 and fixed.verdict == "PASS"
    # read by the graph output: the skip is shared with the block's first conv, so leaving it
    # float would only move the reformat (INFO); a downsample branch nothing else reads
    # quantized should stay float (WARN)
    for tail in ("output", "pool-softmax"):  # a pool read by a float op cannot run INT8 either
        (info,) = [f for f in lint(block("shared", tail)).findings if f.rule == "P03d"]
        assert info.severity == "INFO" and "moves the reformat" in info.fix
    (warn,) = [f for f in lint(t23("down", "output")).findings if f.rule == "P03d"]
    assert warn.severity == "WARN" and "leave the residual float" in warn.fix


@pytest.mark.parametrize("pool", ["ReduceMean", "ReduceMean18", "ReduceMean-nokeep"])
@pytest.mark.parametrize("quantized", [False, True])
def test_a_reducemean_over_h_w_is_predicted_as_a_global_pool(pool: str, quantized: bool) -> None:
    """The dynamo exporter's (and other tools') ReduceMean over the spatial axes lints exactly as
    GlobalAveragePool: TensorRT's parser imports both as one average Reduce layer."""
    gap, mean = lint(t17(quantized)), lint(t17(quantized, pool))
    assert _layers(mean) == _layers(gap)
    assert mean.summary == gap.summary and mean.verdict == gap.verdict


def test_a_reducemean_over_the_channels_is_no_pool() -> None:
    report = lint(t17(False, "ReduceMean-C"))
    assert "P06" not in report.rules("WARN")
    mean = next(ly for ly in report.layers if any("reducemean" in n for n in ly.nodes))
    assert (mean.kind, mean.reason) == ("other", "no INT8 implementation")


def test_strongly_typed_float_layers_run_at_the_onnx_dtype() -> None:
    report = lint(t20(), target="trt11")
    floats = [ly for ly in report.layers if not ly.int8 and ly.kind != "qdq"]
    assert floats and {ly.output_precision for ly in floats} == {"fp32"}
    assert report.to_dict()["layers"][0]["kind"] == "qdq"


# --------------------------------------------------------------- targets and build flags
def test_conv_transpose_axis_severity_depends_on_the_version() -> None:
    for target, severity in (("trt8.6", "WARN"), ("trt10", "WARN"), ("trt10.2", "INFO")):
        v12 = next(f for f in lint(t09(1), target=target).findings if f.rule == "V12")
        assert v12.severity == severity, target
    old = next(f for f in lint(t09(1), target="trt8.6").findings if f.rule == "V12")
    assert "axis 0" in old.message


def test_build_without_int8_or_fp16() -> None:
    model = t17(False)
    assert "V13" in lint(model, flags=["fp16"]).rules("ERROR")
    no_fp16 = lint(model, flags=["int8"])
    assert no_fp16.rules("WARN") == {"P06", "B01"}
    floats = [ly for ly in no_fp16.layers if not ly.int8 and ly.kind != "qdq"]
    assert {ly.output_precision for ly in floats} == {"fp32"}
    assert lint(model, flags=["best"]).rules("WARN") == {"P06"}


def test_prequantized_weights_need_tensorrt_10() -> None:
    g = G()
    w = g.const(np.ones((64, 64, 3, 3), np.int8))
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [w, s, z], axis=0)
    y = g.op("Conv", [g.qdq("x"), wd], pads=[1] * 4)
    model = g.model([y])
    assert lint(model, target="trt8.6").rules("ERROR") == {"V10"}
    assert lint(model, target="trt10").verdict == "PASS"
    assert "V10" in lint(model, target="trt10").rules("INFO")


def test_opset_above_the_parser_range() -> None:
    g = G()
    model = g.model([g.conv(g.qdq("x"))], opset=19)
    assert "V07" in lint(model, target="trt8.6").rules("ERROR")
    assert lint(model, target="trt10").verdict == "PASS"


@pytest.mark.parametrize(
    ("text", "kwargs", "message"),
    [
        ("tensorrt10", {}, "target must look like"),
        ("trt7", {}, "target must look like"),
        ("trt10-a1000", {}, "unknown GPU 'a1000'.*qdq engine time --list-gpus"),
        ("trt10.5", {"strongly_typed": True}, "need TensorRT 10.12"),
        ("trt11", {"strongly_typed": False}, "always strongly typed"),
        ("trt10", {"flags": ["int4"]}, "unknown build flags"),
        ("trt11", {"flags": ["fp16"]}, "do not exist for strongly typed"),
    ],
)
def test_bad_targets_are_rejected(text: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_target(text, **kwargs)


def test_target_defaults() -> None:
    assert parse_target("trt10").flags == {"int8", "fp16"}
    assert parse_target("trt10").float_dtype == "fp16"
    t11 = parse_target("trt11")
    assert t11.strongly_typed and not t11.flags and t11.float_dtype == "fp32"
    assert parse_target("trt10.12", strongly_typed=True).strongly_typed
    assert parse_target("trt8.6").max_opset == 17 and parse_target("trt10.5").max_opset == 20
