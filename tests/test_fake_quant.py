"""fake_quant: bit-exact against ONNX Runtime Q/DQ, STE gradients, bad input, properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ort_helpers import ort_qdq
from qdq.quant import MIN_SCALE, fake_quant, quant_range, scale_from_amax

pytest.importorskip("onnxruntime")


def _assert_same_as_ort(x: torch.Tensor, amax: torch.Tensor, axis: int | None) -> None:
    ours = fake_quant(x, amax, axis=axis).numpy()
    theirs = ort_qdq(x.numpy(), scale_from_amax(amax).numpy(), axis)
    differing = int(np.sum(ours.view(np.int32) != theirs.view(np.int32)))
    assert differing == 0, f"{differing} values differ from ONNX Runtime"


def test_per_tensor_random_matches_ort() -> None:
    g = torch.Generator().manual_seed(0)
    for amax in (0.01, 0.37, 1.0, 3.3, 1234.5):
        x = torch.randn(100_000, generator=g) * amax * 1.3
        _assert_same_as_ort(x, torch.tensor(amax), None)


def test_exact_half_ties_round_to_even_like_ort() -> None:
    # scale = 2**-4 (amax = 127/16), so x / scale is exact and k + 0.5 is a true tie
    amax = torch.tensor(127.0 / 16.0)
    k = torch.arange(-140, 140, dtype=torch.float32)
    x = (k + 0.5) / 16.0
    out = fake_quant(x, amax)
    expected = torch.clamp(torch.round(k + 0.5), -128, 127) / 16.0
    assert torch.equal(out, expected)
    assert out[k == 2].item() == 2.0 / 16.0  # 2.5 -> 2 (even), not 3
    assert out[k == 3].item() == 4.0 / 16.0  # 3.5 -> 4
    _assert_same_as_ort(x, amax, None)


def test_saturation_and_huge_values_match_ort() -> None:
    x = torch.tensor([1e30, -1e30, 3.4e38, -3.4e38, 126.9, -128.6, -200.0, 0.0, -0.0])
    _assert_same_as_ort(x, torch.tensor(127.0), None)
    out = fake_quant(x, torch.tensor(127.0))
    assert out[0] == 127.0 and out[1] == -128.0  # full int8 range, asymmetric by one code


@pytest.mark.parametrize(("shape", "axis"), [((16, 3, 3, 3), 0), ((4, 8, 5), 1), ((7, 9), 0)])
def test_per_channel_matches_ort(shape: tuple[int, ...], axis: int) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g) * 2
    amax = torch.rand(shape[axis], generator=g) * 3 + 0.01
    _assert_same_as_ort(x, amax, axis)


def test_zero_and_tiny_amax_are_finite_and_match_ort() -> None:
    x = torch.tensor([[0.0, 0.0, 0.0], [1e-9, -1e-12, 0.5], [1.0, 2.0, -3.0]])
    amax = torch.tensor([0.0, 1e-30, 3.0])
    out = fake_quant(x, amax, axis=0)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(3))
    assert scale_from_amax(amax)[:2].eq(MIN_SCALE).all()
    _assert_same_as_ort(x, amax, 0)


def test_half_precision_inputs_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(2)
    x32 = torch.randn(4096, generator=g)
    for dtype in (torch.float16, torch.bfloat16):
        x = x32.to(dtype)
        out = fake_quant(x, torch.tensor(2.5))
        assert out.dtype == dtype
        ref = fake_quant(x.to(torch.float32), torch.tensor(2.5)).to(dtype)
        assert torch.equal(out, ref)


def test_narrow_range_never_emits_minus_128() -> None:
    out = fake_quant(torch.tensor([-5.0, 5.0]), 1.27, narrow_range=True)
    assert torch.allclose(out, torch.tensor([-1.27, 1.27]))
    assert quant_range(4) == (-8, 7)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"amax": -1.0}, ValueError, "negative"),
        ({"amax": float("nan")}, ValueError, "non-finite"),
        ({"amax": float("inf")}, ValueError, "non-finite"),
        ({"amax": torch.ones(3), "axis": 5}, ValueError, "out of range"),
        ({"amax": torch.ones(3), "axis": 0}, ValueError, "per-channel amax has 3"),
        ({"amax": torch.ones(4)}, ValueError, "single amax"),
        ({"amax": 1.0, "num_bits": 9}, ValueError, "num_bits"),
        ({"amax": 1.0, "axis": 0.5}, TypeError, "axis"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        fake_quant(torch.ones(4, 2), **kwargs)


def test_integer_input_is_rejected() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        fake_quant(torch.ones(3, dtype=torch.int32), 1.0)


def test_ste_gradient_passes_inside_and_zero_outside() -> None:
    x = torch.tensor([-3.0, -1.0, -0.2, 0.0, 0.7, 1.0, 1.01, 5.0], requires_grad=True)
    fake_quant(x, 1.0).sum().backward()
    assert x.grad is not None
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_amax_gradient_is_lsq() -> None:
    amax = torch.tensor(1.27, requires_grad=True)
    x = torch.tensor([0.004, 2.0, -3.0])  # inside, clipped high, clipped low
    fake_quant(x, amax).sum().backward()
    scale = 1.27 / 127
    inside = round(0.004 / scale) - 0.004 / scale
    expected = (inside + 127 - 128) / 127
    assert amax.grad is not None
    assert amax.grad.item() == pytest.approx(expected, rel=1e-5)


def test_per_channel_amax_gradient_has_channel_shape() -> None:
    amax = torch.tensor([1.0, 2.0], requires_grad=True)
    fake_quant(torch.randn(2, 5) * 3, amax, axis=0).sum().backward()
    assert amax.grad is not None and amax.grad.shape == (2,)


finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
amaxes = st.floats(2.0**-10, 1024.0, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64), amaxes)
def test_idempotent(values: list[float], amax: float) -> None:
    x = torch.tensor(values)
    once = fake_quant(x, amax)
    assert torch.equal(fake_quant(once, amax), once)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64), amaxes)
def test_error_at_most_half_a_step_inside_range(values: list[float], amax: float) -> None:
    x = torch.tensor(values)
    a = torch.tensor(amax)
    inside = x.abs() <= a
    scale = scale_from_amax(a)
    err = (fake_quant(x, a) - x).abs()[inside]
    # half a step, plus float32 rounding of x/scale and q*scale
    assert bool((err <= scale / 2 + 4 * torch.finfo(torch.float32).eps * a).all())


@settings(max_examples=100, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64), amaxes)
def test_ste_gradient_is_indicator_of_range(values: list[float], amax: float) -> None:
    x = torch.tensor(values, requires_grad=True)
    fake_quant(x, amax).backward(torch.ones(len(values)))
    assert x.grad is not None
    a = scale_from_amax(torch.tensor(amax)) * 127
    assert torch.equal(x.grad, (x.detach().abs() <= a).float())


def test_output_codes_are_integers_of_the_scale() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10_000, generator=g) * 4
    amax = torch.tensor(3.0)
    scale = scale_from_amax(amax)
    out = fake_quant(x, amax)
    codes = torch.round(out / scale)
    assert torch.equal(out, codes * scale)  # every output is exactly DequantizeLinear(code)
    assert codes.min() >= -128 and codes.max() <= 127


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_without_gradients_the_same_bits_come_without_an_autograd_node(dtype, axis) -> None:
    """Evaluation (no gradient wanted) takes the values alone, no autograd node (host time per
    call, issue 48): bit for bit what the differentiable path returns, signed zeros included."""
    from qdq.quant.primitives import fake_quant_unchecked

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(8, 5, 7, generator=g) * 3).to(dtype)
    x.view(-1)[:5] = torch.tensor([-0.0, 0.0, 1e-30, -1e-30, 100.0]).to(dtype)
    n = 1 if axis is None else x.shape[axis]
    amax = (torch.rand(n, generator=g) * 2 + 1e-3).reshape(() if axis is None else (n,))
    with torch.no_grad():
        plain = fake_quant_unchecked(x, amax, axis=axis)
    assert plain.grad_fn is None
    graded = fake_quant_unchecked(x.clone().requires_grad_(True), amax, axis=axis)
    assert graded.grad_fn is not None
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(plain.view(bits), graded.detach().view(bits))
