"""Export of block-format quantizers in TensorRT's forms (qdq.export.blocks_onnx) and their exact
reference in ONNX Runtime (qdq.backends.blocks_reference), against torch's block_fake_quant."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from block_checks import bits, same, tapped_outputs
from qdq.backends.blocks_reference import needs_reference
from qdq.backends.ort_session import run, session
from qdq.export.blocks_onnx import expand_blocks, has_markers
from qdq.quant.blocks import INT4, MXFP8, NVFP4, block_amax, block_fake_quant
from qdq.quant.onnx_qdq import current_exporter, emit_block, export_mode

FMTS = {"nvfp4": NVFP4, "mxfp8": MXFP8, "int4": INT4}


def _marker_model(shape, fmt, role, amax, axis, block, weight=None):
    """``y = BlockQDQ(x)``: x an input (activation) or an initializer (weight)."""
    inits, inputs = [], []
    if weight is not None:
        inits.append(numpy_helper.from_array(weight.numpy(), "x"))
    else:
        inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)))
    ins = ["x"]
    if amax is not None:
        inits.append(numpy_helper.from_array(np.asarray(amax, np.float32), "amax"))
        ins.append("amax")
    node = helper.make_node("BlockQDQ", ins, ["y"], domain="qdq.internal", name="q/BlockQDQ",
                            format=fmt, axis=axis, block_size=block or 0, role=role)  # fmt: skip
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([node], "g", inputs, [out], inits)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("qdq.internal", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # the exporters' (helper's default is newer than ONNX Runtime reads)
    return model


def _through_ort(model, feeds=()):
    expanded = expand_blocks(model)
    assert not has_markers(expanded)
    onnx.checker.check_model(expanded, full_check=True)
    return expanded, run(session(expanded), list(feeds))[0]


# ---- weights: pre-quantized initializers, bit for bit ----------------------------------------


def _edge_weight(fmt: str) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(8, 64) * torch.logspace(-3, 2, 8).unsqueeze(1)
    w[0, :16] = 0.0  # a zero block
    w[1, :16] = torch.tensor(
        [-0.0, 6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5] + [0.0] * 5
    )
    w[2, :32] = torch.tensor([448.0, 1.0, -0.0, 2.0**-9] * 8)  # E4M3 subnormal codes
    w[3, 16:32] = 3.0  # every value at the block amax
    return w


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4"])
def test_weight_marker_becomes_prequantized_initializers_bit_exact(fmt):
    w = _edge_weight(fmt)
    block = FMTS[fmt].block_size if fmt != "int4" else 32
    bf = FMTS[fmt].with_block_size(block)
    amax = {"nvfp4": w.abs().amax(), "mxfp8": None, "int4": block_amax(w, bf, 1)}[fmt]
    model = _marker_model(w.shape, fmt, "weight", amax, 1, block, weight=w)
    expanded, got = _through_ort(model)
    types = {i.name: i.data_type for i in expanded.graph.initializer}
    want_types = {"nvfp4": {TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT},
                  "mxfp8": {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E8M0},
                  "int4": {TensorProto.INT4, TensorProto.FLOAT}}[fmt]  # fmt: skip
    assert set(types.values()) == want_types
    assert "x" not in types  # the float weight is gone
    assert {n.op_type for n in expanded.graph.node} == {"DequantizeLinear"}
    assert expanded.opset_import[0].version == {"nvfp4": 23, "mxfp8": 24, "int4": 21}[fmt]
    assert same(block_fake_quant(w, bf, amax, 1), got)
    assert needs_reference(expanded) == (fmt != "int4")  # INT4 runs natively in ORT


def test_int4_per_channel_weight():
    w = _edge_weight("int4")
    amax = block_amax(w, INT4.with_block_size(None), 0)
    model = _marker_model(w.shape, "int4", "weight", amax, 0, None, weight=w)
    expanded, got = _through_ort(model)
    dq = expanded.graph.node[0]
    assert {a.name for a in dq.attribute} == {"axis"}
    assert same(block_fake_quant(w, INT4.with_block_size(None), amax, 0), got)


# ---- activations: TensorRT's dynamic quantize, exact reference in ORT -------------------------


def _nvfp4_edges() -> tuple[torch.Tensor, float]:
    """Blocks of 16: ties of the E2M1 grid, saturation, zero blocks, -0, E4M3 block-scale ties."""
    amax = 2688.0  # gs = 1: block scale = e4m3(block_amax / 6)
    rows = [
        [6.0 * v for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 1.0)] + [48.0] * 8,  # ties
        [0.0] * 16,  # zero block
        [-0.0, 0.0] * 8,
        [1e30, -1e30, 1.0] + [0.5] * 13,  # saturates the E4M3 block scale at 448
        [6.0 * 17.0] + [1.0] * 15,  # block_amax / 6 = 17: an E4M3 tie (16 | 18) -> 16
        [6.0 * 19.0] + [-3.0] * 15,  # 19 -> 20 (ties to even mantissa)
        [6.0 * 2.0**-10] + [2.0**-12] * 15,  # a block scale under E4M3's range -> 1.0
        [float("inf")] + [1.0] * 15,
    ]
    x = torch.tensor(rows, dtype=torch.float32).reshape(2, 4, 16).repeat(1, 1, 2)
    return x, amax


def _mx_edges() -> torch.Tensor:
    """Blocks of 32 whose amax is 448·2**e exactly, just above it, and zero/subnormal/inf."""
    rows = []
    for e in range(-140, 120, 3):
        a = 448.0 * 2.0**e
        rows.append([a] + [a * 0.3] * 31)
        rows.append([float(np.nextafter(np.float32(a), np.float32(np.inf)))] + [-a / 3] * 31)
    rows.append([0.0] * 32)
    rows.append([float("inf")] + [1.0] * 31)
    rows.append([2.0**-149] + [0.0] * 31)
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dynamic_quantize_reference_bit_exact_on_edge_cases(fmt):
    if fmt == "nvfp4":
        x, amax = _nvfp4_edges()
        model = _marker_model([2, 4, 32], fmt, "activation", amax, 2, 16)
    else:
        x, amax = _mx_edges(), None
        model = _marker_model(list(x.shape), fmt, "activation", None, 1, 32)
    expanded, got = _through_ort(model, [x])
    ops = [(n.domain, n.op_type) for n in expanded.graph.node]
    dyn = "TRT_FP4DynamicQuantize" if fmt == "nvfp4" else "TRT_MXFP8DynamicQuantize"
    assert ops[0] == ("trt", dyn) and ("trt", 1) in [
        (o.domain, o.version) for o in expanded.opset_import
    ]
    assert same(block_fake_quant(x, FMTS[fmt], amax, -1), got)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dynamic_quantize_random_and_middle_axis(fmt):
    torch.manual_seed(3)
    bs = FMTS[fmt].block_size
    x = torch.randn(3, 2 * bs, 5) * torch.logspace(-4, 4, 5)  # blocked along axis 1, not last
    amax = float(x.abs().max()) * 0.7 if fmt == "nvfp4" else None  # some values saturate
    model = _marker_model(list(x.shape), fmt, "activation", amax, 1, bs)
    _, got = _through_ort(model, [x])
    assert same(block_fake_quant(x, FMTS[fmt], amax, 1), got)


def test_int4_marker_on_a_computed_tensor_is_quantize_dequantize():
    x = torch.randn(4, 64) * 3
    bf = INT4.with_block_size(32)
    amax = block_amax(x, bf, 1) * 0.8
    model = _marker_model(list(x.shape), "int4", "activation", amax, 1, 32)
    expanded, got = _through_ort(model, [x])
    assert [n.op_type for n in expanded.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    assert same(block_fake_quant(x, bf, amax, 1), got)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_non_constant_fp4_mx_weight_is_refused_naming_the_quantizer(fmt):
    model = _marker_model([4, 32], fmt, "weight", 1.0 if fmt == "nvfp4" else None, 1,
                          FMTS[fmt].block_size)  # fmt: skip
    with pytest.raises(ValueError, match=r"quantizer 'q'.*not a constant"):
        expand_blocks(model)


def test_bad_markers_are_refused():
    with pytest.raises(ValueError, match="format 'fp6'"):
        expand_blocks(_marker_model([4, 32], "fp6", "activation", 1.0, 1, 16))
    with pytest.raises(ValueError, match="NVFP4 blocks are 16"):
        expand_blocks(_marker_model([4, 32], "nvfp4", "activation", 1.0, 1, 32))
    with pytest.raises(ValueError, match="needs its amax"):
        expand_blocks(_marker_model([4, 32], "nvfp4", "activation", None, 1, 16))


# ---- both exporters on a module that calls emit_block -----------------------------------------


class _Block(nn.Module):
    def __init__(self, fmt, role, amax, axis, block):
        super().__init__()
        self.fmt, self.role, self.axis, self.block = fmt, role, axis, block
        self.register_buffer("amax", amax)

    def forward(self, x):
        bf = FMTS[self.fmt].with_block_size(self.block)
        amax = self.amax if self.amax.numel() else None

        def value():
            return block_fake_quant(x.detach(), bf, amax, self.axis)

        if current_exporter() is None:
            return value()
        return emit_block(x, amax, self.fmt, self.axis, self.block, self.role, value)


class _Linear(nn.Module):
    def __init__(self, fmt):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(64, 32)
        w, block = self.fc.weight.detach(), {"nvfp4": 16, "mxfp8": 32, "int4": 32}[fmt]
        bf = FMTS[fmt].with_block_size(block)
        wamax = {"nvfp4": w.abs().amax(), "mxfp8": torch.empty(0), "int4": block_amax(w, bf, 1)}
        aamax = {"nvfp4": torch.tensor(2.5), "mxfp8": torch.empty(0)}
        self.wq = _Block(fmt, "weight", wamax[fmt], 1, block)
        self.aq = (
            _Block(fmt, "activation", aamax[fmt], 2, block) if fmt != "int4" else nn.Identity()
        )

    def forward(self, x):
        return nn.functional.linear(self.aq(x), self.wq(self.fc.weight), self.fc.bias)


def _export(model, x, exporter):
    import io

    with export_mode(exporter), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(model, (x,), dynamo=True, opset_version=18).model_proto
        buf = io.BytesIO()
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
        return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4"])
def test_both_exporters_write_the_same_tensorrt_form(fmt, exporter):
    model = _Linear(fmt).eval()
    x = torch.randn(2, 4, 64) * 2
    proto = _export(model, x, exporter)
    assert has_markers(proto)
    proto = expand_blocks(proto)
    onnx.checker.check_model(proto, full_check=True)
    assert not has_markers(proto) and all(o.domain != "qdq.internal" for o in proto.opset_import)
    blocks = sorted(n.op_type for n in proto.graph.node if n.op_type != "DequantizeLinear"
                    and (n.domain == "trt" or n.op_type.endswith("QuantizeLinear")))  # fmt: skip
    assert blocks == {"nvfp4": ["TRT_FP4DynamicQuantize"], "mxfp8": ["TRT_MXFP8DynamicQuantize"],
                      "int4": []}[fmt]  # fmt: skip
    with torch.no_grad():
        want = model(x)
    got = run(session(proto), [x])[0]  # the session rewrites through blocks_reference.runnable
    # E4M3 x E4M3·2**e products and their sums are exact in float32; the others are compared
    # bit for bit at the quantizers (the tests above) and to rounding here (MatMul order)
    if fmt == "mxfp8":
        assert same(want, got)
    else:
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


def test_fp16_weight_is_dequantized_in_float32_and_cast_back():
    w = _edge_weight("nvfp4")[:, :32].half()
    model = _marker_model(w.shape, "nvfp4", "weight", w.float().abs().amax(), 1, 16, weight=w)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    expanded, got = _through_ort(model)
    assert expanded.graph.node[-1].op_type == "Cast"
    want = block_fake_quant(w, NVFP4, w.float().abs().amax(), 1)
    assert np.array_equal(want.numpy().view(np.int16), got.view(np.int16))


def test_runnable_decodes_fp4_and_e8m0_exactly():
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    values = np.concatenate([grid, -grid]).reshape(1, 16)  # all 16 E2M1 codes, -0 included
    e = np.array([2.0**k for k in range(-127, 128)], np.float32).reshape(1, 255)  # every E8M0 code
    inits = [
        numpy_helper.from_array(values.astype(ml_dtypes.float4_e2m1fn), "w"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.ones((1, 510), ml_dtypes.float8_e4m3fn), "ones"),
        numpy_helper.from_array(e.astype(ml_dtypes.float8_e8m0fnu), "s"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "one"], ["y"]),
        helper.make_node("DequantizeLinear", ["ones", "s"], ["z"], axis=1, block_size=2,
                         output_dtype=TensorProto.FLOAT),
    ]  # fmt: skip
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    m = helper.make_model(helper.make_graph(nodes, "g", [], outs, inits),
                          opset_imports=[helper.make_opsetid("", 24)])  # fmt: skip
    m.ir_version = 12
    assert needs_reference(m)
    y, z = run(session(m), [])  # qdq's session rewrites it (ORT has no FP4/E8M0 kernels)
    assert np.array_equal(bits(y), bits(values))
    assert np.array_equal(bits(z), bits(np.repeat(e, 2, axis=1)))


# ---- a prepared model: qdq's quantizers, both exporters, lint, ORT ----------------------------


def _prepared(plan_format):
    import qdq
    from qdq.config import QuantConfig

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()
    x = torch.randn(4, 64)
    m = qdq.prepare(net, (x,), config=QuantConfig(format=plan_format))
    qdq.calibrate(m, [torch.randn(8, 64) for _ in range(2)], show_progress=False)
    return m, x


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("plan_format", ["nvfp4", "mxfp8", "int4w"])
def test_prepared_model_exports_lints_and_matches_torch(plan_format, exporter):
    from qdq.api import quantizers_of
    from qdq.export.attempts import _export_state
    from qdq.export.exporters import run_exporter
    from qdq.export.postprocess import postprocess
    from qdq.lint import lint

    m, x = _prepared(plan_format)
    quantizers = quantizers_of(m)
    with _export_state(m, quantizers, 18 if exporter == "dynamo" else 17, torch.float32):
        proto, order = run_exporter(m, (x,), exporter, 17, True, False)
    proto = expand_blocks(postprocess(proto, order))  # what run_exporters does
    onnx.checker.check_model(proto, full_check=True)
    report = lint(proto, target="trt10.12-blackwell")
    weighted = {ly.name: ly.input_precision for ly in report.layers if ly.kind == "weighted"}
    assert sorted(weighted.values()) == [plan_format] * 2, report.format()
    # every quantizer's output in ORT equals torch's, bit for bit
    outs, want = tapped_outputs(proto, quantizers, m, torch.randn(5, 64) * 2)
    np.testing.assert_allclose(outs[0], want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("plan_format", ["nvfp4", "mxfp8", "int4w"])
def test_export_onnx_writes_the_tensorrt_form(plan_format, exporter, tmp_path):
    import qdq
    from qdq.lint import lint

    m, x = _prepared(plan_format)
    out = qdq.export_onnx(  # verified in ONNX Runtime through blocks_reference.runnable
        m, (x,), tmp_path / "m.onnx", exporter=exporter, verify=True,
        check_inputs=[torch.randn(7, 64)],
    )  # fmt: skip
    saved = onnx.load(str(out.path))
    assert not has_markers(saved)
    doc = json.loads(out.manifest_path.read_text())
    assert doc["opset"] == {"nvfp4": 23, "mxfp8": 24, "int4w": 21}[plan_format]
    report = lint(str(out.path), target="trt10.12-blackwell")
    assert report.summary[f"{plan_format}_weighted_layers"] == 2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_a_nan_makes_its_block_nan_as_in_torch(fmt):
    bs = FMTS[fmt].block_size
    x = torch.randn(2, 2 * bs)
    x[0, 3] = float("nan")
    amax = 10.0 if fmt == "nvfp4" else None
    _, got = _through_ort(_marker_model(list(x.shape), fmt, "activation", amax, 1, bs), [x])
    want = block_fake_quant(x, FMTS[fmt], amax, 1)
    assert int(np.isnan(got).sum()) == bs and same(want, got)


# ---- the manifest ------------------------------------------------------------------------------


@pytest.mark.parametrize("plan_format", ["nvfp4", "mxfp8", "int4w"])
def test_manifest_records_block_quantizers_and_restores_them(plan_format, tmp_path):
    import qdq
    from qdq.api import plan_of, quantizers_of
    from qdq.config import QuantConfig
    from qdq.export.manifest import build_manifest, load_calibration

    m, x = _prepared(plan_format)
    quantizers = quantizers_of(m)
    model = onnx.ModelProto()
    model.opset_import.add().version = 23
    text = build_manifest(plan_of(m), quantizers, model, exporter="dynamo", opset=17)
    doc = json.loads(text)
    assert doc["opset"] == 23  # the file's own opset, not the one asked for
    fmt = "int4" if plan_format == "int4w" else plan_format
    for e in doc["quantizers"]:
        q = quantizers[e["path"]]
        assert (e["format"], e["block_size"], e["axis"], e["role"]) == (
            fmt,
            q.spec.block_size,
            q.spec.axis,
            q.role,
        )
        if fmt == "nvfp4":  # float32 amax / 2688, as block_scales divides
            assert e["scale"] == float(q.amax / torch.tensor(2688.0))
        elif fmt == "mxfp8":
            assert e["scale"] is None
        else:
            assert e["amax_shape"] == list(q.amax.shape) and len(e["scale"]) == q.amax.numel()
    path = tmp_path / "m.manifest.json"
    path.write_text(text)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()
    fresh = qdq.prepare(net, (x,), config=QuantConfig(format=plan_format))
    load_calibration(fresh, path, verify_onnx=False)
    for p, q in quantizers_of(fresh).items():
        if fmt == "mxfp8" and not quantizers[p].is_calibrated:
            continue
        assert torch.equal(q.amax, quantizers[p].amax), p
    bad = json.loads(text)
    bad["quantizers"][-1]["block_size"] = 64
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="block_size=64 in the manifest"):
        load_calibration(fresh, path, verify_onnx=False)
