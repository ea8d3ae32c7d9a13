"""qdq.compat.pytorch_quantization: upstream-style scripts on qdq's engine, all on CPU.

The end-to-end tests follow upstream's tutorial flow (quant_modules.initialize → build a torchvision
ResNet → enable_calib/disable_quant → load_calib_amax → use_fb_fake_quant export). They use
ResNet-50 at 64x64 instead of 224x224 to stay within seconds on 2 cores; the layers
exercised (Conv2d, Linear, AdaptiveAvgPool2d, residual blocks) are the same.
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from qdq.compat.pytorch_quantization import calib, quant_modules, tensor_quant
from qdq.compat.pytorch_quantization import nn as quant_nn
from qdq.compat.pytorch_quantization.nn.modules import _utils as quant_nn_utils
from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torchvision = pytest.importorskip("torchvision")

_MAP_NAMES = [e.mod_name for e in quant_modules._DEFAULT_QUANT_MAP]


def _run_ort(model_bytes: bytes, inputs: list[torch.Tensor]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs, strict=True)}
    return sess.run(None, feeds)[0]


def _export(model: nn.Module, inputs: tuple[torch.Tensor, ...], fb: bool = True) -> bytes:
    quant_nn.TensorQuantizer.use_fb_fake_quant = fb
    try:
        f = io.BytesIO()
        torch.onnx.export(model, inputs, f, dynamo=False, opset_version=13)
    finally:
        quant_nn.TensorQuantizer.use_fb_fake_quant = False
    return f.getvalue()


def _ops(model_bytes: bytes) -> list[str]:
    return [n.op_type for n in onnx.load_from_string(model_bytes).graph.node]


def _assert_constant_scales(model_bytes: bytes) -> None:
    """Every Q/DQ scale and zero point is an initializer or a Constant node (TensorRT rejects
    computed ones: lint rule V09), not a subgraph of the amax buffer."""
    graph = onnx.load_from_string(model_bytes).graph
    constants = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    for n in graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert all(i in constants for i in n.input[1:]), (n.name, list(n.input))


def _quantizers(model: nn.Module) -> list[quant_nn.TensorQuantizer]:
    return [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]


def _collect_stats(model: nn.Module, batches: list[torch.Tensor]) -> None:
    for q in _quantizers(model):
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for x in batches:
            model(x)
    for q in _quantizers(model):
        q.enable_quant()
        q.disable_calib()


def _assert_close_after_requantization(actual: np.ndarray, expected: np.ndarray) -> None:
    """ORT vs torch at the output of ~40 quantizers of a random-weight ResNet. Every Q/DQ is
    bit-exact (tested on its own and on the first stage below), but torch's and ORT's convolutions
    sum in different orders (~1e-6), which moves the odd value across a rounding boundary of the
    next quantizer, and a random network amplifies those one-code flips (torch differs from itself
    by ~0.4 % of the output range between batch sizes 1 and 2). So: within 5 % of the range."""
    tol = 0.05 * float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tol)


# ------------------------------------------------------------------ TensorQuantizer
def test_tensor_quantizer_stages_and_state_dict():
    q = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8, axis=(0,)))
    x = torch.randn(4, 3, 3, 3)
    assert q.amax is None and torch.equal(q(x), tensor_quant.fake_tensor_quant(
        x, x.abs().amax(dim=(1, 2, 3), keepdim=True), 8, False, False))  # fmt: skip
    q.disable_quant()
    q.enable_calib()
    assert q(x) is x
    q.load_calib_amax()
    q.enable_quant()
    q.disable_calib()
    assert q._amax.shape == (4, 1, 1, 1)
    assert torch.equal(q.amax.reshape(-1), x.abs().amax(dim=(1, 2, 3)))
    fresh = quant_nn.TensorQuantizer(QuantDescriptor(num_bits=8, axis=(0,)))
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh(x), q(x))
    q.disable()
    assert q(x) is x
    empty = quant_nn.TensorQuantizer()
    with pytest.raises(RuntimeError, match="Calibrator returned None"):
        empty.load_calib_amax()
    empty.load_calib_amax(strict=False)  # upstream: logs and sets amax to NaN
    assert torch.isnan(empty.amax).all()


def test_tensor_quantizer_learn_amax_and_integer_mode():
    learned = quant_nn.TensorQuantizer(QuantDescriptor(amax=2.0, learn_amax=True))
    assert isinstance(learned.clip.clip_value_max, nn.Parameter)  # upstream: PACT's Clip
    x = torch.linspace(-3, 3, 50, requires_grad=True)
    learned(x).pow(2).sum().backward()
    assert learned.clip.clip_value_max.grad is not None and x.grad is not None
    integer = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.27, fake_quant=False))
    assert integer(torch.tensor([0.5, -3.0])).tolist() == [50.0, -127.0]  # narrow, as upstream
    assert float(integer.scale) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="fake"):
        quant_nn.QuantLinear(2, 2, quant_desc_weight=QuantDescriptor(fake_quant=False))
    scaled = quant_nn.TensorQuantizer(QuantDescriptor(amax=1.0, scale_amax=2.0))
    assert float(scaled(torch.tensor([5.0]))) == pytest.approx(2.0)


def test_unsigned_quantizer_exports_uint8_with_fb_fake_quant():
    model = nn.Sequential(
        nn.ReLU(), quant_nn.TensorQuantizer(QuantDescriptor(amax=2.0, unsigned=True))
    )
    x = torch.linspace(-1, 3, 64).reshape(1, 64)
    with torch.no_grad():
        expected = model(x).numpy()
    onnx_bytes = _export(model, (x,), fb=True)
    assert "QuantizeLinear" in _ops(onnx_bytes)
    # torch computes code / (255/amax) as upstream, the graph code * (amax/255): the same codes
    # dequantize a float32 ulp apart; a value on a rounding boundary may land one code apart
    diff = np.abs(_run_ort(onnx_bytes, [x]) - expected)
    assert diff.max() <= 2.0 / 255 * 1.0001 and int((diff > 1e-6).sum()) <= 2
    with pytest.raises(ValueError, match="uint8"):
        _export(model, (x,), fb=False)


# ------------------------------------------------------------------ quant modules
def test_quant_modules_are_torch_subclasses_with_upstream_keys():
    conv = quant_nn.QuantConv2d(3, 8, 3, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    assert isinstance(conv, nn.Conv2d) and isinstance(conv, quant_nn_utils.QuantMixin)
    assert isinstance(conv.input_quantizer._calibrator, calib.HistogramCalibrator)
    assert conv.weight_quantizer.axis == 0
    pool = quant_nn.QuantMaxPool2d(2)
    assert isinstance(pool, nn.MaxPool2d) and isinstance(pool, quant_nn_utils.QuantInputMixin)
    assert not isinstance(pool, quant_nn_utils.QuantMixin)
    assert isinstance(quant_nn.QuantConvTranspose2d(4, 2, 2), nn.ConvTranspose2d)
    assert quant_nn.Conv2d is quant_nn.QuantConv2d and quant_nn.Linear is quant_nn.QuantLinear
    with pytest.raises(TypeError, match="Unused keys"):
        quant_nn.QuantLinear(4, 2, quant_desc_bias=QuantDescriptor())
    conv.input_quantizer.amax = 2.0
    conv.weight_quantizer.amax = conv.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    keys = set(conv.state_dict())
    assert {"_input_quantizer._amax", "_weight_quantizer._amax"} <= keys
    shapes = [
        (quant_nn.QuantConv1d(2, 4, 3), (1, 2, 9)),
        (quant_nn.QuantConv3d(2, 4, 3), (1, 2, 5, 5, 5)),
        (quant_nn.QuantConvTranspose1d(2, 4, 2, stride=2), (1, 2, 5)),
        (quant_nn.QuantConvTranspose3d(2, 4, 2), (1, 2, 3, 3, 3)),
        (quant_nn.QuantAvgPool1d(2), (1, 2, 8)),
        (quant_nn.QuantAvgPool2d(2), (1, 2, 8, 8)),
        (quant_nn.QuantAvgPool3d(2), (1, 2, 4, 4, 4)),
        (quant_nn.QuantMaxPool1d(2), (1, 2, 8)),
        (quant_nn.QuantMaxPool3d(2), (1, 2, 4, 4, 4)),
        (quant_nn.QuantAdaptiveAvgPool1d(1), (1, 2, 8)),
        (quant_nn.QuantAdaptiveAvgPool3d(1), (1, 2, 4, 4, 4)),
    ]
    for module, shape in shapes:
        x = torch.randn(shape)
        base = next(c for c in type(module).__mro__ if c.__module__.startswith("torch.nn"))
        assert isinstance(module, base)
        with torch.no_grad():
            ref, out = base.forward(module, x), module(x)  # float vs quantized (dynamic amax)
        assert out.shape == ref.shape
        assert float((out - ref).abs().max()) <= 0.05 * float(ref.abs().max()) + 1e-6


def test_set_default_quant_desc_and_transfer_like_yolov7():
    old = quant_nn.QuantConv2d.default_quant_desc_input
    try:
        quant_nn.QuantConv2d.set_default_quant_desc_input(QuantDescriptor(calib_method="histogram"))
        assert isinstance(quant_nn.QuantConv2d(1, 1, 1).input_quantizer._calibrator,
                          calib.HistogramCalibrator)  # fmt: skip
        with pytest.raises(ValueError, match="QuantDescriptor"):
            quant_nn.QuantConv2d.set_default_quant_desc_input({"num_bits": 8})
    finally:
        quant_nn.QuantConv2d.default_quant_desc_input = old
    # yolov7's replace_to_quantization_module: __new__ + vars copy + init_quantizer, called from
    # a function named __init__ (upstream refuses init_quantizer from anywhere else)
    float_conv = nn.Conv2d(3, 4, 3)
    qconv = quant_nn.QuantConv2d.__new__(quant_nn.QuantConv2d)
    for k, v in vars(float_conv).items():
        setattr(qconv, k, v)

    def __init__(self):  # noqa: N807
        desc_in, desc_w = quant_nn_utils.pop_quant_desc_in_kwargs(self.__class__)
        self.init_quantizer(desc_in, desc_w)
        self.input_quantizer._calibrator._torch_hist = True

    __init__(qconv)
    assert qconv(torch.randn(1, 3, 6, 6)).shape == (1, 4, 4, 4)
    with pytest.raises(TypeError, match="only called by __init__"):
        qconv.init_quantizer(QuantDescriptor(), QuantDescriptor())


def test_initialize_deactivate_restores_torch_nn():
    originals = {name: getattr(nn, name) for name in _MAP_NAMES}
    quant_modules.initialize(float_module_list=["Linear"])
    try:
        assert nn.Conv2d is quant_nn.QuantConv2d and nn.Linear is originals["Linear"]
        quant_modules.initialize()  # again: the originals must survive
        assert nn.Linear is quant_nn.QuantLinear
    finally:
        quant_modules.deactivate()
    assert {name: getattr(nn, name) for name in _MAP_NAMES} == originals
    quant_modules.deactivate()  # idempotent
    assert nn.Conv2d is originals["Conv2d"]


def test_alias_is_opt_in_and_import_qdq_is_lazy():
    code = (
        "import sys, qdq\n"
        "assert not any(m.startswith('qdq.compat') for m in sys.modules)\n"
        "import qdq.compat\n"
        "assert 'pytorch_quantization' not in sys.modules\n"
        "qdq.compat.install_alias()\n"
        "from pytorch_quantization import nn as quant_nn, quant_modules, calib\n"
        "from pytorch_quantization.tensor_quant import QuantDescriptor\n"
        "from pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer\n"
        "assert quant_nn.TensorQuantizer is TensorQuantizer\n"
        "qdq.compat.uninstall_alias()\n"
        "assert 'pytorch_quantization' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def resnet_and_data():
    """ResNet-50 built under quant_modules with histogram input calibrators (upstream tutorial)."""
    old = (
        quant_nn.QuantConv2d.default_quant_desc_input,
        quant_nn.QuantLinear.default_quant_desc_input,
    )
    originals = {name: getattr(nn, name) for name in _MAP_NAMES}
    hist = QuantDescriptor(calib_method="histogram")
    quant_nn.QuantConv2d.set_default_quant_desc_input(hist)
    quant_nn.QuantLinear.set_default_quant_desc_input(hist)
    quant_modules.initialize()
    try:
        torch.manual_seed(0)
        model = torchvision.models.resnet50(num_classes=10).eval()
    finally:
        quant_modules.deactivate()
        quant_nn.QuantConv2d.default_quant_desc_input = old[0]
        quant_nn.QuantLinear.default_quant_desc_input = old[1]
    assert {name: getattr(nn, name) for name in _MAP_NAMES} == originals
    assert isinstance(model.conv1, quant_nn.QuantConv2d) and isinstance(model.fc, nn.Linear)
    assert isinstance(model.avgpool, quant_nn.QuantAdaptiveAvgPool2d)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 3, 64, 64, generator=g) for _ in range(2)]
    _collect_stats(model, batches)
    return model, batches


@pytest.mark.parametrize("method", ["entropy", "mse", "percentile"])
def test_resnet_calibrate_export_onnxruntime(resnet_and_data, method):
    model, batches = resnet_and_data
    for q in _quantizers(model):
        if isinstance(q._calibrator, calib.MaxCalibrator):
            q.load_calib_amax()
        elif method == "percentile":
            q.load_calib_amax("percentile", percentile=99.9)
        else:
            q.load_calib_amax(method)
    amaxes = {
        n: q.amax for n, q in model.named_modules() if isinstance(q, quant_nn.TensorQuantizer)
    }
    assert all(a is not None and bool((a > 0).all()) for a in amaxes.values())
    assert amaxes["conv1._weight_quantizer"].shape == (64, 1, 1, 1)
    x = batches[0]
    with torch.no_grad():
        expected = model(x).numpy()
    onnx_bytes = _export(model, (x,))
    ops = _ops(onnx_bytes)
    n_quantizers = len(amaxes)
    assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear")
    # each downsample conv reads its block's input with conv1 (same histogram, same amax): the
    # exporter may fold such identical constant-scale Q/DQ pairs into one (4 blocks)
    assert n_quantizers - 4 <= ops.count("QuantizeLinear") <= n_quantizers
    onnx.checker.check_model(onnx.load_from_string(onnx_bytes))
    _assert_constant_scales(onnx_bytes)
    _assert_close_after_requantization(_run_ort(onnx_bytes, [x]), expected)


def test_resnet_export_without_fb_fake_quant(resnet_and_data):
    model, batches = resnet_and_data
    for q in _quantizers(model):
        q.load_calib_amax() if isinstance(
            q._calibrator, calib.MaxCalibrator
        ) else q.load_calib_amax("entropy")
    x = batches[1]
    with torch.no_grad():
        expected = model(x).numpy()
    onnx_bytes = _export(model, (x,), fb=False)
    assert "QuantizeLinear" in _ops(onnx_bytes)
    _assert_constant_scales(onnx_bytes)
    _assert_close_after_requantization(_run_ort(onnx_bytes, [x]), expected)
    # the first stage (2 quantizers, conv/bn/relu/maxpool, a third pair): exact up to float
    # order, where a maxpool value ~1e-7 from a rounding boundary may flip one code of the third
    # quantizer (one flipped input moves 3x3x64 outputs by one weight step: < 2 % of them)
    stage = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool, model.layer1[0].conv1)
    with torch.no_grad():
        expected_stage = stage(x).numpy()
    for fb in (False, True):
        stage_bytes = _export(stage, (x,), fb=fb)
        assert _ops(stage_bytes).count("QuantizeLinear") == 4
        diff = np.abs(_run_ort(stage_bytes, [x]) - expected_stage)
        assert diff.max() < 0.01 and np.mean(diff > 1e-5) < 0.02


class _ThreeInputAdd(nn.Module):
    """A custom module with its own quantizer shared by the three inputs of an add."""

    def __init__(self) -> None:
        super().__init__()
        self.add_quantizer = quant_nn.TensorQuantizer(QuantDescriptor(calib_method="histogram"))
        self.conv = quant_nn.QuantConv2d(
            4, 4, 3, padding=1, quant_desc_input=QuantDescriptor(calib_method="histogram")
        )

    def forward(self, a, b, c):
        s = self.add_quantizer(a) + self.add_quantizer(b) + self.add_quantizer(c)
        return self.conv(s)


def test_custom_module_shared_quantizer_exports_qdq():
    torch.manual_seed(0)
    model = _ThreeInputAdd().eval()
    g = torch.Generator().manual_seed(2)
    batches = [tuple(torch.randn(1, 4, 8, 8, generator=g) * (i + 1) for i in range(3))]
    for q in _quantizers(model):
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for inputs in batches:
            model(*inputs)
    model.add_quantizer.load_calib_amax("percentile", percentile=99.0)
    model.conv.input_quantizer.load_calib_amax("mse")
    model.conv.weight_quantizer.load_calib_amax()
    for q in _quantizers(model):
        q.enable_quant()
        q.disable_calib()
    inputs = batches[0]
    with torch.no_grad():
        expected = model(*inputs).numpy()
    onnx_bytes = _export(model, inputs)
    graph = onnx.load_from_string(onnx_bytes).graph
    input_names = {i.name for i in graph.input}
    q_nodes = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(q_nodes) == 5  # three add inputs + conv input + conv weight
    add_q = [n for n in q_nodes if n.input[0] in input_names]
    assert len(add_q) == 3
    # read the three scales back from ONNX Runtime (they may be computed by small subgraphs)
    probe = onnx.load_from_string(onnx_bytes)
    for n in add_q:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(n.input[1], 1, None))
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs, strict=True)}
    scales = sess.run([n.input[1] for n in add_q], feeds)
    assert scales[0] == scales[1] == scales[2]
    assert float(scales[0]) == pytest.approx(float(model.add_quantizer.amax) / 127)
    np.testing.assert_allclose(_run_ort(onnx_bytes, list(inputs)), expected, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ recipes
def test_replace_to_quantization_module_with_ignore_policy():
    from qdq.compat import recipes

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    float_conv1 = model.conv1
    recipes.replace_to_quantization_module(model, ignore_policy=[r"fc", r"layer4\.1\.conv2$"])
    assert (
        isinstance(model.conv1, quant_nn.QuantConv2d) and model.conv1.weight is float_conv1.weight
    )
    assert not any(isinstance(m, quant_nn.TensorQuantizer) for m in float_conv1.modules())
    model.conv1.register_forward_pre_hook(lambda m, args: None).remove()  # torch's hook dicts kept
    assert type(model.fc) is nn.Linear and type(model.layer4[1].conv2) is nn.Conv2d
    assert isinstance(model.layer4[1].conv1, quant_nn.QuantConv2d)
    assert isinstance(model.avgpool, quant_nn.QuantAdaptiveAvgPool2d)
    # the downsample conv reads the same tensor as the block's first conv: one shared quantizer
    x = torch.randn(1, 3, 64, 64)
    pairs = recipes.apply_custom_rules_to_quantizer(model, (x,))
    assert pairs == [(f"layer{i}.0.downsample.0", f"layer{i}.0.conv1") for i in (2, 3, 4)]
    for i in (2, 3, 4):
        block = getattr(model, f"layer{i}")[0]
        assert block.downsample[0]._input_quantizer is block.conv1._input_quantizer
    with pytest.raises(TypeError, match="example inputs"):
        recipes.apply_custom_rules_to_quantizer(model, lambda m, f: None)
    recipes.calibrate_model(model, [x], method="percentile")
    onnx_bytes = _export(model, (x,))
    # 19 quantized convs (fc and layer4.1.conv2 ignored): input + weight each, + avgpool input;
    # a shared quantizer still writes one Q/DQ pair per use (TensorRT wants one per consumer)
    assert _ops(onnx_bytes).count("QuantizeLinear") == 2 * 19 + 1
    quant_modules.initialize()  # while torch.nn is patched: float modules still found, quant kept
    try:
        float_conv2d = {n: o for _, n, o in quant_modules._HELPER.orginal_func_map}["Conv2d"]
        mixed = nn.Sequential(float_conv2d(3, 3, 1), nn.Conv2d(3, 3, 1))
        kept = mixed[1]
        recipes.replace_to_quantization_module(mixed)
    finally:
        quant_modules.deactivate()
    assert isinstance(mixed[0], quant_nn.QuantConv2d) and mixed[1] is kept
    other = torchvision.models.resnet18(num_classes=10)
    recipes.replace_to_quantization_module(other, ignore_policy=lambda name: "layer" in name)
    assert (
        isinstance(other.conv1, quant_nn.QuantConv2d) and type(other.layer1[0].conv1) is nn.Conv2d
    )
    with pytest.raises(TypeError, match="ignore_policy"):
        recipes.replace_to_quantization_module(other, ignore_policy=3)


class _ResidualBlock(nn.Module):
    """A hand-placed QuantAdd residual: only the skip input is quantized (conv + add fuse)."""

    def __init__(self) -> None:
        from qdq.compat.recipes import QuantAdd, QuantConcat

        super().__init__()
        self.conv = quant_nn.QuantConv2d(
            8, 8, 3, padding=1, quant_desc_input=QuantDescriptor(calib_method="histogram")
        )
        self.add = QuantAdd()
        self.add._input0_quantizer.disable()  # the conv branch stays unquantized
        self.cat = QuantConcat(dim=1)

    def forward(self, x):
        y = torch.relu(self.add(self.conv(x), x))
        return self.cat(y, x)


def test_quant_add_residual_calibrate_model_and_disable_quantization():
    from qdq.compat import recipes

    torch.manual_seed(0)
    model = _ResidualBlock().eval()
    g = torch.Generator().manual_seed(4)
    loader = [(torch.randn(2, 8, 12, 12, generator=g), None) for _ in range(3)]
    recipes.calibrate_model(model, loader, device="cpu", num_batch=2, method="entropy")
    assert all(q.amax is not None for q in _quantizers(model) if not q._disabled)
    x = loader[2][0]
    with torch.no_grad():
        quantized = model(x)
        with recipes.disable_quantization(model):
            float_out = model(x)
            assert all(q._disabled for q in _quantizers(model))
        assert model.add._input0_quantizer._disabled and not model.add._input1_quantizer._disabled
        assert torch.equal(model(x), quantized) and not torch.equal(float_out, quantized)
        recipes.disable_quantization(model).apply()
        assert torch.equal(model(x), float_out)
        recipes.enable_quantization(model).apply()
        model.add._input0_quantizer.disable()
        assert torch.equal(model(x), quantized)
    onnx_bytes = _export(model, (x,))
    # conv input + conv weight + the shared concat quantizer (2 uses); the add's skip quantizer
    # reads the conv's input tensor and calibrated to the same amax, so the exporter merges the
    # two identical constant-scale Q/DQ into one (one Q per tensor, as TensorRT wants)
    assert torch.equal(model.add._input1_quantizer.amax, model.conv._input_quantizer.amax)
    assert _ops(onnx_bytes).count("QuantizeLinear") == 4
    _assert_constant_scales(onnx_bytes)
    np.testing.assert_allclose(_run_ort(onnx_bytes, [x]), quantized.numpy(), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="num_batch"):
        recipes.calibrate_model(model, loader, num_batch=0)

    # sensitivity: the error vs float with one layer in float / only one layer quantized
    def error(m):
        with torch.no_grad():
            return -float((m(x) - float_out).pow(2).mean())

    before = [q._disabled for q in _quantizers(model)]
    loo = recipes.build_sensitivity_profile(model, error)
    assert [name for name, _ in loo] == ["conv", "add", "cat"]
    assert all(value >= error(model) - 1e-12 for _, value in loo)  # float layer: less error
    single = recipes.build_sensitivity_profile(model, error, mode="one_at_a_time")
    assert all(value <= 0 for _, value in single)
    assert [q._disabled for q in _quantizers(model)] == before
    with pytest.raises(ValueError, match="mode"):
        recipes.build_sensitivity_profile(model, error, mode="greedy")
