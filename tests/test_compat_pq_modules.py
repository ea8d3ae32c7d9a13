"""qdq.compat.pytorch_quantization: TensorQuantizer, the quant modules and optim.helper (issue 59).

Upstream semantics checked here beyond NVIDIA's own unit tests: state_dict keys and round trips,
pre_quant_scale, learned clip gradients, setters, printing, error types and messages, and that an
exported compat model is Q/DQ that ONNX Runtime runs like the torch model.
"""

from __future__ import annotations

import io
import logging
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qdq.compat.pytorch_quantization import nn as quant_nn
from qdq.compat.pytorch_quantization import tensor_quant
from qdq.compat.pytorch_quantization.nn.modules import quant_conv, quant_instancenorm
from qdq.compat.pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer
from qdq.compat.pytorch_quantization.optim import helper
from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor


def _calibrate(model: nn.Module, *batches: torch.Tensor) -> None:
    quantizers = [m for m in model.modules() if isinstance(m, TensorQuantizer)]
    for q in quantizers:
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for x in batches:
            model(x)
    for q in quantizers:
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = quant_nn.QuantConv2d(3, 4, 3, padding=1)
        self.fc = quant_nn.QuantLinear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


# ---------------------------------------------------------------- state_dict


def test_state_dict_keys_are_upstreams_and_load_into_a_fresh_model() -> None:
    torch.manual_seed(0)
    model = _Small()
    x = torch.randn(2, 3, 6, 6)
    assert set(model.state_dict()) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    _calibrate(model, x)
    keys = set(model.state_dict())
    assert {"conv._input_quantizer._amax", "conv._weight_quantizer._amax"} <= keys
    assert {"fc._input_quantizer._amax", "fc._weight_quantizer._amax"} <= keys
    assert model.state_dict()["conv._weight_quantizer._amax"].shape == (4, 1, 1, 1)
    assert model.state_dict()["fc._weight_quantizer._amax"].shape == (5, 1)

    fresh = _Small()  # no amax buffers yet: loading creates them (upstream's workaround)
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh(x), model(x))
    assert fresh.conv.input_quantizer.amax is not None


def test_load_state_dict_without_amax_keeps_strict_errors() -> None:
    q = TensorQuantizer(QuantDescriptor(amax=2.0))
    with pytest.raises(RuntimeError, match="Missing key"):
        q.load_state_dict({})


def test_learned_amax_state_dict_keys() -> None:
    q = TensorQuantizer(QuantDescriptor(amax=0.5, learn_amax=True))
    assert set(q.state_dict()) == {"_amax", "clip.clip_value_min", "clip.clip_value_max"}
    assert q.clip.clip_value_max.dtype == torch.float32
    assert q.clip.clip_value_min.item() == -0.5


# ---------------------------------------------------------------- pre_quant_scale


def test_pre_quant_scale_scales_before_quantizing_and_is_saved() -> None:
    x = torch.tensor([[0.1, -0.4, 0.9, 2.0]])
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    q.pre_quant_scale = torch.tensor([[2.0, 1.0, 0.5, 0.25]])
    expected = tensor_quant.fake_tensor_quant(
        x * q.pre_quant_scale, torch.tensor(1.0), 8, False, False
    )
    assert torch.equal(q(x), expected)
    assert "pre_quant_scale" in str(q)

    state = q.state_dict()
    assert set(state) == {"_amax", "_pre_quant_scale"}
    fresh = TensorQuantizer(QuantDescriptor(amax=1.0))
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x), expected)

    with pytest.raises(RuntimeError, match="Changing shape when setting pre_quant_scale"):
        q.pre_quant_scale = torch.ones(3)


def test_pre_quant_scale_applies_even_when_disabled() -> None:
    q = TensorQuantizer(disabled=True)
    q.pre_quant_scale = 3.0
    assert torch.equal(q(torch.tensor([1.0, 2.0])), torch.tensor([3.0, 6.0]))


# ---------------------------------------------------------------- learned clip


def test_learned_clip_gradients_are_pacts() -> None:
    q = TensorQuantizer(QuantDescriptor(amax=0.5, learn_amax=True))
    assert q._if_clip and q.clip.clip_value_max.requires_grad
    x = torch.tensor([-0.9, -0.5, -0.1, 0.2, 0.49, 0.5, 0.8, 1.5], requires_grad=True)
    q(x).sum().backward()
    # inputs at or past a bound give their gradient to that bound and none to the input
    assert float(q.clip.clip_value_max.grad) == 3.0  # 0.5, 0.8, 1.5
    assert float(q.clip.clip_value_min.grad) == 2.0  # -0.9, -0.5
    assert x.grad.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_init_learn_amax_starts_from_the_calibrated_max() -> None:
    q = TensorQuantizer(QuantDescriptor(learn_amax=True))
    q.amax = 3.0
    q.init_learn_amax()
    assert q.clip.clip_value_min.item() == -3.0 and q.clip.clip_value_max.item() == 3.0
    plain = TensorQuantizer()
    with pytest.raises(RuntimeError, match="learn_amax=False"):
        plain.init_learn_amax()
    with pytest.raises(ValueError, match="Cannot enable clip"):
        plain.enable_clip()


# ---------------------------------------------------------------- properties and errors


def test_num_bits_setter_changes_the_quantization() -> None:
    x = torch.linspace(-1, 1, 101)
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    q.num_bits = 4
    assert q.num_bits == 4 and q.maxbound == 7
    out = q(x)
    assert torch.equal(out, tensor_quant.fake_tensor_quant(x, torch.tensor(1.0), 4, False, False))
    assert len(torch.unique(out)) == 15
    q.unsigned = True
    assert q.maxbound == 15
    assert q.step_size == pytest.approx(1.0 / 15)


def test_amax_setter_refuses_a_new_shape_and_none() -> None:
    q = TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0]))
    q.amax = np.array([3.0, 4.0], dtype=np.float32)
    assert q.amax.tolist() == [3.0, 4.0]
    with pytest.raises(RuntimeError, match="Changing shape when setting amax is not allowed"):
        q.amax = 1.0
    q.amax = None  # logged, ignored
    assert q.amax.tolist() == [3.0, 4.0]


def test_load_calib_amax_messages() -> None:
    q = TensorQuantizer()
    with pytest.raises(RuntimeError, match="Calibrator returned None"):
        q.load_calib_amax()
    q.load_calib_amax(strict=False)
    assert math.isnan(float(q.amax))
    none = TensorQuantizer(QuantDescriptor(calib_method="no such"))
    with pytest.raises(RuntimeError, match="Calibrator not created"):
        none.load_calib_amax()
    with pytest.raises(ValueError, match="Calibrator was not created"):
        none.enable_calib()


def test_scale_too_large_for_fp16_is_a_value_error() -> None:
    q = TensorQuantizer(QuantDescriptor(amax=1e-3, fake_quant=False))
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        q(torch.tensor([1e-4, -1e-4], dtype=torch.half))
    ok = TensorQuantizer(QuantDescriptor(amax=1.0, fake_quant=False))
    codes = ok(torch.tensor([0.5, -1.0], dtype=torch.half))
    assert codes.dtype == torch.half and codes.tolist() == [64.0, -127.0]
    assert float(ok.scale) == 127.0


def test_print_format_is_upstreams() -> None:
    assert str(TensorQuantizer()) == (
        "TensorQuantizer(8bit fake per-tensor amax=dynamic calibrator=MaxCalibrator scale=1.0 quant)"
    )
    q = TensorQuantizer(
        QuantDescriptor(num_bits=4, axis=(0,), amax=[0.5, 1.25], unsigned=True, narrow_range=True,
                        fake_quant=False),
        if_calib=True,
    )  # fmt: skip
    assert q.extra_repr() == (
        "unsigned 4bit narrow axis=(0,) amax=[0.5000, 1.2500](2) calibrator=MaxCalibrator "
        "quant calib"
    )
    learned = TensorQuantizer(QuantDescriptor(amax=2.0, learn_amax=True, scale_amax=0.5))
    assert learned.extra_repr() == (
        "8bit fake per-tensor amax=2.0000 *0.5 learned calibrator=MaxCalibrator scale=1.0 quant clip"
    )
    learned.disable()
    assert learned.extra_repr() == "disabled"


def test_e4m3_quantizer_uses_scaled_e4m3() -> None:
    x = torch.randn(4, 8)
    q = TensorQuantizer(QuantDescriptor(num_bits=(4, 3)))
    assert q.maxbound == 448.0
    assert torch.equal(q(x), tensor_quant.scaled_e4m3(x, q._get_amax(x), 4, 3))


def test_dynamic_amax_per_axis_keeps_dims() -> None:
    x = torch.randn(3, 5, 4)
    amax = TensorQuantizer(QuantDescriptor(axis=(0, 1)))._get_amax(x)
    assert amax.shape == (3, 5, 1)
    assert torch.equal(amax, x.abs().amax(dim=2, keepdim=True))
    assert TensorQuantizer()._get_amax(x).shape == ()


# ---------------------------------------------------------------- modules


def test_quant_modules_are_torch_subclasses_with_upstream_errors() -> None:
    conv = quant_nn.QuantConv2d(3, 4, 3)
    assert isinstance(conv, nn.Conv2d) and isinstance(quant_nn.QuantLinear(2, 2), nn.Linear)
    with pytest.raises(TypeError, match="Unused keys"):
        quant_nn.QuantConv2d(3, 4, 3, descriptor="oops")
    with pytest.raises(ValueError, match="Only fake quantization is supported"):
        quant_nn.QuantLinear(2, 2, quant_desc_input=QuantDescriptor(fake_quant=False))
    with pytest.raises(TypeError, match="should be only called by __init__"):
        conv.init_quantizer(QuantDescriptor(), QuantDescriptor())
    with pytest.raises(ValueError, match="not an instance of QuantDescriptor"):
        quant_nn.QuantConv2d.set_default_quant_desc_input("8bit")  # type: ignore[arg-type]


def test_conv_transpose_output_size() -> None:
    torch.manual_seed(0)
    m = quant_nn.QuantConvTranspose2d(3, 2, 3, stride=2, padding=1)
    x = torch.randn(1, 3, 5, 5)
    out = m(x, output_size=[10, 10])
    assert out.shape == (1, 2, 10, 10)
    qx, qw = m._quant(x)
    assert torch.equal(out, F.conv_transpose2d(qx, qw, m.bias, 2, 1, 1))
    bad = quant_nn.QuantConvTranspose2d(3, 2, 3)
    bad.padding_mode = "circular"
    with pytest.raises(ValueError, match="Only `zeros` padding mode"):
        bad(x)


@pytest.mark.parametrize(
    ("cls", "shape"),
    [
        (quant_instancenorm.QuantInstanceNorm1d, (2, 3, 7)),
        (quant_instancenorm.QuantInstanceNorm2d, (2, 3, 5, 4)),
        (quant_instancenorm.QuantInstanceNorm3d, (2, 3, 3, 4, 2)),
    ],
)
def test_instancenorm_normalizes_the_quantized_input(cls: type, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    m = cls(3, affine=True, quant_desc_input=QuantDescriptor(num_bits=6))
    assert isinstance(m, cls.__mro__[2])  # the torch InstanceNorm class
    x = torch.randn(*shape)
    qx = tensor_quant.fake_tensor_quant(x, x.abs().max(), 6, False, False)
    assert torch.equal(m(x), F.instance_norm(qx, None, None, m.weight, m.bias))
    with pytest.raises(TypeError, match="Unused keys"):
        cls(3, quant_desc_weight=QuantDescriptor())


def test_conv_uses_torch_padding_modes() -> None:
    torch.manual_seed(0)
    m = quant_conv.QuantConv2d(2, 2, 3, padding=1, padding_mode="reflect")
    m.input_quantizer.disable()
    m.weight_quantizer.disable()
    ref = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
    ref.load_state_dict(m.state_dict())
    x = torch.randn(1, 2, 5, 5)
    assert torch.equal(m(x), ref(x))


# ---------------------------------------------------------------- optim.helper


def _learned_linear() -> nn.Module:
    desc = QuantDescriptor(amax=1.0, learn_amax=True)
    return nn.Sequential(quant_nn.QuantLinear(4, 3, quant_desc_input=desc, quant_desc_weight=desc))


def test_group_and_freeze_the_learned_ranges() -> None:
    model = _learned_linear()
    groups = helper.group_parameters(model, [["clip"], ["weight$", "bias$"]], lrs=[1e-2, 1e-3])
    assert [len(list(g["params"])) for g in groups] == [4, 2]
    assert [g["lr"] for g in groups] == [1e-2, 1e-3]
    with pytest.raises(TypeError, match="len\\(momentums\\) must match"):
        helper.group_parameters(model, [["clip"]], momentums=[0.9, 0.9])
    helper.freeze_parameters(model, ["clip_value_min"])
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == [
        "0._input_quantizer.clip.clip_value_min",
        "0._weight_quantizer.clip.clip_value_min",
    ]


def test_quant_weight_inplace_is_idempotent() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantLinear(8, 4), nn.ReLU())
    expected = model[0].weight_quantizer(model[0].weight).detach()
    helper.quant_weight_inplace(model)
    assert torch.equal(model[0].weight.detach(), expected)
    helper.quant_weight_inplace(model)
    assert torch.equal(model[0].weight.detach(), expected)


# ---------------------------------------------------------------- ONNX export


@pytest.mark.parametrize(("fb", "dynamo"), [(False, False), (True, False), (False, True)])
def test_exported_compat_model_is_qdq_and_matches_onnxruntime(
    fb: bool, dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Both exporters; torch.onnx.export's default since torch 2.9 is dynamo (upstream's scripts
    pass no ``dynamo=``), where amax is a traced tensor and the scale is folded into a constant."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = _Small().eval()
    x = torch.randn(8, 3, 6, 6)
    _calibrate(model, x)
    with torch.no_grad():
        expected = model(x).numpy()
    TensorQuantizer.use_fb_fake_quant = fb
    try:
        f = io.BytesIO()
        with caplog.at_level(logging.ERROR):
            if dynamo:
                program = torch.onnx.export(model, (x,), dynamo=True, opset_version=17)
                assert program is not None
                f.write(program.model_proto.SerializeToString())
            else:
                torch.onnx.export(model, (x,), f, dynamo=False, opset_version=13)
    finally:
        TensorQuantizer.use_fb_fake_quant = False
    graph = onnx.load_from_string(f.getvalue()).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 4 and ops.count("DequantizeLinear") == 4
    constants = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    assert all(n.input[1] in constants for n in graph.node if n.op_type == "QuantizeLinear")
    sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    # the graph divides by amax/127 where torch multiplies by 127/amax: a value on a rounding
    # boundary may land one code apart, which moves the outputs by a few input steps at most
    diff = np.abs(got - expected)
    step = float(model.fc.input_quantizer.amax) / 127 * float(model.fc.weight.detach().abs().max())
    assert diff.max() <= 2 * step
    assert np.mean(diff > 1e-5) < 0.05


def test_export_refuses_widths_qdq_cannot_hold() -> None:
    m = quant_nn.QuantLinear(4, 2, quant_desc_input=QuantDescriptor(num_bits=4, amax=1.0))
    with pytest.raises(ValueError, match="only 8-bit quantizers export"):
        torch.onnx.export(m, (torch.randn(1, 4),), io.BytesIO(), dynamo=False)


def test_e4m3_quantizer_exports_float8_qdq() -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    q = TensorQuantizer(QuantDescriptor(num_bits=(4, 3), amax=2.0))
    x = torch.randn(4, 8)
    f = io.BytesIO()
    torch.onnx.export(q, (x,), f, dynamo=False, opset_version=19)
    ops = [n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 1
    sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, q(x).numpy(), rtol=1e-6, atol=0)
