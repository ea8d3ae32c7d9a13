"""The linter on FP8 (E4M3FN) and mixed INT8/FP8 Q/DQ ONNX (issue 49): a table of hand-built graphs
(opset 19, IR 9) -> the predicted precision of the case's layer and the rules that fire, checked
against TensorRT's documented FP8 support (docs/lint.md, "FP8"); the format boundaries predicted as
reformats; an INT8-only graph linted as before whatever GPU the target names; engine reports whose
layers read ``FP8`` compared layer by layer like INT8 ones."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdq.lint import diff_engine, lint, parse_target
from qdq.lint.compare import compute_precision
from qdq.lint.engine_report import parse_engine_report

sys.path.insert(0, str(Path(__file__).parent))
from lint_graphs import CASES

FIXTURES = Path("/work/shared/fixtures/trt-engines")
if not FIXTURES.is_dir():
    FIXTURES = Path(__file__).parents[1] / "shared" / "fixtures" / "trt-engines"

INT8, FP8 = "int8", "fp8"


class F:
    """A tiny opset-19 graph builder with INT8 and FP8 Q/DQ (named nodes where a case asks)."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.n = 0
        self.rng = np.random.default_rng(0)

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: Any, prefix: str = "c") -> str:
        name = self._id(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def zero(self, fmt: str, n: int | None = None) -> str:
        name = self._id("z")
        dims = [] if n is None else [n]
        if fmt == FP8:
            self.inits.append(
                helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, dims, [0.0] * (n or 1))
            )
        elif fmt == "e5m2":
            self.inits.append(
                helper.make_tensor(name, TensorProto.FLOAT8E5M2, dims, [0.0] * (n or 1))
            )
        else:
            self.inits.append(numpy_helper.from_array(np.zeros(dims, np.int8), name))
        return name

    def op(self, op: str, inputs: list[str], name: str | None = None, **attrs: Any) -> str:
        out = self._id(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=name or out + "_n", **attrs))
        return out

    def qdq(self, x: str, fmt: str, scale: Any = 0.02, axis: int | None = None,
            dq_zero_point: bool = True, name: str | None = None) -> str:  # fmt: skip
        """Q -> DQ; ``dq_zero_point=False`` writes the DequantizeLinear as ModelOpt does."""
        scale = np.asarray(scale, np.float32)
        s = self.const(scale, "s")
        z = self.zero(fmt, None if scale.ndim == 0 else scale.size)
        attrs = {} if axis is None else {"axis": axis}
        q = self.op("QuantizeLinear", [x, s, z], name=name, **attrs)
        return self.op("DequantizeLinear", [q, s, z] if dq_zero_point else [q, s], **attrs)

    def weight(self, shape: tuple[int, ...], fmt: str, per_channel: bool = False,
               dq_only: bool = False) -> str:  # fmt: skip
        w = self.rng.normal(size=shape).astype(np.float32)
        if dq_only:  # ModelOpt's FP8 weights: an FP8 initializer read by DequantizeLinear alone
            name = self._id("w")
            self.inits.append(
                helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, shape, w.flatten().tolist())
            )
            return self.op("DequantizeLinear", [name, self.const(np.float32(0.01), "s")])
        if per_channel:
            return self.qdq(self.const(w, "w"), fmt, np.full(shape[0], 0.01), axis=0)
        return self.qdq(self.const(w, "w"), fmt, 0.01)

    def conv(self, x: str, cin: int, cout: int, fmt: str, k: int = 3, group: int = 1,
             wfmt: str | None = None, per_channel: bool = False, dq_only: bool = False,
             name: str = "conv") -> str:  # fmt: skip
        w = self.weight((cout, cin // group, k, k), wfmt or fmt, per_channel, dq_only)
        act = self.qdq(x, fmt, dq_zero_point=not dq_only)
        return self.op("Conv", [act, w], name=name, group=group, pads=[k // 2] * 4)

    def gemm(self, x: str, k: int, n: int, fmt: str, per_channel: bool = False,
             name: str = "gemm") -> str:  # fmt: skip
        w = self.rng.normal(size=(k, n)).astype(np.float32)
        if per_channel:
            wq = self.qdq(self.const(w, "w"), fmt, np.full(n, 0.01), axis=1)
        else:
            wq = self.qdq(self.const(w, "w"), fmt, 0.01)
        return self.op("MatMul", [self.qdq(x, fmt), wq], name=name)

    def model(self, outputs: list[str], shape: tuple[int, ...], opset: int = 19) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "fp8",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )  # fmt: skip
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9
        )


def conv_model(cin: int = 64, cout: int = 64, opset: int = 19, **kw: Any) -> onnx.ModelProto:
    f = F()
    return f.model([f.conv("x", cin, cout, kw.pop("fmt", FP8), **kw)], (1, cin, 8, 8), opset)


def gemm_model(k: int = 768, n: int = 768, **kw: Any) -> onnx.ModelProto:
    f = F()
    return f.model([f.gemm("x", k, n, kw.pop("fmt", FP8), **kw)], (1, 16, k))


def two_formats_model() -> onnx.ModelProto:
    """One tensor read by an INT8 conv and an FP8 conv."""
    f = F()
    y = f.op("Relu", [f.conv("x", 64, 64, INT8, name="conv0")])
    a = f.conv(y, 64, 64, INT8, name="conv_int8")
    b = f.conv(y, 64, 64, FP8, name="conv")
    return f.model([a, b], (1, 64, 8, 8))


def depthwise_separable_model() -> onnx.ModelProto:
    """An INT8 depthwise conv feeding an FP8 pointwise conv (ModelOpt's FP8 export of a MobileNet
    block)."""
    f = F()
    y = f.op("Relu", [f.conv("x", 64, 64, INT8, group=64, name="dw")])
    return f.model([f.conv(y, 64, 64, FP8, k=1)], (1, 64, 8, 8))


def attention_model(fmt: str, probs_scale: float = 1 / 448) -> onnx.ModelProto:
    """q, k, v (1, 4, 16, 32) from x: softmax(q @ kᵀ) @ v with every operand through Q/DQ (the
    probabilities at ModelOpt's fixed FP8 scale 1/448 unless ``probs_scale`` says otherwise)."""
    f = F()
    q, k, v = (f.op("Mul", ["x", f.const(np.float32(c))]) for c in (0.125, 1.0, 0.5))
    kt = f.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = f.op("MatMul", [f.qdq(q, fmt), f.qdq(kt, fmt)], name="scores")
    probs = f.op("Softmax", [scores], axis=-1)
    ctx = f.op("MatMul", [f.qdq(probs, fmt, probs_scale), f.qdq(v, fmt)], name="context")
    return f.model([ctx], (1, 4, 16, 32))


# case id -> (model, target (a string or parse_target kwargs), layer, its predicted input
# precision, the exact WARN/ERROR rules, INFO rules that must fire too)
GRAPH_CASES: dict[str, tuple[Any, Any, str, str, set[str], set[str]]] = {
    "fp8-conv-64-3x3-hopper": (conv_model, "trt10-hopper", "conv", FP8, set(), set()),
    "fp8-conv-strongly-typed-blackwell": (
        conv_model, {"text": "trt10.12-blackwell", "strongly_typed": True}, "conv", FP8,
        {"B02"}, set(),
    ),
    "fp8-conv-modelopt-dq-only-weights": (
        lambda: conv_model(dq_only=True), "trt10-hopper", "conv", FP8, set(), {"V10"},
    ),
    "depthwise-fp8-conv": (lambda: conv_model(group=64), "trt10-hopper", "conv", FP8, {"F02"}, set()),
    "grouped-fp8-conv": (lambda: conv_model(group=4), "trt10-ada", "conv", FP8, {"F02"}, set()),
    "8-channel-fp8-conv": (lambda: conv_model(8, 8), "trt10-hopper", "conv", FP8, {"F03"}, set()),
    "16-to-64-fp8-conv": (lambda: conv_model(16, 64), "trt10-hopper", "conv", FP8, {"F03"}, set()),
    "17-channel-fp8-conv": (lambda: conv_model(17, 64), "trt10-hopper", "conv", FP8, set(), set()),
    "7x7-fp8-conv-falls-back": (
        lambda: conv_model(k=7), "trt10-hopper", "conv", "fp16", {"F03"}, set(),
    ),
    "per-channel-fp8-conv-weights": (
        lambda: conv_model(per_channel=True), "trt10-hopper", "conv", "fp16", {"F06"}, set(),
    ),
    "fp8-on-ampere": (conv_model, "trt10-ampere", "conv", FP8, {"F01", "F07"}, set()),
    "fp8-on-turing": (conv_model, "trt10-turing", "conv", FP8, {"F01", "F07"}, set()),
    "fp8-on-sm86-strongly-typed": (
        conv_model, {"text": "trt10.12-sm86", "strongly_typed": True}, "conv", FP8,
        {"F01", "B02"}, set(),
    ),
    "fp8-target-names-no-gpu": (conv_model, "trt10", "conv", FP8, {"F07"}, {"F01"}),
    "fp8-without-fp8-flag": (
        conv_model, {"text": "trt10-hopper", "flags": ["int8", "fp16"]}, "conv", FP8, {"F07"},
        set(),
    ),
    "fp8-gemm-768x768": (gemm_model, "trt10-hopper", "gemm", FP8, set(), set()),
    "fp8-gemm-n-8": (lambda: gemm_model(768, 8), "trt10-hopper", "gemm", FP8, {"F04"}, set()),
    "per-channel-fp8-gemm-hopper-10.6": (
        lambda: gemm_model(per_channel=True), "trt10.6-hopper", "gemm", FP8, set(), set(),
    ),
    "per-channel-fp8-gemm-hopper-10.0": (
        lambda: gemm_model(per_channel=True), "trt10-hopper", "gemm", FP8, set(), {"F06"},
    ),
    "fp8-activation-int8-weights": (
        lambda: conv_model(wfmt=INT8), "trt10-hopper", "conv", "fp16", {"F05"}, set(),
    ),
    "int8-activation-fp8-weights": (
        lambda: conv_model(fmt=INT8, wfmt=FP8), "trt10-hopper", "conv", "fp16", {"F05"}, set(),
    ),
    "one-tensor-int8-and-fp8": (two_formats_model, "trt10-hopper", "conv", FP8, {"F05"}, set()),
    "fp8-qdq-at-opset-17": (lambda: conv_model(opset=17), "trt10-hopper", "conv", FP8, {"V07"},
                            set()),
    "fp8-e5m2-zero-point": (lambda: conv_model(fmt="e5m2"), "trt10-hopper", "conv", INT8, {"V02"},
                            set()),
    "fp8-pointwise-after-int8-depthwise": (
        depthwise_separable_model, "trt10-hopper", "conv", FP8, set(), {"F09"},
    ),
    "fp8-attention-hopper": (lambda: attention_model(FP8), "trt10-hopper", "scores", FP8, set(),
                             set()),
    "int8-attention-hopper": (lambda: attention_model(INT8), "trt10-hopper", "scores", INT8,
                              set(), set()),
    "fp8-attention-calibrated-softmax-scale": (
        lambda: attention_model(FP8, 0.97 / 448), "trt10-hopper", "scores", FP8, set(), {"F08"},
    ),
}  # fmt: skip


def _lint(model: onnx.ModelProto, target: Any) -> Any:
    if isinstance(target, dict):
        kw = dict(target)
        return lint(model, target=parse_target(kw.pop("text"), **kw))
    return lint(model, target=target)


def _layer_of(report: Any, node: str) -> Any:
    return next(ly for ly in report.layers if ly.kind != "qdq" and node in ly.nodes)


@pytest.mark.parametrize("case", list(GRAPH_CASES), ids=list(GRAPH_CASES))
def test_fp8_verdicts(case: str) -> None:
    build, target, node, precision, strict, info = GRAPH_CASES[case]
    report = _lint(build(), target)
    assert _layer_of(report, node).input_precision == precision, report.format(True)
    assert report.rules("WARN") | report.rules("ERROR") == strict, report.format()
    assert info <= report.rules("INFO"), report.format()
    for f in report.findings:  # actionable: each F finding names its node(s), effect, fix, source
        if f.rule.startswith("F"):
            assert f.nodes and f.effect and f.fix and f.source, f
            assert any(n in f.message for n in f.nodes), f


def test_f08_fires_only_on_an_fp8_softmax_output_at_another_scale_than_1_over_448() -> None:
    assert "F08" not in lint(attention_model(FP8), target="trt10-hopper").rules()
    assert "F08" not in lint(attention_model(INT8, 0.97 / 127), target="trt10-hopper").rules()
    report = lint(attention_model(FP8, 0.97 / 448), target="trt10-hopper")
    (f,) = [f for f in report.findings if f.rule == "F08"]
    assert "context" in f.message and "1/448" in f.message and f.severity == "INFO"


def test_fp8_conv_on_hopper_runs_fp8_with_no_finding() -> None:
    report = lint(conv_model(), target="trt10-hopper")
    assert report.verdict == "PASS" and report.fp8_layers == ("conv",)
    assert not {r for r in report.rules() if r.startswith(("F", "H"))}
    assert report.summary["fp8_weighted_layers"] == 1 and report.summary["fp8_flops_percent"] == 100
    assert report.summary["int8_weighted_layers"] == 0
    assert "FP8 weighted layers 1/1 (100% of FLOPs)" in report.format()


def test_fp8_on_an_older_gpu_is_an_error_naming_the_gpu() -> None:
    for target in ("trt10-ampere", "trt10-turing", "trt10-sm75"):
        report = lint(conv_model(), target=target)
        (f01,) = [f for f in report.findings if f.rule == "F01"]
        assert f01.severity == "ERROR" and report.exit_code == 2
        assert "8.9" in f01.message and "FP8 Q/DQ" in f01.message
        assert "require hardware with FP8 support" in f01.effect


def test_mixed_int8_then_fp8_conv_predicts_a_reformat_at_the_boundary() -> None:
    f = F()
    y = f.op("Relu", [f.conv("x", 64, 64, INT8, name="conv_int8")])
    out = f.conv(y, 64, 64, FP8, name="conv_fp8")
    report = lint(f.model([out], (1, 64, 8, 8)), target="trt10-hopper")
    kinds = [(ly.kind, ly.input_precision, ly.output_precision) for ly in report.layers]
    assert kinds == [
        ("qdq", "fp32", INT8),  # the network input's Quantize
        ("weighted", INT8, "fp16"),  # its reader quantizes to FP8: it cannot write INT8
        ("qdq", "fp16", FP8),  # the boundary: a standalone FP8 Quantize (reformat)
        ("weighted", FP8, "fp16"),
    ], report.format(True)
    assert report.layers[1].reason == "its readers quantize to FP8"
    assert report.summary["unfused_qdq"] == 2
    assert report.summary["int8_weighted_layers"] == report.summary["fp8_weighted_layers"] == 1
    boundary = [f for f in report.findings if f.rule == "F05"]
    assert [f.severity for f in boundary] == ["INFO"] and "conv_int8" in boundary[0].message


def test_fp8_then_int8_conv_and_same_format_neighbours() -> None:
    f = F()
    y = f.op("Relu", [f.conv("x", 64, 64, FP8, name="a")])
    out = f.conv(y, 64, 64, INT8, name="b")
    report = lint(f.model([out], (1, 64, 8, 8)), target="trt10-hopper")
    assert [ly.input_precision for ly in report.layers] == ["fp32", FP8, "fp16", INT8]
    f = F()  # FP8 -> FP8: the first conv writes FP8, no reformat between them
    y = f.op("Relu", [f.conv("x", 64, 64, FP8, name="a")])
    out = f.conv(y, 64, 64, FP8, name="b")
    report = lint(f.model([out], (1, 64, 8, 8)), target="trt10-hopper")
    kinds = [(ly.kind, ly.input_precision, ly.output_precision) for ly in report.layers]
    assert kinds == [("qdq", "fp32", FP8), ("weighted", FP8, FP8), ("weighted", FP8, "fp16")]
    assert report.summary["unfused_qdq"] == 1 and report.verdict == "PASS"


def test_fp8_pooling_runs_float_behind_standalone_qdq() -> None:
    """TensorRT's FP8 kernels are GEMM, convolution and MHA: an FP8 MaxPool is not one."""
    f = F()
    y = f.op("Relu", [f.conv("x", 64, 64, FP8, name="a")])
    pool = f.op("MaxPool", [f.qdq(y, FP8)], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    report = lint(
        f.model([f.conv(pool, 64, 64, FP8, name="b")], (1, 64, 8, 8)), target="trt10-hopper"
    )
    assert _layer_of(report, "pool").input_precision == "fp16"
    assert _layer_of(report, "pool").reason == "no FP8 implementation"
    assert _layer_of(report, "b").input_precision == FP8


def test_modelopt_style_dq_without_zero_point_is_fp8() -> None:
    """ModelOpt writes FP8 activation DequantizeLinear nodes with two inputs: the format comes
    from the QuantizeLinear before them."""
    report = lint(conv_model(dq_only=True), target="trt10-hopper")
    dq = [n for n in conv_model(dq_only=True).graph.node if n.op_type == "DequantizeLinear"]
    assert all(len(n.input) == 2 for n in dq)
    assert report.fp8_layers == ("conv",)


def test_v07_fires_for_fp8_below_opset_19_and_names_the_nodes() -> None:
    report = lint(conv_model(opset=17), target="trt10-hopper")
    (v07,) = [f for f in report.findings if f.rule == "V07"]
    assert v07.severity == "ERROR" and "opset >= 19" in v07.message and v07.nodes
    assert not any(f.rule == "V07" for f in lint(conv_model(), target="trt10-hopper").findings)


def test_int8_only_graphs_lint_as_before_whatever_gpu_is_named() -> None:
    """No F rule, no FP8 layer, and the same findings and layers for every GPU (the INT8 path
    does not read the GPU); the INT8 suites (tests/test_lint_*.py) pin the rest."""
    for cid, (build, target, _, _) in CASES.items():
        base = lint(build(), target=target)
        assert not {r for r in base.rules() if r.startswith("F")}, cid
        assert base.summary["fp8_weighted_layers"] == 0 and not base.fp8_layers, cid
        assert all(ly.input_precision != FP8 for ly in base.layers), cid
        for gpu in ("hopper", "ampere"):
            named = lint(build(), target=f"{target}-{gpu}")
            assert named.layers == base.layers and named.summary == base.summary, (cid, gpu)
            assert [  # the messages name the target
                replace(f, message=f.message.replace(named.target, base.target))
                for f in named.findings
            ] == list(base.findings), (cid, gpu)


def test_targets_name_the_gpu_and_keep_the_old_names() -> None:
    assert parse_target("trt10").gpu is None and parse_target("trt10").flags == {"int8", "fp16"}
    hopper = parse_target("trt10.12-hopper")
    assert hopper.version == (10, 12) and hopper.compute_capability == (9, 0)
    assert hopper.flags == {"int8", "fp16", "fp8"} and hopper.runs((8, 9)) is True
    assert parse_target("trt10-sm89").compute_capability == (8, 9)
    assert parse_target("trt10-sm120").compute_capability == (12, 0)
    assert parse_target("trt10-ampere").runs((8, 9)) is False
    assert parse_target("trt10").runs((8, 9)) is None
    assert parse_target("trt10-hopper", flags=["int8", "fp16", "fp8"]).flags >= {"fp8"}
    with pytest.raises(ValueError, match="unknown GPU"):
        parse_target("trt10-pascal2")


# ---------------------------------------------------------------------------------- engines
def _fp8_engine(conv_input: str = "Row major linear FP8 format") -> dict[str, Any]:
    """The resnet18-a100-qat fixture's first two layers (input Quantize, first conv) rewritten as
    an FP8 engine of :func:`conv_model`: trex's ``FP8`` format and weight type, our node names."""
    layers = json.loads((FIXTURES / "resnet18-a100-qat.graph.json").read_text())["Layers"]
    q, conv = copy.deepcopy(layers[0]), copy.deepcopy(layers[1])
    q["Name"] = "quantizelinear8_n"
    q["Outputs"][0]["Format/Datatype"] = "Row major linear FP8 format"
    conv["Name"] = "w1 + quantizelinear4_n + conv"
    conv["Inputs"][0]["Format/Datatype"] = conv_input
    conv["Outputs"][0]["Format/Datatype"] = "Row major linear FP16 format"
    conv["Weights"] = {"Count": 36864, "Type": "FP8" if "FP8" in conv_input else "Int8"}
    conv["Kernel"] = [3, 3]
    return {"Layers": [q, conv], "Bindings": ["x", conv["Outputs"][0]["Name"]]}


def test_engine_layers_reading_fp8_parse_and_compare_like_int8() -> None:
    engine = parse_engine_report(_fp8_engine())
    conv = engine.find("conv")
    assert conv is not None and conv.input_precision == FP8 and conv.weights_dtype == FP8
    assert compute_precision(conv) == FP8
    assert engine.quantized_layers(FP8) == (conv,) and engine.int8_layers() == ()
    assert [x.name for x in engine.qdq_reformats()] == ["quantizelinear8_n"]
    report = lint(conv_model(), target="trt10-hopper")
    diff = diff_engine(report, engine)
    assert diff.matched_by == "name" and not diff.mismatches, diff.format()
    assert diff.compare["fp8_weighted_layers"] == (1, 1)
    assert diff.compare["int8_weighted_layers"] == (0, 0)
    assert diff.compare["unfused_qdq"] == (1, 1)


def test_engine_int8_where_fp8_was_predicted_is_a_disagreement() -> None:
    engine = parse_engine_report(_fp8_engine("Row major Int8 format"))
    diff = diff_engine(lint(conv_model(), target="trt10-hopper"), engine)
    (m,) = diff.mismatches
    assert (m.predicted_input, m.engine_input) == (FP8, INT8) and "differs" in diff.format()


def test_an_fp16_to_fp8_scale_layer_is_a_qdq_reformat() -> None:
    engine = parse_engine_report([{
        "Name": "q_fp8", "LayerType": "Scale", "ParameterType": "Scale",
        "Inputs": [{"Name": "a", "Format/Datatype": "Row major linear FP16 format"}],
        "Outputs": [{"Name": "b", "Format/Datatype": "Row major linear FP8 format"}],
    }])  # fmt: skip
    assert [x.name for x in engine.qdq_reformats()] == ["q_fp8"]


def test_fp8_export_of_concats_and_pointwise_layers_costs_one_quantize_each(tmp_path: Path) -> None:
    """An FP8 plan of YOLOv8's C2f and a RepVGG sum (tests/test_placement_rules.py's _C2f): the
    Concat and the identity branch stay float between FP8 convs (F10), so the linter predicts a
    Quantize after each; its INT8 rules (S02b Concat inputs, P04 quantized and
    float readers, P06 pools) do not ask to quantize a layer that has no FP8 version."""
    import torch

    import qdq
    from qdq import QuantConfig
    from test_placement_rules import _C2f

    x = torch.randn(2, 32, 8, 8)
    counts = {}
    for fmt in ("int8", "fp8"):
        prepared = qdq.prepare(_C2f().eval(), (x,), QuantConfig(format=fmt))
        qdq.calibrate(prepared, [x], method="max", show_progress=False)
        path = tmp_path / f"{fmt}.onnx"
        qdq.export_onnx(prepared, (x[:1],), path, exporter="torchscript")
        report = lint(path, target="trt10-hopper")
        warned = {f.rule for f in report.findings if f.severity != "INFO"}
        assert not {"S02b", "P04", "P06", "P03d"} & warned, report.format()
        counts[fmt] = report.summary["unfused_qdq"]
    # FP8: a Quantize each where a float layer feeds an FP8 conv (the input, the Slice of the
    # split, the Concat, cv2's SiLU read by the float identity BatchNorm too, the sum) and the
    # skip's Dequantize for the bottleneck's fused Add (its output read by the float Concat);
    # the Concat with FP8 inputs cost 3 Dequantize more, the sum's INT8 inputs 2 reformats more
    assert counts["fp8"] <= 6, counts


def test_fp8_export_of_pre_activation_layers_costs_one_quantize_per_fp8_reader(
    tmp_path: Path,
) -> None:
    """DenseNet's pre-activation layers (tests/test_placement_rules.py's _Dense) in FP8: each
    1x1 conv after a float BatchNorm + ReLU takes one Quantize, and nothing else is standalone
    (17 unfused Q/DQ and P05 x6, S02b x3 before the BatchNorm inputs were left float)."""
    import torch

    import qdq
    from qdq import QuantConfig
    from test_placement_rules import _Dense

    x = torch.randn(2, 32, 8, 8)
    prepared = qdq.prepare(_Dense().eval(), (x,), QuantConfig(format="fp8"))
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    path = tmp_path / "fp8.onnx"
    qdq.export_onnx(prepared, (x[:1],), path, exporter="torchscript")
    report = lint(path, target="trt10-hopper")
    assert report.verdict == "PASS", report.format()
    standalone = [
        layer.name for layer in report.layers
        if layer.kind == "qdq" and "network input" not in layer.reason
    ]  # fmt: skip
    assert report.summary["unfused_qdq"] == len(standalone) == 5, standalone
    assert all(name.startswith(("conv1.", "trans_conv.")) for name in standalone), standalone
