"""The linter on the acceptance graphs of the rule specification (§8), on real exports, and against
a real TensorRT engine report."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import qdq
from qdq.lint import lint, load_engine_report

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "trt-engines"


class G:
    """A tiny ONNX graph builder (opset 13, NCHW, 64 channels unless told otherwise)."""

    def __init__(self, c: int = 64) -> None:
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.n = 0
        self.c = c
        self.rng = np.random.default_rng(0)

    def _id(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def const(self, value: np.ndarray, p: str = "c") -> str:
        name = self._id(p)
        self.inits[name] = value
        return name

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._id(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def q(self, x: str, scale: float) -> str:
        s, z = self.const(np.float32(scale), "s"), self.const(np.int8(0), "z")
        return self.op("QuantizeLinear", [x, s, z]), s, z  # type: ignore[return-value]

    def qdq(self, x: str, scale: float = 0.02) -> str:
        qo, s, z = self.q(x, scale)  # type: ignore[misc]
        return self.op("DequantizeLinear", [qo, s, z])

    def dq_of(self, q_out: tuple) -> str:
        qo, s, z = q_out
        return self.op("DequantizeLinear", [qo, s, z])

    def conv(self, x: str, cin: int | None = None, cout: int | None = None, k: int = 3, qw: bool = True,
             stride: int = 1, op: str = "Conv") -> str:  # fmt: skip
        cin, cout = cin or self.c, cout or self.c
        shape = (cout, cin, k, k) if op == "Conv" else (cin, cout, k, k)
        w = self.const(self.rng.normal(size=shape).astype(np.float32), "w")
        if qw:
            n = shape[0] if op == "Conv" else shape[1]
            axis = 0 if op == "Conv" else 1
            s = self.const(np.full(n, 0.01, np.float32), "ws")
            z = self.const(np.zeros(n, np.int8), "wz")
            wq = self.op("QuantizeLinear", [w, s, z], axis=axis)
            w = self.op("DequantizeLinear", [wq, s, z], axis=axis)
        pad = (k - 1) // 2 if op == "Conv" else 0
        return self.op(op, [x, w], pads=[pad] * 4, strides=[stride, stride])

    def bn(self, x: str, c: int | None = None) -> str:
        c = c or self.c
        ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
        return self.op(
            "BatchNormalization",
            [x, self.const(ones), self.const(zeros), self.const(zeros), self.const(ones)],
        )

    def model(self, outputs: list[str], shape=(1, 64, 8, 8), opset: int = 13) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()],
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def warned(model, target: str = "trt10") -> set[str]:
    return lint(model, target=target).rules("WARN") | lint(model, target=target).rules("ERROR")


def block_input(g: G) -> str:
    """A previous block's Relu output (INT8-capable producer)."""
    return g.op("Relu", [g.bn(g.conv(g.qdq("x")))])


# ---------------------------------------------------------------- residual blocks
def test_t01_conv_only_block() -> None:
    g = G()
    x = block_input(g)
    y = g.op("Relu", [g.bn(g.conv(g.qdq(g.op("Relu", [g.bn(g.conv(g.qdq(x)))]))))])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(g.qdq(y))), x])])
    y = g.conv(g.qdq(y))
    assert warned(g.model([y])) == {"P03a", "P04"}
    assert lint(g.model([y])).summary["unfused_qdq"] >= 2


def _t02(g: G, skip_mode: str) -> str:
    x = block_input(g)
    qa = g.q(x, 0.02)
    a = g.dq_of(qa)
    h = g.op("Relu", [g.bn(g.conv(a))])
    branch = g.bn(g.conv(g.qdq(h)))
    if skip_mode == "shared":
        skip = g.dq_of(qa)
    elif skip_mode == "other_scale":
        skip = g.qdq(x, 0.05)
    elif skip_mode == "both":
        skip, branch = g.dq_of(qa), g.qdq(branch, 0.03)
    else:  # conv branch only
        skip, branch = x, g.qdq(branch, 0.03)
    y = g.op("Relu", [g.op("Add", [branch, skip])])
    return g.conv(g.qdq(y))


def test_t02_skip_quantized_with_shared_scale_passes() -> None:
    g = G()
    report = lint(g.model([_t02(g, "shared")]))
    assert report.verdict == "PASS", report.format()


def test_t03_both_inputs_and_t03b_conv_branch_only() -> None:
    g = G()
    assert {"P03b", "P02"} <= warned(g.model([_t02(g, "both")]))
    g = G()
    assert {"P03c", "P02", "P04"} <= warned(g.model([_t02(g, "branch")]))


def test_t04_two_scales_on_one_tensor() -> None:
    g = G()
    assert "S01" in warned(g.model([_t02(g, "other_scale")]))


def _t23(g: G, mode: str) -> str:
    x = block_input(g)
    qa = g.q(x, 0.02)
    main = g.bn(g.conv(g.qdq(g.op("Relu", [g.bn(g.conv(g.dq_of(qa), stride=2))]))))
    down = g.bn(g.conv(g.dq_of(qa), k=1, stride=2))
    if mode in ("down", "both"):
        down = g.qdq(down, 0.03)
    if mode in ("main", "both"):
        main = g.qdq(main, 0.04)
    return g.conv(g.qdq(g.op("Relu", [g.op("Add", [main, down])])))


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("down", set()), ("main", set()), ("both", {"P03b"}), ("neither", {"P03a"})],
)
def test_t23_downsample_block(mode: str, expected: set[str]) -> None:
    g = G()
    assert {"P03a", "P03b", "P03c"} & warned(g.model([_t23(g, mode)])) == expected


# -------------------------------------------------------------- concat / maxpool
@pytest.mark.parametrize(
    ("scales", "expected"), [((0.02, 0.05, 0.04), {"S02"}), ((0.04, 0.04, 0.04), set())]
)
def test_t05_concat_scales(scales: tuple[float, float, float], expected: set[str]) -> None:
    g = G()
    p1 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    p2 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    cat = g.op("Concat", [g.qdq(p1, scales[0]), g.qdq(p2, scales[1])], axis=1)
    out = g.conv(g.qdq(cat, scales[2]), cin=128)
    assert {"S02", "S02b"} & warned(g.model([out])) == expected


def test_t05c_concat_with_a_float_input() -> None:
    g = G()
    p1 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    p2 = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    cat = g.op("Concat", [g.qdq(p1), p2], axis=1)
    assert "S02b" in warned(g.model([g.conv(g.qdq(cat), cin=128)]))


@pytest.mark.parametrize(("s_out", "expected"), [(0.05, {"S03"}), (0.02, set())])
def test_t06_maxpool_scales(s_out: float, expected: set[str]) -> None:
    g = G()
    x = block_input(g)
    a = g.conv(g.qdq(x, 0.02))
    b = g.conv(g.qdq(g.op("MaxPool", [x], kernel_shape=[5, 5], pads=[2] * 4), s_out))
    assert {"S03", "P04"} & warned(g.model([a, b])) == expected


# ---------------------------------------------------------------- epilogues
def test_t08_silu_partial_and_t08b_clean() -> None:
    g = G()
    t = g.bn(g.conv(g.qdq("x")))
    u = g.op("Sigmoid", [t])
    y = g.conv(g.qdq(g.op("Mul", [g.qdq(t), u])))
    assert {"P07", "P04"} <= warned(g.model([y]))
    g = G()
    t = g.bn(g.conv(g.qdq("x")))
    y = g.conv(g.qdq(g.op("Mul", [t, g.op("Sigmoid", [t])])))
    assert lint(g.model([y])).verdict == "PASS"


def test_t14_weights_only_and_t15_qdq_before_bn() -> None:
    g = G()
    assert "P01" in warned(g.model([g.conv("x")]))
    g = G()
    y = g.conv(g.qdq(g.op("Relu", [g.bn(g.qdq(g.conv(g.qdq("x"))))])))
    assert "P02" in warned(g.model([y]))


def test_t16_pad_between_qdq_and_conv() -> None:
    g = G()
    pads = g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    assert "P08" in warned(g.model([g.conv(g.qdq(g.op("Pad", ["x", pads])))]))
    g = G()
    pads = g.const(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    assert lint(g.model([g.conv(g.op("Pad", [g.qdq("x"), pads]))])).verdict == "PASS"


@pytest.mark.parametrize(("quantize_gap", "expected"), [(False, {"P06"}), (True, set())])
def test_t17_global_average_pool(quantize_gap: bool, expected: set[str]) -> None:
    g = G()
    h = block_input(g)
    gap = g.op("GlobalAveragePool", [g.qdq(h) if quantize_gap else h])
    flat = g.op("Flatten", [gap])
    w = g.const(np.ones((64, 64), np.float32))
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    y = g.op("Gemm", [g.qdq(flat), wd], transB=1)
    assert {"P06", "P04"} & warned(g.model([y])) == expected


def test_t18_dangling_dq_into_softmax() -> None:
    g = G()
    sm = g.op("Softmax", [g.qdq("x")])
    y = g.op("MatMul", [sm, sm])
    report = lint(g.model([y]))
    assert "P12" in report.rules("WARN") and "P14" in report.rules("INFO")


@pytest.mark.parametrize(("c", "severity"), [(72, "INFO"), (18, "WARN")])
def test_t19_channel_alignment(c: int, severity: str) -> None:
    g = G(c)
    h = g.op("Relu", [g.conv(g.qdq(g.op("Relu", [g.conv(g.qdq("x"), cin=64)])))])
    report = lint(g.model([g.conv(g.qdq(h), cout=128)]))
    assert "H01" in report.rules(severity)


def test_t20_strong_typing_with_fp32_head() -> None:
    g = G()
    head = g.op("Sigmoid", [g.conv(g.qdq("x"))])
    m = g.model([head])
    assert "B02" in lint(m, target="trt11").rules("WARN")
    assert "V11" in lint(m, target="trt11").rules("INFO")
    assert not {"B02", "V11"} & lint(m, target="trt10").rules()


def test_t08c_silu_behind_one_shared_qdq_passes() -> None:
    g = G()
    t = g.bn(g.conv(g.qdq("x")))
    qb = g.q(t, 0.03)
    y = g.conv(g.qdq(g.op("Mul", [g.dq_of(qb), g.op("Sigmoid", [g.dq_of(qb)])])))
    report = lint(g.model([y]))
    assert report.verdict == "PASS", report.format()
    assert "P07" in report.rules("INFO")


# ------------------------------------------------------- real exports + engine
def _export(model: torch.nn.Module, tmp: Path, config: qdq.QuantConfig | None = None) -> Path:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    prepared = qdq.prepare(model.eval(), (x,), config)
    qdq.calibrate(prepared, [x], method="max", show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return qdq.export_onnx(prepared, (x[:1],), tmp / "m.onnx", exporter="torchscript").path


def test_naive_resnet18_prediction_matches_the_real_engine(tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    if not FIXTURES.is_dir():
        pytest.skip(f"engine fixtures not found at {FIXTURES}")
    # the fixture engine's ONNX: Q/DQ on conv inputs and weights only (residual + GAP float)
    naive = qdq.QuantConfig.tensorrt(disable=("residual", "pooling", "performance"))
    report = lint(_export(tv.resnet18(), tmp_path, naive))
    engine = load_engine_report(FIXTURES / "resnet18-a100-qat.graph.json")
    assert report.summary["weighted_layers"] == len(engine.weighted_layers()) == 21
    int8_engine = [lay for lay in engine.weighted_layers() if lay.input_precision == "int8"]
    assert report.summary["int8_weighted_layers"] == len(int8_engine) == 21
    assert report.summary["unfused_qdq"] == len(engine.qdq_reformats()) == 10
    assert [f.rule for f in report.findings].count("P03a") == 8  # every residual Add falls back
    assert "P06" in report.rules("WARN")


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "yolo_style"])
def test_default_placement_lints_clean(name: str, tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    if name == "yolo_style":
        from models.yolo import YoloStyleNet

        model = YoloStyleNet()
    else:
        model = getattr(tv, name)()
    report = lint(_export(model, tmp_path))
    assert report.verdict == "PASS", report.format()
    if name == "resnet18":
        assert report.summary["unfused_qdq"] == 1  # only the network-input Quantize (P13)


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    g = G()
    clean = tmp_path / "clean.onnx"
    onnx.save(g.model([g.conv(g.qdq("x"))]), str(clean))
    g = G()
    warn = tmp_path / "warn.onnx"
    onnx.save(g.model([g.conv("x")]), str(warn))
    bad = tmp_path / "bad.onnx"
    onnx.save(_bad_model(), str(bad))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qdq", "lint", *args], capture_output=True, text=True
        )

    assert run(str(clean)).returncode == 0
    assert run(str(warn)).returncode == 1
    assert run(str(bad)).returncode == 2
    doc = json.loads(run(str(warn), "--json").stdout)
    assert {"findings", "summary"} <= doc.keys()
    assert {"weighted_layers", "int8_weighted_layers", "unfused_qdq", "float_islands"} <= doc[
        "summary"
    ].keys()
    assert {"rule", "severity", "nodes", "message", "fix"} <= doc["findings"][0].keys()
    missing = run(str(tmp_path / "missing.onnx"))
    assert missing.returncode == 3 and "no ONNX file" in missing.stderr


def _bad_model() -> onnx.ModelProto:
    g = G()
    x = g.op("QuantizeLinear", ["x", g.const(np.float32(0.1)), g.const(np.uint8(128))])
    return g.model([x])


@pytest.mark.parametrize(("b", "expected"), [(0.05, "S03"), (None, None)])
def test_t07_conv_relu_maxpool(b: float | None, expected: str | None) -> None:
    g = G()
    h = g.op("Relu", [g.conv(g.qdq("x"), cin=3, k=7, stride=2)])
    if b is not None:
        h = g.qdq(h, b)
    pooled = g.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2])
    report = lint(g.model([g.conv(g.qdq(pooled, 0.02))], shape=(1, 3, 32, 32)))
    assert {"P13", "H02"} <= report.rules("INFO")
    warn = report.rules("WARN")
    assert (expected in warn) if expected else report.verdict == "PASS", report.format()


@pytest.mark.parametrize("group", [1, 2])
def test_t09_conv_transpose_relu(group: int) -> None:
    g = G()
    y = g.op("Relu", [g.conv(g.qdq("x"), cin=64, cout=32, k=2, op="ConvTranspose")])
    model = g.model([g.conv(g.qdq(y), cin=32)])
    if group == 2:
        node = next(n for n in model.graph.node if n.op_type == "ConvTranspose")
        node.attribute.append(helper.make_attribute("group", 2))
    report = lint(model)
    assert {"V12", "P09"} <= report.rules("WARN")
    v12 = next(f for f in report.findings if f.rule == "V12")
    assert ("grouped" in v12.message) == (group == 2)
