"""The public verbs prepare / calibrate / plan_of: contracts, data forms and bad input."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import qdq
from qdq.config import QuantConfig
from qdq.graph.capture import CaptureError


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _data(n: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 16, 8, 8, generator=g) for _ in range(n)]


def test_prepare_leaves_the_user_model_untouched() -> None:
    model = Small().train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    x = torch.randn(2, 16, 8, 8)
    before = model(x)
    model.train()
    prepared = qdq.prepare(model, (x,))
    assert model.training and prepared.training  # training flag mirrored, not forced
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not any(isinstance(m, qdq.Quantizer) for m in model.modules())
    model.eval()
    assert torch.equal(model(x), before)


def test_calibrated_model_tracks_float_model_and_keeps_parameter_names() -> None:
    model = Small().eval()
    prepared = qdq.prepare(model, (torch.randn(1, 16, 8, 8),))
    qdq.calibrate(prepared, _data(), show_progress=False)
    x = torch.randn(8, 16, 8, 8)
    cos = nn.functional.cosine_similarity(prepared(x).flatten(), model(x).flatten(), dim=0)
    assert cos > 0.999
    keys = set(prepared.state_dict())
    assert {"conv.weight", "conv.bias", "fc.weight"} <= keys
    assert "conv.weight_quantizer.amax" in keys and "conv.input_quantizer.amax" in keys


@pytest.mark.parametrize("mode", ["calibrate", "quantize"])
def test_quantized_inputs_are_not_kept_to_the_end_of_the_forward(mode: str) -> None:
    # the runtime quantizes a tensor once and shares the copy among its readers (S01), but must
    # not keep the tensors it saw until the forward ends: that held every quantized activation at
    # once (EfficientNet-Lite0's calibration took 1.95x its FP32 pass instead of 1.27x)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
    )  # fmt: skip
    full = QuantConfig.tensorrt(disable=("performance",))
    prepared = qdq.prepare(net, (torch.randn(1, 3, 8, 8),), config=full)
    quantizers = qdq.quantizers_of(prepared)
    data = [torch.randn(2, 3, 8, 8)]
    if mode == "quantize":
        qdq.calibrate(prepared, data, show_progress=False)
    refs: dict[str, weakref.ref[torch.Tensor]] = {}
    alive: list[dict[str, bool]] = []

    def keep(name: str) -> Any:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> None:
            refs[name] = weakref.ref(out)

        return hook

    prepared[1].register_forward_hook(keep("input of conv 2"))
    quantizers["2.input_quantizer"].register_forward_hook(keep("its quantized copy"))
    prepared[4].register_forward_pre_hook(
        lambda module, args: alive.append({k: r() is not None for k, r in refs.items()})
    )
    if mode == "calibrate":
        qdq.calibrate(prepared, data, show_progress=False)
    else:
        with torch.no_grad():
            prepared(data[0])
    assert alive == [{"input of conv 2": False, "its quantized copy": False}]


class _SkipBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


def test_a_tensor_read_twice_is_quantized_once_while_alive() -> None:
    # x is read by conv1 and by the residual add, which shares conv1's input quantizer (S01):
    # one call per forward, in calibration (one collection) and in quantize mode
    full = QuantConfig.tensorrt(disable=("performance",))
    prepared = qdq.prepare(_SkipBlock().eval(), (torch.randn(1, 3, 8, 8),), config=full)
    quantizer = qdq.quantizers_of(prepared)["conv1.input_quantizer"]
    calls: list[int] = []
    quantizer.register_forward_hook(lambda module, args, out: calls.append(1))
    data = [torch.randn(2, 3, 8, 8)]
    qdq.calibrate(prepared, data, show_progress=False)
    assert len(calls) == 1 and quantizer.calibrator.num_batches == 1
    with torch.no_grad():
        prepared(data[0])
    assert len(calls) == 2


def test_group_members_hold_one_amax_after_calibration() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(16, 16, 3, padding=1)
            self.b = nn.Conv2d(16, 16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(x)

    prepared = qdq.prepare(Two().eval(), (torch.randn(1, 16, 8, 8),))
    qdq.calibrate(prepared, _data(), method="max", show_progress=False)
    plan = qdq.plan_of(prepared)
    group = plan.group_of("a:input")
    assert group is not None and set(group.members) == {"a:input", "b:input"}
    q = prepared.get_submodule(group.quantizer)
    assert isinstance(q, qdq.Quantizer)
    assert q.amax.item() == max(float(d.abs().max()) for d in _data())


def test_calibrate_accepts_loaders_tuples_dicts_and_forward_loops() -> None:
    model = Small().eval()
    images = torch.cat(_data())
    loader = DataLoader(TensorDataset(images, torch.zeros(len(images))), batch_size=4)
    amaxes = []
    for data in (
        loader,  # (images, labels) tuples: the labels are ignored
        _data(),
        [{"x": b} for b in _data()],
        lambda m: [m(b) for b in _data()],
    ):
        prepared = qdq.prepare(model, (images[:1],))
        qdq.calibrate(prepared, data, method="max", show_progress=False)
        amaxes.append(prepared.get_submodule("conv.input_quantizer").amax.item())
    assert len(set(amaxes)) == 1


def test_calibrate_num_batches_and_methods() -> None:
    prepared = qdq.prepare(Small().eval(), (torch.randn(1, 16, 8, 8),))
    qdq.calibrate(prepared, _data(8), method="max", num_batches=2, show_progress=False)
    q = prepared.get_submodule("conv.input_quantizer")
    assert q.calibrator.num_batches == 2
    assert q.amax.item() == max(float(d.abs().max()) for d in _data(2))
    qdq.calibrate(prepared, _data(), method="percentile", percentile=99.0, show_progress=False)
    assert q.amax.item() < max(float(d.abs().max()) for d in _data())


def test_calibrate_errors() -> None:
    prepared = qdq.prepare(Small().eval(), (torch.randn(1, 16, 8, 8),))
    with pytest.raises(qdq.CalibrationError, match="no batches"):
        qdq.calibrate(prepared, [], show_progress=False)
    with pytest.raises(TypeError, match="calibration batch 0 is a str; expected a tensor"):
        qdq.calibrate(prepared, ["not a tensor"], show_progress=False)
    with pytest.raises(ValueError, match="num_batches must be an int >= 1"):
        qdq.calibrate(prepared, _data(), num_batches=0)
    bad = [torch.full((1, 16, 8, 8), float("nan"))]
    with pytest.raises(
        qdq.CalibrationError, match=r"'conv:input': calibration batch 0 contains NaN"
    ):
        qdq.calibrate(prepared, bad, show_progress=False)
    with pytest.raises(ValueError, match="not returned by qdq.prepare"):
        qdq.calibrate(Small(), _data())


def test_uncalibrated_prepared_model_names_the_quantizer() -> None:
    prepared = qdq.prepare(Small().eval(), (torch.randn(1, 16, 8, 8),))
    with pytest.raises(RuntimeError, match="'conv:input' has no amax"):
        prepared(torch.randn(1, 16, 8, 8))


def test_prepare_bad_input() -> None:
    with pytest.raises(TypeError, match="wrap a single tensor"):
        qdq.prepare(Small(), torch.randn(1, 16, 8, 8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        qdq.prepare("model", (torch.randn(1),))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a QuantConfig"):
        qdq.prepare(Small(), (torch.randn(1, 16, 8, 8),), config={"x": 1})  # type: ignore[arg-type]


def test_data_dependent_control_flow_is_recorded_and_noted() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow
                return self.conv(x)
            return self.conv(-x)

    prepared = qdq.prepare(Branchy(), (torch.randn(1, 3, 8, 8),), fallback=False)
    plan = qdq.plan_of(prepared)
    assert plan.capture == "recorded"
    assert any("control flow in <root>" in n for n in plan.notes), plan.notes
    assert plan.point("conv:input").decision == "quantize"
    qdq.calibrate(prepared, [torch.randn(2, 3, 8, 8), -torch.rand(2, 3, 8, 8)], show_progress=False)
    calls: list[int] = []
    h = prepared.conv.input_quantizer.register_forward_hook(lambda *a: calls.append(1))
    for x in (torch.rand(1, 3, 8, 8), -torch.rand(1, 3, 8, 8)):  # both branches are quantized
        prepared(x)
    h.remove()
    assert calls == [1, 1]


def test_model_failing_on_its_example_inputs_is_a_clear_error() -> None:
    net = nn.Sequential(nn.Conv2d(3, 16, 3))
    with pytest.raises(ValueError, match="Sequential raises on the example inputs"):
        qdq.prepare(net, (torch.randn(1, 4, 8, 8),))


def test_unrecordable_model_falls_back_to_call_site_replacement(monkeypatch) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(16, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            y = y + self.conv(y)  # called twice: one weight and one input quantizer
            return self.fc(torch.flatten(self.pool(y), 1))

    def broken(*args, **kwargs):
        raise RuntimeError("recorder failure")

    monkeypatch.setattr("qdq.graph.record._Recorder.on_call", broken)
    model = Net().eval()
    with pytest.raises(CaptureError, match="recorder failure"):
        qdq.prepare(model, (torch.randn(1, 16, 8, 8),), fallback=False)
    with pytest.warns(UserWarning, match="could not be recorded.*NOT placed"):
        prepared = qdq.prepare(model, (torch.randn(1, 16, 8, 8),))
    monkeypatch.undo()
    plan = qdq.plan_of(prepared)
    assert plan.capture == "replacement"
    assert {c.module: c.status for c in plan.coverage} == {"conv": "int8", "fc": "int8"}
    assert plan.point("pool:input").rule == "P06"
    assert "weight_quantizer" not in dict(
        model.conv.named_children()
    )  # the user's model is untouched
    qdq.calibrate(prepared, _data(), show_progress=False)
    x = torch.randn(4, 16, 8, 8)
    with qdq.quantizer_mode(prepared, "bypass"):
        ref = prepared(x)
    torch.testing.assert_close(ref, model(x))
    cos = nn.functional.cosine_similarity(prepared(x).flatten(), ref.flatten(), dim=0)
    assert cos > 0.999


def test_plan_is_printable_and_serialisable() -> None:
    plan = qdq.plan_of(qdq.prepare(Small().eval(), (torch.randn(1, 16, 8, 8),)))
    text = str(plan)
    assert "conv:input" in text and "P01" in text and "Conv/Linear modules" in text
    assert '"rule": "P01"' in plan.to_json()
    counts = plan.counts()
    assert counts["quantize"]["P01"] == 4 and counts["quantize"]["P06"] == 1


class _StdConv2d(nn.Conv2d):
    """timm's StdConv2d: the weight is standardized in every forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.nn.functional.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6
        ).reshape_as(self.weight)
        return torch.nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


def test_a_weight_standardized_in_forward_is_quantized_per_channel_from_its_value() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(_StdConv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3))
    with torch.no_grad():
        net[0].weight.mul_(7.0).add_(3.0)  # standardizing changes the range a lot
    before = net[0].weight.detach().clone()
    prepared = qdq.prepare(net.eval(), (torch.randn(1, 16, 8, 8),))
    plan = qdq.plan_of(prepared)
    cover = {c.module: c for c in plan.coverage}
    assert cover["0"].status == "int8" and cover["2"].status == "int8"
    point = plan.point("0:weight")
    assert point.quantized and point.spec is not None and point.spec.axis == 0
    quantizer = prepared.get_submodule("0.weight_quantizer")
    w = net[0].weight.detach().reshape(32, -1)
    var = w.var(1, unbiased=False, keepdim=True)
    standardized = (w - w.mean(1, keepdim=True)) / torch.sqrt(var + 1e-6)
    expected = standardized.abs().amax(1)
    assert torch.allclose(quantizer.amax.flatten(), expected, rtol=1e-5)
    assert not torch.allclose(quantizer.amax.flatten(), w.abs().amax(1), rtol=0.1)
    assert torch.equal(net[0].weight, before)  # the user's model is untouched


def test_a_matmul_operand_computed_from_parameters_stays_float_with_why() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ (self.w * self.w.norm(dim=0))

    prepared = qdq.prepare(Scaled().eval(), (torch.randn(2, 16),))
    point = next(p for p in qdq.plan_of(prepared).points if p.kind == "weight")
    assert not point.quantized and "MatMul operand computed from parameters" in point.reason
