"""FP8 and mixed INT8/FP8 plans end to end (issue 49): prepare → calibrate → export with both
exporters at opset 19 (native QuantizeLinear/DequantizeLinear with a float8e4m3fn zero point, no
custom op), the manifest's formats, per-layer parity against ONNX Runtime, a QAT step."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import qdq
from device_verbs import fp8_net
from qdq import QuantConfig

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def fp8_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    prepared = qdq.prepare(fp8_net("cpu"), (x,), QuantConfig(format="fp8"))
    qdq.calibrate(prepared, [torch.randn(8, 3, 16, 16) for _ in range(2)], show_progress=False)
    return prepared, x


def _zero_point_types(model: object) -> dict[str, int]:
    inits = {i.name: i.data_type for i in model.graph.initializer}  # type: ignore[attr-defined]
    return {
        n.name: inits[n.input[2]]
        for n in model.graph.node  # type: ignore[attr-defined]
        if n.op_type == "QuantizeLinear"
    }


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_fp8_plan_exports_native_qdq_at_opset_19(fp8_model, exporter, tmp_path) -> None:
    prepared, x = fp8_model
    out = qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", exporter=exporter)  # verified
    assert out.opset == 19  # the default for a plan with FP8 quantizers
    model = onnx.load(str(tmp_path / "m.onnx"))
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}  # no custom ops
    types = _zero_point_types(model)
    fp8 = {n for n, t in types.items() if t == onnx.TensorProto.FLOAT8E4M3FN}
    int8 = {n for n, t in types.items() if t == onnx.TensorProto.INT8}
    assert fp8 and int8 and len(fp8) + len(int8) == len(types)
    manifest = json.loads(out.manifest_path.read_text())
    formats = {q["path"]: q["format"] for q in manifest["quantizers"]}
    assert formats["pw.input_quantizer"] == "fp8" and formats["pw.weight_quantizer"] == "fp8"
    assert formats["big.input_quantizer"] == "int8" and formats["stem.weight_quantizer"] == "int8"
    weights = {q["path"]: q for q in manifest["quantizers"]}
    assert weights["pw.weight_quantizer"]["axis"] is None  # F06: per tensor
    pw = weights["pw.weight_quantizer"]
    assert pw["scale"] == pytest.approx(pw["amax"] / 448.0, rel=1e-6)


def test_fp8_export_refuses_an_opset_without_fp8(fp8_model, tmp_path) -> None:
    prepared, x = fp8_model
    with pytest.raises(ValueError, match="FP8: float8e4m3fn Q/DQ need opset >= 19"):
        qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx", opset=17)
    assert not (tmp_path / "m.onnx").exists()


def test_fp8_parity_per_layer_has_no_unexplained_codes(fp8_model, tmp_path) -> None:
    from qdq.backends.parity import parity

    prepared, x = fp8_model
    qdq.export_onnx(prepared, (x,), tmp_path / "m.onnx")
    torch.manual_seed(3)
    report = parity(prepared, tmp_path / "m.onnx", [torch.randn(4, 3, 16, 16) for _ in range(2)],
                    per_layer=True)  # fmt: skip
    assert report.first_unexplained is None
    assert report.min_cosine > 0.99999
    layers = report.layers
    assert layers["pw.input_quantizer"].qdq_mismatches == 0  # our Q/DQ on ORT's input: exact
    assert all(lp.unexplained_codes == 0 for lp in layers.values())


def test_fp8_qat_step_trains_and_int8_only_rounding_steps_skip_fp8_layers(fp8_model) -> None:
    prepared, x = fp8_model
    model = qdq.copy_prepared(prepared)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    before = model.pw.weight.detach().clone()
    loss = model(x).square().mean()
    loss.backward()
    assert model.pw.weight.grad is not None and model.pw.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, model.pw.weight.detach())
    from qdq.ptq.kernel_sums import kernel_sum_rounding

    model.eval()
    rows = kernel_sum_rounding(model, [x]).rows
    names = {r.name for r in rows}
    assert "pw:weight" not in names and "conv:weight" not in names  # FP8: nearest rounding
