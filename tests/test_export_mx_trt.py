"""MXFP8 in TensorRT's form (``block_form="trt"``, qdq.export.blocks_trt): TensorRT Model
Optimizer's ``trt::TRT_MXFP8DequantizeLinear`` of UINT8 exponents at opset 19, which TensorRT
10.12's parser reads. The same codes as ONNX's form bit for bit, ONNX Runtime (through
qdq.backends.blocks_reference) equal to torch per quantizer, the linter's MXFP8 layers without
an opset error, the manifest's record, and the job choosing the form by its target."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from block_checks import same, tapped_outputs
from qdq.backends.ort_session import run, session
from qdq.export.blocks_onnx import expand_blocks, has_markers
from qdq.quant.blocks import MXFP8, block_fake_quant

pytest.importorskip("onnxruntime")

_MX_DQ = "TRT_MXFP8DequantizeLinear"


def _marker(x: torch.Tensor, role: str, axis: int) -> onnx.ModelProto:
    """``y = BlockQDQ(x)`` of MXFP8: ``x`` an initializer (weight) or an input (activation)."""
    inits, inputs = [], []
    if role == "weight":
        inits.append(numpy_helper.from_array(x.numpy(), "x"))
    else:
        inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)))
    node = helper.make_node("BlockQDQ", ["x"], ["y"], domain="qdq.internal", name="q/BlockQDQ",
                            format="mxfp8", axis=axis, block_size=32, role=role)  # fmt: skip
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("qdq.internal", 1)]
    model = helper.make_model(helper.make_graph([node], "g", inputs, [out], inits),
                              opset_imports=opsets)  # fmt: skip
    model.ir_version = 8
    return model


def _edges() -> torch.Tensor:
    """Blocks of 32 with E4M3 ties and subnormals, saturation, a zero block, -0, tiny and huge
    block scales (E8M0 exponents near both ends)."""
    torch.manual_seed(0)
    w = torch.randn(6, 64) * torch.logspace(-30, 30, 6).unsqueeze(1)
    w[0, :32] = 0.0
    w[1, :32] = torch.tensor([448.0, 1.0, -0.0, 2.0**-9, 1.0625, 1.1875, -3.25, 0.5] * 4)
    w[2, 32:] = 3.0
    return w


def _inits(m: onnx.ModelProto) -> dict[int, np.ndarray]:
    return {i.data_type: numpy_helper.to_array(i) for i in m.graph.initializer}


def test_weight_in_tensorrt_form_has_the_onnx_forms_codes_bit_for_bit():
    w = _edges()
    onnx_form = expand_blocks(_marker(w, "weight", 1))
    trt = expand_blocks(_marker(w, "weight", 1), "trt")
    onnx.checker.check_model(trt, full_check=True)
    assert [(n.domain, n.op_type, n.name) for n in trt.graph.node] == [
        ("trt", _MX_DQ, "q/DequantizeLinear")
    ]
    attrs = {a.name: helper.get_attribute_value(a) for a in trt.graph.node[0].attribute}
    assert attrs == {"axis": -1, "block_size": 32, "output_dtype": TensorProto.FLOAT}
    assert trt.opset_import[0].version == 19 and trt.ir_version >= 9
    assert {(o.domain, o.version) for o in trt.opset_import} == {("", 19), ("trt", 1)}
    ours, theirs = _inits(trt), _inits(onnx_form)
    assert set(ours) == {TensorProto.FLOAT8E4M3FN, TensorProto.UINT8}
    e4m3 = TensorProto.FLOAT8E4M3FN
    assert np.array_equal(ours[e4m3].view(np.uint8), theirs[e4m3].view(np.uint8))
    # the exponent bytes are the FLOAT8E8M0 scales' bits, the full range of them used here
    e8m0 = theirs[TensorProto.FLOAT8E8M0].view(np.uint8)
    assert np.array_equal(ours[TensorProto.UINT8], e8m0)
    assert ours[TensorProto.UINT8].min() < 40 and ours[TensorProto.UINT8].max() > 200
    got = run(session(trt), [])[0]  # through blocks_reference.runnable: 2**(byte - 127)
    assert same(block_fake_quant(w, MXFP8, None, 1), got)


@pytest.mark.parametrize("axis", [1, 0])
def test_activation_in_tensorrt_form_equals_torch(axis):
    x = _edges() if axis == 1 else _edges().T.contiguous()
    x[4, 5 if axis == 1 else 0] = float("nan")  # a NaN block
    model = expand_blocks(_marker(x, "activation", axis), "trt")
    onnx.checker.check_model(model, full_check=True)
    ops = [(n.domain, n.op_type) for n in model.graph.node]
    assert ops == [("trt", "TRT_MXFP8DynamicQuantize"), ("trt", _MX_DQ)]
    dyn, dq = model.graph.node
    assert list(dq.input) == list(dyn.output)  # the dynamic quantize's values and exponents
    assert dq.name == "q/DequantizeLinear" and model.graph.initializer == []
    got = run(session(model), [x])[0]
    assert same(block_fake_quant(x, MXFP8, None, axis), got)


def test_fp16_weight_is_cast_back():
    w = _edges()[:, :32].clamp(-6e4, 6e4).half()
    model = _marker(w, "weight", 1)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    trt = expand_blocks(model, "trt")
    assert [n.op_type for n in trt.graph.node] == [_MX_DQ, "Cast"]
    got = run(session(trt), [])[0]
    want = block_fake_quant(w, MXFP8, None, 1)
    assert np.array_equal(want.numpy().view(np.int16), got.view(np.int16))


def test_unknown_block_form_is_refused_naming_it():
    with pytest.raises(ValueError, match="block_form must be one of 'onnx', 'trt'.*'TRT'"):
        expand_blocks(_marker(_edges(), "weight", 1), "TRT")


# ---- a prepared model: both exporters, ORT == torch per quantizer, lint ----------------------


def _prepared(seed: int = 0):
    import qdq
    from qdq.config import QuantConfig

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).eval()
    x = torch.randn(4, 64)
    m = qdq.prepare(net, (x,), config=QuantConfig(format="mxfp8"))
    qdq.calibrate(m, [torch.randn(8, 64) for _ in range(2)], show_progress=False)
    return m, x


def _traced(m, x, exporter):
    from qdq.api import quantizers_of
    from qdq.export.attempts import _export_state
    from qdq.export.exporters import run_exporter
    from qdq.export.postprocess import postprocess

    with _export_state(m, quantizers_of(m), 18 if exporter == "dynamo" else 17, torch.float32):
        proto, order = run_exporter(m, (x,), exporter, 17, True, False)
    return postprocess(proto, order)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_both_exporters_write_tensorrt_form_equal_to_torch_per_quantizer(exporter):
    from qdq.api import quantizers_of
    from qdq.lint import lint

    m, x = _prepared()
    quantizers = quantizers_of(m)
    traced = _traced(m, x, exporter)
    assert has_markers(traced)
    theirs = expand_blocks(onnx.ModelProto.FromString(traced.SerializeToString()))
    proto = expand_blocks(traced, "trt")
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 19 and theirs.opset_import[0].version == 24
    kinds = sorted((n.domain, n.op_type) for n in proto.graph.node if n.domain == "trt")
    assert kinds == [("trt", _MX_DQ)] * 4 + [("trt", "TRT_MXFP8DynamicQuantize")] * 2
    assert not [n for n in proto.graph.node if n.op_type in ("DequantizeLinear", "QuantizeLinear")]
    assert TensorProto.FLOAT8E8M0 not in {i.data_type for i in proto.graph.initializer}
    # the weights' codes: the onnx form's E4M3 values, exponent bytes its E8M0 bits
    for q in ("0.weight_quantizer", "2.weight_quantizer"):
        a = {i.data_type: numpy_helper.to_array(i).view(np.uint8) for i in proto.graph.initializer
             if i.name.startswith(q)}  # fmt: skip
        b = {i.data_type: numpy_helper.to_array(i).view(np.uint8)
             for i in theirs.graph.initializer if i.name.startswith(q)}  # fmt: skip
        assert np.array_equal(a[TensorProto.FLOAT8E4M3FN], b[TensorProto.FLOAT8E4M3FN])
        assert np.array_equal(a[TensorProto.UINT8], b[TensorProto.FLOAT8E8M0])
    # every quantizer's output in ORT equals torch's, bit for bit
    outs, want = tapped_outputs(proto, quantizers, m, torch.randn(5, 64) * 2)
    assert same(want, outs[0])  # E4M3 x E4M3·2**e products and sums are exact in float32
    report = lint(proto, target="trt10.12-blackwell")
    assert report.summary["mxfp8_weighted_layers"] == 2, report.format()
    assert {f.severity for f in report.findings} <= {"INFO"}, report.format()
    onnx_form = lint(theirs, target="trt10.12-blackwell")  # the reason for the form
    assert "V07" in {f.rule for f in onnx_form.findings}


# ---- export_onnx: the argument, the manifest, a round trip -----------------------------------


def test_export_onnx_records_the_form_and_a_round_trip_restores_it(tmp_path):
    import qdq
    from qdq.export.manifest_blocks import block_form_of

    m, x = _prepared()
    out = qdq.export_onnx(m, (x,), tmp_path / "m.onnx", exporter="torchscript",
                          verify=True, check_inputs=[torch.randn(7, 64)], block_form="trt")  # fmt: skip
    assert (out.opset, out.block_form, out.num_quantize, out.num_dequantize) == (19, "trt", 0, 4)
    doc = json.loads(out.manifest_path.read_text())
    assert doc["block_form"] == "trt" and doc["opset"] == 19
    assert block_form_of(out.manifest_path) == "trt"
    nodes = {e["path"]: e["onnx_nodes"] for e in doc["quantizers"]}
    assert nodes["0.input_quantizer"] == ["0.input_quantizer/TRT_MXFP8DynamicQuantize",
                                          "0.input_quantizer/DequantizeLinear"]  # fmt: skip
    # a fresh model calibrated from the manifest exports the same file in the recorded form
    fresh, _ = _prepared(seed=1)
    qdq.load_calibration(fresh, out.manifest_path)
    fresh[0].load_state_dict(m[0].state_dict())
    fresh[2].load_state_dict(m[2].state_dict())
    again = qdq.export_onnx(fresh, (x,), tmp_path / "again.onnx", exporter="torchscript",
                            verify=False, block_form=block_form_of(out.manifest_path))  # fmt: skip
    assert again.path.read_bytes() == out.path.read_bytes()
    # the default stays ONNX's form, recorded too; a manifest without the field reads "onnx"
    plain = qdq.export_onnx(m, (x,), tmp_path / "p.onnx", exporter="torchscript", verify=False)
    assert (plain.opset, plain.block_form) == (24, "onnx")
    assert block_form_of(plain.manifest_path) == "onnx"
    bare = json.loads(plain.manifest_path.read_text())
    del bare["block_form"]
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    assert block_form_of(tmp_path / "bare.json") == "onnx"
    bare["block_form"] = "e8m0"
    (tmp_path / "bad.json").write_text(json.dumps(bare))
    with pytest.raises(ValueError, match=r"bad\.json: block_form must be one of .*'e8m0'"):
        block_form_of(tmp_path / "bad.json")


def test_export_onnx_refuses_a_bad_form_and_another_opset(tmp_path):
    import qdq

    m, x = _prepared()
    with pytest.raises(ValueError, match="block_form must be one of .*'fp8'"):
        qdq.export_onnx(m, (x,), tmp_path / "a.onnx", block_form="fp8")
    with pytest.raises(ValueError, match="written at opset 19 .*got opset=24"):
        qdq.export_onnx(m, (x,), tmp_path / "b.onnx", opset=24, block_form="trt")
    assert not list(tmp_path.iterdir())
    # an INT8 model: the argument changes nothing, and nothing is recorded
    torch.manual_seed(0)
    net = qdq.prepare(nn.Sequential(nn.Linear(64, 32)).eval(), (x,))
    qdq.calibrate(net, [x], show_progress=False)
    a = qdq.export_onnx(net, (x,), tmp_path / "i.onnx", exporter="torchscript", verify=False)
    b = qdq.export_onnx(net, (x,), tmp_path / "t.onnx", exporter="torchscript", verify=False,
                        block_form="trt")  # fmt: skip
    assert a.path.read_bytes() == b.path.read_bytes() and a.block_form is None
    assert "block_form" not in json.loads(a.manifest_path.read_text())


# ---- the job: the form by the target ---------------------------------------------------------

MODEL_PY = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def build():
    return Block().eval()
"""


def test_job_picks_the_form_by_the_target(tmp_path):
    from qdq.pipeline import quantize
    from qdq.pipeline.options import block_form, default_target

    (tmp_path / "block.py").write_text(MODEL_PY)
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((32, 8, 32)).astype(np.float32))
    spec = f"{tmp_path / 'block.py'}:build"
    assert default_target("mxfp8") == "trt10.12-blackwell"
    files = {}
    for target, form, opset in [(None, "trt", 19), ("trt11-b200", "onnx", 24)]:
        out = tmp_path / form
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = quantize(spec, str(data), out=out, format="mxfp8", target=target, ptq="none",
                           show_progress=False)  # fmt: skip
        settings = res.report["settings"]
        assert (settings["block_form"], settings["opset"]) == (form, opset)
        assert settings["target"] == (target or "trt10.12-blackwell")
        assert block_form("mxfp8", settings["target"]) == form
        assert json.loads((out / "manifest.json").read_text())["block_form"] == form
        assert res.report["lint"]["mxfp8_weighted_layers"] == 2
        assert res.report["int8"]["cosine_mean"] == res.report["int8_torch"]["cosine_mean"]
        files[form] = onnx.load(str(out / "model.qdq.onnx"))
        if form == "trt":  # TensorRT 10.12 reads it: no V07, nothing but INFO
            findings = res.report["lint_findings"]
            assert {f["severity"] for f in findings} <= {"INFO"}, findings
    # the two jobs calibrate alike: the same weight codes in both forms
    trt, theirs = ({i.name: numpy_helper.to_array(i).tobytes() for i in files[f].graph.initializer
                    if "weight_quantizer" in i.name} for f in ("trt", "onnx"))  # fmt: skip
    assert len(trt) == 4
    for name, codes in trt.items():
        assert codes == theirs[re.sub(r"_e8m0_bytes$", "_e8m0", name)], name
    for target, why in [
        ("trt10-hopper", "format='mxfp8': target trt10-hopper cannot run MXFP8: MXFP8 needs "
                         "TensorRT 10.12+; trt10-hopper is TensorRT 10.0"),
        ("trt10.12-hopper", "needs a Blackwell GPU"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(why)):
            quantize(spec, str(data), out=tmp_path / "x", format="mxfp8", target=target)
        assert not (tmp_path / "x").exists()
