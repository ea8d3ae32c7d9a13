"""The Quantizer module: modes, amax validation, state_dict round trip, messages."""

from __future__ import annotations

import io

import pytest
import torch

from qdq import CalibrationError, CalibSpec, Quantizer, QuantMode, QuantSpec, quantizer_mode
from qdq.quant import fake_quant


def test_calibrate_then_quantize_equals_fake_quant() -> None:
    q = Quantizer(name="x")
    x = torch.randn(1000)
    with quantizer_mode(q, "calibrate"):
        assert torch.equal(q(x), x)  # calibration does not change the data
    amax = q.load_calib_amax("max")
    assert amax.item() == x.abs().max().item()
    assert torch.equal(q(x), fake_quant(x, amax))


def test_every_method_from_one_collection() -> None:
    q = Quantizer(QuantSpec(), CalibSpec(method="percentile", percentile=99.0), name="act")
    q.mode = "calibrate"
    for _ in range(5):
        q(torch.relu(torch.randn(2000)))
    values = {m: q.load_calib_amax(m).item() for m in ("max", "entropy", "mse", "percentile")}
    assert values["percentile"] < values["max"]
    assert q.load_calib_amax().item() == values["percentile"]  # default: the spec's method


def test_per_channel_weight_quantizer() -> None:
    w = torch.randn(8, 4, 3, 3)
    q = Quantizer(QuantSpec(axis=0), name="conv.weight")
    assert q.calib.calibrator == "max"
    q.mode = QuantMode.CALIBRATE
    q(w)
    amax = q.load_calib_amax()
    assert amax.shape == (8,)
    q.mode = QuantMode.QUANTIZE
    assert torch.equal(q(w), fake_quant(w, amax, axis=0))


def test_quantize_without_amax_names_the_quantizer() -> None:
    with pytest.raises(RuntimeError, match="'layer1.input' has no amax"):
        Quantizer(name="layer1.input")(torch.ones(2))


def test_bad_calibration_data_names_quantizer_and_batch() -> None:
    q = Quantizer(name="stem.input")
    q.mode = "calibrate"
    q(torch.ones(3))
    with pytest.raises(CalibrationError, match=r"'stem.input': calibration batch 1 contains NaN"):
        q(torch.tensor([1.0, float("nan")]))
    empty = Quantizer(name="head.input")
    with pytest.raises(CalibrationError, match="'head.input'.*no data"):
        empty.load_calib_amax()


def test_set_amax_validates() -> None:
    q = Quantizer(name="q")
    with pytest.raises(ValueError, match="negative"):
        q.set_amax(-1.0)
    with pytest.raises(ValueError, match="non-finite"):
        q.set_amax(float("nan"))
    with pytest.raises(ValueError, match="per-tensor"):
        q.set_amax(torch.ones(3))
    with pytest.raises(ValueError, match="unknown mode 'train'"):
        q.mode = "train"


def test_bypass_returns_input_object() -> None:
    q = Quantizer()
    q.mode = "bypass"
    x = torch.ones(3)
    assert q(x) is x


def test_mode_context_restores_on_error() -> None:
    net = torch.nn.Sequential(Quantizer(name="a"), Quantizer(name="b"))
    net[1].mode = "bypass"
    with pytest.raises(KeyError), quantizer_mode(net, "calibrate") as qs:
        assert [q.mode for q in qs] == [QuantMode.CALIBRATE] * 2
        raise KeyError("boom")
    assert [net[0].mode, net[1].mode] == [QuantMode.QUANTIZE, QuantMode.BYPASS]


def test_state_dict_round_trip_restores_amax_shape() -> None:
    src = Quantizer(QuantSpec(axis=0), name="w")
    src.set_amax(torch.tensor([0.5, 1.0, 2.0]))
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    dst = Quantizer(QuantSpec(axis=0), name="w")
    dst.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(dst.amax, src.amax)
    assert dst.is_calibrated


def test_repr_shows_amax_and_mode() -> None:
    q = Quantizer(name="layer1.0.conv1.input")
    assert "amax=None" in repr(q) and "mode=quantize" in repr(q)
    q.set_amax(2.5)
    assert "amax=2.5" in repr(q)
    w = Quantizer(QuantSpec(axis=0), name="w")
    w.set_amax(torch.tensor([0.25, 4.0]))
    assert "amax=[2] 0.25..4" in repr(w) and "axis=0" in repr(w)


def test_gradients_flow_through_quantizer() -> None:
    q = Quantizer()
    q.set_amax(1.0)
    x = torch.tensor([0.5, 2.0], requires_grad=True)
    q(x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 0.0]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="num_bits must be in 2..8"):
        QuantSpec(num_bits=16)
    with pytest.raises(TypeError, match="axis must be an int"):
        QuantSpec(axis="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        CalibSpec(method="kl")
    with pytest.raises(ValueError, match="calibrator='max' only supports"):
        CalibSpec(calibrator="max", method="entropy")
    with pytest.raises(ValueError, match="percentile must be in"):
        CalibSpec(method="percentile", percentile=0.0)


@pytest.mark.gpu
def test_quantizer_on_cuda() -> None:
    q = Quantizer().cuda()
    q.mode = "calibrate"
    x = torch.randn(10_000, device="cuda")
    q(x)
    q.load_calib_amax("entropy")
    q.mode = "quantize"
    assert q.amax.device.type == "cuda"
    assert torch.equal(q(x).cpu(), fake_quant(x.cpu(), q.amax.cpu()))


def test_the_kept_scale_follows_the_amax_and_the_inference_mode() -> None:
    """A quantizer keeps its scale per amax value (issue 48): a new amax (set_amax, a state
    dict, an in-place write) gives the new scale, and a scale made under inference_mode is not
    the one a training forward saves for backward."""
    q = Quantizer(name="x:input")
    q.set_amax(1.27)
    x = torch.tensor([0.5, 1.0, 3.0], requires_grad=True)
    assert q(x).tolist() == pytest.approx([0.5, 1.0, 1.27])
    q.set_amax(2.54)
    assert q(x).tolist() == pytest.approx([0.5, 1.0, 2.54])
    with torch.no_grad():
        q.amax.mul_(0.5)  # in place: the version counter moves
    assert q(x).tolist() == pytest.approx([0.5, 1.0, 1.27])
    q.load_state_dict({**q.state_dict(), "amax": torch.tensor(2.54)})
    assert q(x).tolist() == pytest.approx([0.5, 1.0, 2.54])
    with torch.inference_mode():
        q(x.detach())
    q(x).sum().backward()  # would fail on an inference tensor saved for backward
    assert x.grad is not None and x.grad.tolist() == [1.0, 1.0, 0.0]
