"""Engine time from a Q/DQ ONNX (issue 58): the linter's predicted engine as the time model's
layers (shapes, MACs, bytes, builder reformats), the Q/DQ-stripped FP16 build, and the predicted
speed-up, on tiny graphs built with onnx.helper and on qdq's own ResNet-18 export."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lint_graphs import G
from qdq.lint import lint
from qdq.lint.graph import LintGraph
from qdq.lint.predict import predict_layers
from qdq.lint.speed.latency import predict_latency
from qdq.lint.speed.onnx_layers import cost_layers, engine_layers, strip_qdq

BATCH = (32, 64, 56, 56)  # ResNet-18's layer1 at batch 32


def _float_layers(model: onnx.ModelProto, shapes: dict | None = None) -> list:
    return cost_layers(model, predict_layers(LintGraph(model), "fp16"), shapes=shapes)


def _one(layers: list, op: str):
    found = [c for c in layers if c.op == op]
    assert len(found) == 1, [c.name for c in layers]
    return found[0]


def _model(nodes: list, inputs: list, outputs: list, inits: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "t", inputs, outputs,
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# ------------------------------------------------------------------ work and bytes
def test_grouped_quantized_conv_counts_by_hand() -> None:
    g = G(c=16)
    w = g.const(np.ones((32, 8, 3, 3), np.float32), "w")  # 2 groups of 8 input channels
    s, z = g.const(np.full(32, 0.01, np.float32)), g.const(np.zeros(32, np.int8))
    wq = g.op("QuantizeLinear", [w, s, z], axis=0)
    wd = g.op("DequantizeLinear", [wq, s, z], axis=0)
    y = g.op("Conv", [g.qdq("x"), wd], pads=[1, 1, 1, 1], strides=[2, 2], group=2)
    model = g.model([y], shape=(2, 16, 10, 10))
    layers = cost_layers(model, lint(model).layers)
    conv = _one(layers, "conv")
    # N·Cout·Hout·Wout·Cin/groups·kh·kw; the GEMM per group: N·Hout·Wout x Cout/groups x Cin/groups·9
    assert conv.macs == 2 * 32 * 5 * 5 * 8 * 9
    assert conv.gemm == (2 * 5 * 5, 16, 8 * 9) and conv.groups == 2 and conv.group_channels == 8
    assert conv.precision == "int8"
    assert conv.read_bytes == 2 * 16 * 10 * 10  # INT8 activation
    assert conv.write_bytes == 2 * 32 * 5 * 5 * 2  # FP16 output (a graph output: float)
    assert conv.weight_bytes == 32 * 8 * 9  # INT8 weights
    q = _one(layers, "qdq")  # the network input's Quantize reads FP32, writes INT8
    assert (q.read_bytes, q.write_bytes) == (2 * 16 * 100 * 4, 2 * 16 * 100)
    out = _one(layers, "reformat")  # the FP16 output written as the ONNX's FP32
    assert out.name.startswith("Reformatting CopyNode for Output Tensor 0 to ")
    assert (out.read_bytes, out.write_bytes) == (2 * 32 * 25 * 2, 2 * 32 * 25 * 4)


def test_gemm_and_matmul_counts_by_hand() -> None:
    w, b = np.ones((32, 64), np.float32), np.zeros(32, np.float32)
    gemm = _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        {"w": w, "b": b},
    )
    fc = _one(_float_layers(gemm), "gemm")
    assert fc.macs == 4 * 32 * 64 and fc.gemm == (4, 32, 64)
    assert (fc.read_bytes, fc.write_bytes) == (4 * 64 * 2, 4 * 32 * 2)
    assert fc.weight_bytes == (32 * 64 + 32) * 2  # FP16 weights and bias in an FP16 build

    weighted = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 10, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        {"w": np.ones((64, 32), np.float32)},
    )
    proj = _one(_float_layers(weighted), "gemm")  # one GEMM over batch x tokens
    assert proj.macs == 2 * 10 * 64 * 32 and proj.gemm == (20, 32, 64) and proj.groups == 1

    batched = _model(  # scores = a @ aᵀ per batch and head: two activations, no weights
        [helper.make_node("Transpose", ["a"], ["at"], perm=[0, 1, 3, 2], name="t"),
         helper.make_node("MatMul", ["a", "at"], ["s"], name="scores")],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4, 8, 16])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        {},
    )  # fmt: skip
    scores = _one(_float_layers(batched), "gemm")
    assert scores.macs == 2 * 4 * 8 * 8 * 16 and scores.gemm == (8, 8, 16)
    assert scores.groups == 2 * 4 and scores.weight_bytes == 0
    assert scores.read_bytes == 2 * (2 * 4 * 8 * 16) * 2


def test_network_input_reformat_in_the_fp16_build_not_behind_a_quantize() -> None:
    g = G()
    model = g.model([g.conv(g.qdq("x"))], shape=(1, 64, 8, 8))
    stripped = _float_layers(strip_qdq(model))
    first = stripped[0]  # the FP32 network input read by an FP16 conv
    assert first.op == "reformat" and first.name.startswith("Reformatting CopyNode for Input")
    assert (first.read_bytes, first.write_bytes) == (64 * 64 * 4, 64 * 64 * 2)
    assert [c.op for c in stripped] == ["reformat", "conv", "reformat"]
    quantized = cost_layers(model, lint(model).layers)  # the Quantize converts FP32 itself
    assert [c.op for c in quantized] == ["qdq", "conv", "reformat"]


def test_dynamic_batch_needs_a_shape() -> None:
    g = G()
    model = g.model([g.conv(g.qdq("x"))], shape=("N", 64, 8, 8))  # type: ignore[arg-type]
    layers = lint(model).layers
    with pytest.raises(ValueError, match=r"'x'.*dynamic.*'N'.*--shape x:1x64x8x8"):
        cost_layers(model, layers)
    one = _one(cost_layers(model, layers, shapes={"x": [1, 64, 8, 8]}), "conv")
    many = _one(cost_layers(model, layers, shapes={"x": (32, 64, 8, 8)}), "conv")
    assert many.macs == 32 * one.macs == 32 * 64 * 64 * 64 * 9
    with pytest.raises(ValueError, match="'y', which is no input"):
        cost_layers(model, layers, shapes={"y": (1, 64, 8, 8)})
    with pytest.raises(ValueError, match="3 dims given, the input has 4"):
        cost_layers(model, layers, shapes={"x": (1, 64, 8)})
    with pytest.raises(ValueError, match="positive"):
        cost_layers(model, layers, shapes={"x": (0, 64, 8, 8)})


def test_a_static_batch_can_be_overridden() -> None:
    g = G()
    model = g.model([g.conv(g.qdq("x"))], shape=(1, 64, 8, 8))
    layers = lint(model).layers
    one, many = (
        _one(cost_layers(model, layers, shapes=s), "conv") for s in (None, {"x": (8, 64, 8, 8)})
    )
    assert many.macs == 8 * one.macs and many.read_bytes == 8 * one.read_bytes


# ------------------------------------------------------------------ the FP16 build
def test_strip_qdq_gives_an_all_fp16_engine() -> None:
    g = G()
    x = g.op("Relu", [g.bn(g.conv(g.qdq("x")))])
    qa = g.q(x, 0.02)
    h = g.op("Relu", [g.bn(g.conv(g.dq_of(qa)))])
    y = g.op("Relu", [g.op("Add", [g.bn(g.conv(g.qdq(h))), g.dq_of(qa)])])
    w8 = g.const(
        np.arange(-8, 8, dtype=np.int8).reshape(16, 1, 1, 1) * np.ones((1, 64, 1, 1), np.int8)
    )
    scale = g.const(np.full(16, 0.5, np.float32))
    wd = g.op("DequantizeLinear", [w8, scale, g.const(np.zeros(16, np.int8))], axis=0)
    model = g.model([g.op("Conv", [g.qdq(y), wd])], shape=(1, 64, 8, 8))
    stripped = strip_qdq(model)
    assert not {n.op_type for n in stripped.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    onnx.shape_inference.infer_shapes(stripped, strict_mode=True)
    layers = predict_layers(LintGraph(stripped), "fp16")
    assert layers and all(ly.kind != "qdq" for ly in layers)
    assert {(ly.input_precision, ly.output_precision) for ly in layers} == {("fp16", "fp16")}
    # the pre-quantized INT8 weight became its dequantized float values, under the DQ's name
    last = stripped.graph.node[-1]
    value = numpy_helper.to_array(
        next(t for t in stripped.graph.initializer if t.name == last.input[1])
    )
    assert value.dtype == np.float32 and value[:, 0, 0, 0].tolist() == [
        0.5 * v for v in range(-8, 8)
    ]
    assert len(model.graph.node) > len(stripped.graph.node)  # the input model is unchanged


# ------------------------------------------------------------------ the key property
def _resnet_stage(residual: bool) -> onnx.ModelProto:
    """A ResNet-18 stem (7x7 conv on RGB, max pool) and two basic blocks at batch 32 on
    224x224. ``residual=False``: Q/DQ on conv inputs and weights only, the residual Adds read
    float; ``True``: the Add's skip input shares the block's input Quantize (qdq's default)."""
    g = G()
    x = g.op("Relu", [g.bn(g.conv(g.qdq("x"), cin=3, k=7, stride=2))])
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = g.op("MaxPool", [g.qdq(x) if residual else x], **pool)
    for _ in range(2):
        if residual:
            qa = g.q(x, 0.02)
            a, skip = g.dq_of(qa), g.dq_of(qa)
        else:
            a, skip = g.qdq(x), x
        h = g.op("Relu", [g.bn(g.conv(a))])
        x = g.op("Relu", [g.op("Add", [g.bn(g.conv(g.qdq(h))), skip])])
    return g.model([g.conv(g.qdq(x))], shape=(32, 3, 224, 224))


def test_conv_only_qdq_does_not_pay_and_a_quantized_residual_does() -> None:
    naive = predict_latency(_resnet_stage(False), target="trt10", gpu="a100")
    good = predict_latency(_resnet_stage(True), target="trt10", gpu="a100")
    print(f"\nconv-only {naive.total_ms:.4f} ms, residual quantized {good.total_ms:.4f} ms, "
          f"FP16 {naive.fp16_total_ms:.4f} ms")  # fmt: skip
    assert naive.fp16_total_ms == pytest.approx(good.fp16_total_ms)  # the same FP16 build
    qdq_layers = [ly for ly in naive.layers if ly.op == "qdq"]
    # the network input's, the float max pool's output's and each block's after its float Add
    assert len(qdq_layers) == 4
    assert [ly.op for ly in good.layers].count("qdq") == 1  # the network input only
    assert naive.speedup_vs_fp16 <= 1.0 < good.speedup_vs_fp16
    assert good.total_ms < naive.total_ms
    assert naive.not_paying and all(n.quantized_ms > n.fp16_ms for n in naive.not_paying)


def test_report_totals_json_and_text() -> None:
    report = predict_latency(_resnet_stage(False), target="trt10", gpu="A100")
    assert report.total_ms == pytest.approx(sum(ly.ms for ly in report.layers))
    assert report.fp16_total_ms == pytest.approx(sum(ly.ms for ly in report.fp16_layers))
    assert report.speedup_vs_fp16 == pytest.approx(report.fp16_total_ms / report.total_ms)
    doc = json.loads(json.dumps(report.to_dict()))
    assert {"total_ms", "fp16_total_ms", "speedup_vs_fp16", "gpu", "layers", "not_paying"} <= set(
        doc
    )
    assert doc["gpu"] == "a100-sxm4-40gb"
    assert set(doc["layers"][0]) == {"name", "type", "precision", "ms"}
    assert {ly["type"] for ly in doc["layers"]} >= {"qdq", "conv", "pool", "reformat"}
    text = report.format()
    assert "FP16 build" in text and "slower than FP16" in text and "does not pay" in text
    assert all(ly.op != "qdq" for ly in report.fp16_layers)


def test_the_gpu_comes_from_the_target() -> None:
    named = predict_latency(_resnet_stage(True), target="trt10-a100")
    assert named.gpu == "a100-sxm4-40gb" and named.gpu_note == ""
    generation = predict_latency(_resnet_stage(True), target="trt10-ampere")
    assert generation.gpu_note and generation.gpu_note in generation.format()
    assert generation.to_dict()["gpu_note"] == generation.gpu_note


def test_no_gpu_named_is_refused() -> None:
    with pytest.raises(ValueError, match="names no GPU.*--gpu"):
        predict_latency(_resnet_stage(True), target="trt10")
    with pytest.raises(ValueError, match="unknown GPU"):
        predict_latency(_resnet_stage(True), target="trt10", gpu="a1000")


def test_engine_layers_know_their_sources() -> None:
    model = _resnet_stage(False)
    found = engine_layers(model, lint(model).layers)
    for k, e in enumerate(found):
        assert all(s < k for s in e.sources) and e.sized
    quantize = [k for k, e in enumerate(found) if e.kind == "qdq"][1]  # a block's input Quantize
    readers = [e for e in found if quantize in e.sources]
    assert [e.kind for e in readers] == ["weighted"] and readers[0].quantized


# ------------------------------------------------------------------ qdq's own ResNet-18
@pytest.mark.slow  # two exports of ResNet-18 (~5 s each after torch's import)
def test_resnet18_default_export_beats_conv_only(tmp_path: Path) -> None:
    tv = pytest.importorskip("torchvision.models")
    import torch

    import qdq

    paths = {}
    for name, config in (
        ("default", None),
        ("conv-only", qdq.QuantConfig.tensorrt(disable=("residual", "pooling", "performance"))),
    ):
        torch.manual_seed(0)
        x = torch.randn(2, 3, 64, 64)  # exported small; timed at batch 32 on 224x224
        prepared = qdq.prepare(tv.resnet18().eval(), (x,), config)
        qdq.calibrate(prepared, [x], method="max", show_progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = tmp_path / f"{name}.onnx"
            paths[name] = qdq.export_onnx(prepared, (x[:1],), out, exporter="torchscript").path
    found = {}
    for name, path in paths.items():
        model = onnx.load(str(path))
        shapes = {model.graph.input[0].name: (32, 3, 224, 224)}
        found[name] = predict_latency(path, target="trt10", gpu="a100", shapes=shapes)
        r = found[name]
        print(f"\nResNet-18 {name}: {r.total_ms:.3f} ms vs FP16 {r.fp16_total_ms:.3f} ms, "
              f"{r.speedup_vs_fp16:.2f}x")  # fmt: skip
    default, naive = found["default"], found["conv-only"]
    assert default.speedup_vs_fp16 > 1.0 and default.total_ms < naive.total_ms
    # the aims against the real A100 engines: the default placement ~1.5x over FP16
    # (1.017 / 0.67 ms) within 15 %, conv-only Q/DQ (really 0.93x) predicted no faster than FP16
    assert default.speedup_vs_fp16 == pytest.approx(1.017 / 0.67, rel=0.15)
    assert naive.speedup_vs_fp16 <= 1.0
    # the 3-channel stem runs a CUDA-core INT8 kernel writing FP32: its MaxPool runs FP32
    pool = next(ly for ly in naive.layers if ly.op == "pool")
    assert pool.precision == "fp32"
    assert [ly.op for ly in naive.layers].count("qdq") == 10  # as the real engine's 10
    assert [ly.op for ly in default.layers].count("qdq") == 1


def test_fused_int8_attention_counts_both_products() -> None:
    g = G()

    def qdq(x: str) -> str:
        return g.qdq(x, 0.05)

    kt = g.op("Transpose", ["k"], perm=[0, 1, 3, 2])
    probs = g.op("Softmax", [g.op("MatMul", [qdq("q"), qdq(kt)])], axis=-1)
    out = g.op("MatMul", [qdq(probs), qdq("v")])
    dims = [2, 4, 16, 32]  # batch, heads, tokens, head size
    model = _model(
        g.nodes,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "qkv"],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.inits,
    )
    layers = cost_layers(model, lint(model).layers)
    core = _one(layers, "attention")
    assert core.precision == "int8"
    assert core.macs == 2 * 4 * 16 * 16 * 32 + 2 * 4 * 16 * 32 * 16  # scores + context
    assert core.gemm == (16, 16, 32) and core.groups == 2 * 4
    assert core.read_bytes == 3 * 2 * 4 * 16 * 32  # q, k, v in INT8
    assert core.write_bytes == 2 * 4 * 16 * 32 * 2  # the context in FP16 (a graph output)
    assert [c.op for c in layers].count("qdq") == 3  # the network inputs' Quantize nodes


def test_a_layer_with_a_quantized_output_counts_the_quantize_it_would_need_in_fp16() -> None:
    # the stem of qdq's default placement writes INT8 for the quantized MaxPool: run FP16, it
    # would need a standalone Quantize of its 64x112x112 output, which the comparison counts
    g = G(c=3)
    w = g.const(np.ones((64, 3, 7, 7), np.float32) * 0.01, "w")
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    y = g.op("Relu", [g.op("Conv", [g.qdq("x"), wd], pads=[3, 3, 3, 3], strides=[2, 2])])
    p = g.op("MaxPool", [g.qdq(y)], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    model = g.model([p], shape=(32, 3, 224, 224))
    report = predict_latency(model, target="trt10-a100")
    stem = next(ly for ly in report.layers if ly.op == "conv")
    assert stem.precision == "int8" and all(n.name != stem.name for n in report.not_paying)


def test_k07_a_cuda_core_int8_stem_writes_fp32_and_its_float_maxpool_runs_fp32() -> None:
    g = G(c=3)
    w = g.const(np.ones((64, 3, 7, 7), np.float32) * 0.01, "w")
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    y = g.op("Relu", [g.op("Conv", [g.qdq("x"), wd], pads=[3, 3, 3, 3], strides=[2, 2])])
    p = g.op("MaxPool", [y], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])  # float
    model = g.model([p], shape=(2, 3, 64, 64))
    layers = {x.op: x for x in cost_layers(model, lint(model).layers)}
    assert layers["conv"].precision == "int8" and layers["conv"].out_precision == "fp32"
    assert layers["pool"].precision == "fp32"
    # with 64 input channels the tensor-core kernel writes FP16 as predicted
    g = G(c=64)
    w = g.const(np.ones((64, 64, 3, 3), np.float32) * 0.01, "w")
    s, z = g.const(np.full(64, 0.01, np.float32)), g.const(np.zeros(64, np.int8))
    wd = g.op("DequantizeLinear", [g.op("QuantizeLinear", [w, s, z], axis=0), s, z], axis=0)
    y = g.op("Relu", [g.op("Conv", [g.qdq("x"), wd], pads=[1, 1, 1, 1])])
    p = g.op("MaxPool", [y], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    model = g.model([p], shape=(2, 64, 16, 16))
    layers = {x.op: x for x in cost_layers(model, lint(model).layers)}
    assert layers["conv"].out_precision == "fp16" and layers["pool"].precision == "fp16"
