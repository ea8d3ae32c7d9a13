"""qdq.compat.pytorch_quantization's numerics against written-out references of upstream's formulas.

Upstream (NVIDIA pytorch_quantization 2.2.1) quantizes with ``scale = bound / amax`` (one float32
division), ``round(x * scale)`` half to even, clamp, ``/ scale``; its CUDA kernel does the same in
float32 per element and is launched without ``narrow_range``. The references below are numpy (IEEE
float32/float16 arithmetic), so a torch op that rounds differently (``number / tensor`` is
``reciprocal * number`` in torch) shows up as a mismatch.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from qdq.compat.pytorch_quantization import cuda_ext, tensor_quant, utils
from qdq.compat.pytorch_quantization.nn import functional as qf
from qdq.compat.pytorch_quantization.nn.modules.clip import Clip
from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

EPS = 2.0**-24


def _ref_codes(x, amax, num_bits, unsigned, narrow_range, tiny_inclusive=True):
    """Upstream's legacy formula in numpy float32: (codes, scale with 1 where amax is tiny)."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.asarray(amax, dtype=np.float32)
    bound = np.float32(2.0 ** (num_bits - 1 + int(unsigned)) - 1)
    low = 0 if unsigned else (-bound if narrow_range else -bound - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = bound / amax
        tiny = amax <= EPS if tiny_inclusive else amax < EPS
        scale = np.where(tiny, np.float32(0), scale).astype(np.float32)
        codes = np.clip(np.round(x * scale), low, bound).astype(np.float32)
    return codes, np.where(tiny, np.float32(1), scale).astype(np.float32)


def _ref_fake(x, amax, num_bits=8, unsigned=False, narrow_range=True):
    codes, scale = _ref_codes(x, amax, num_bits, unsigned, narrow_range)
    return codes / scale


def _ref_kernel(x, amax, num_bits=8, unsigned=False):
    """The CUDA kernel: float32, always narrow, amax < 2**-24 gives 0."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.asarray(amax, dtype=np.float32)
    bound = np.float32((1 << (num_bits - 1 + int(unsigned))) - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = bound / amax
        out = np.clip(np.round(x * scale), -bound, bound) / scale
    return np.where(amax < EPS, np.float32(0), out).astype(np.float32)


def _bits_equal(a: torch.Tensor, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a.detach().numpy().view(np.uint32), b.view(np.uint32))


def _rand(*shape, seed=0, scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# ---------------------------------------------------------------- integer quantization (legacy/CPU)
@pytest.mark.parametrize("num_bits", [2, 4, 8, 11, 16])
@pytest.mark.parametrize(
    ("unsigned", "narrow_range"), [(False, True), (False, False), (True, False)]
)
def test_fake_tensor_quant_is_upstreams_formula_bit_for_bit(num_bits, unsigned, narrow_range):
    x = _rand(4096, seed=num_bits)
    if unsigned:
        x = x.abs()
    amax = x.abs().max() * 0.8  # some values saturate
    out = tensor_quant.fake_tensor_quant(x, amax, num_bits, unsigned, narrow_range)
    _bits_equal(out, _ref_fake(x.numpy(), amax.numpy(), num_bits, unsigned, narrow_range))
    codes, scale = tensor_quant.tensor_quant(x, amax, num_bits, unsigned, narrow_range)
    ref_codes, ref_scale = _ref_codes(x.numpy(), amax.numpy(), num_bits, unsigned, narrow_range)
    _bits_equal(codes, ref_codes)
    _bits_equal(scale, ref_scale)
    legacy = tensor_quant.legacy_fake_tensor_quant(x, amax, num_bits, unsigned, narrow_range)
    assert torch.equal(legacy, out)


def test_the_scale_is_one_float32_division_not_a_reciprocal():
    # 127 / amax and 127 * (1 / amax) differ on about a quarter of float32 values
    amax = torch.rand(20000, generator=torch.Generator().manual_seed(1)) + 0.01
    _, scale = tensor_quant.tensor_quant(torch.zeros(20000), amax)
    _bits_equal(scale, (np.float32(127) / amax.numpy()).astype(np.float32))
    assert not torch.equal(scale, 127 / amax)  # the trap this guards against


def test_ties_round_half_to_even_and_saturation():
    amax = torch.tensor(127.0)  # scale 1: codes are round(x)
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 200.0, -200.0, -127.6])
    assert tensor_quant.fake_tensor_quant(x, amax).tolist() == [
        0.0, 2.0, 2.0, -0.0, -2.0, 126.0, 127.0, -127.0, -127.0,
    ]  # fmt: skip
    full = tensor_quant.fake_tensor_quant(x, amax, 8, False, False)
    assert full[-2:].tolist() == [-128.0, -128.0]
    u = tensor_quant.fake_tensor_quant(
        torch.tensor([0.5, 254.5, 300.0]), torch.tensor(255.0), 8, True
    )
    assert u.tolist() == [0.0, 254.0, 255.0]


def test_unsigned_negative_input_and_negative_amax_are_refused_with_upstreams_messages():
    with pytest.raises(TypeError, match="Negative values encountered in unsigned quantization"):
        tensor_quant.fake_tensor_quant(torch.tensor([-0.1, 1.0]), torch.tensor(1.0), 8, True)
    with pytest.raises(TypeError, match="Negative values encountered"):
        tensor_quant.tensor_quant(torch.tensor([-0.1, 1.0]), torch.tensor(1.0), 8, True)
    with pytest.raises(ValueError, match="Negative values in amax"):
        tensor_quant.fake_tensor_quant(torch.ones(3), torch.tensor([1.0, -1.0, 1.0]))


def test_tiny_and_zero_amax_quantize_to_zero_with_scale_one():
    x = _rand(3, 4, seed=2)
    amax = torch.tensor([[1.0], [0.0], [EPS]])  # amax == 2**-24 counts as tiny (<=)
    codes, scale = tensor_quant.tensor_quant(x, amax)
    assert codes[1:].abs().sum() == 0 and scale[1:].flatten().tolist() == [1.0, 1.0]
    out = tensor_quant.fake_tensor_quant(x, amax)
    assert out[1:].abs().sum() == 0 and torch.isfinite(out).all()
    _bits_equal(out, _ref_fake(x.numpy(), amax.numpy()))
    # the kernel's test is amax < 2**-24: exactly 2**-24 still quantizes (to +-127 * 2**-24 / 127)
    k = cuda_ext.fake_tensor_quant_with_axis(torch.full((3, 2), 1.0), amax.flatten(), 0)
    assert k[1].abs().sum() == 0 and k[2].tolist() == [EPS, EPS]


def test_per_channel_and_multi_axis_amax_broadcast():
    x = _rand(4, 3, 5, 6, seed=3)
    per_channel = x.abs().amax(dim=(1, 2, 3), keepdim=True) * 0.7
    _bits_equal(
        tensor_quant.fake_tensor_quant(x, per_channel), _ref_fake(x.numpy(), per_channel.numpy())
    )
    multi = utils.reduce_amax(x, axis=(1, 3)) * 0.9  # one amax per (axis 0, axis 2) pair
    assert multi.shape == (4, 1, 5, 1)
    out = tensor_quant.fake_tensor_quant(x, multi, 6, False, False)
    _bits_equal(out, _ref_fake(x.numpy(), multi.numpy(), 6, False, False))


def test_float16_inputs_compute_in_float32_and_divide_in_float16():
    x = _rand(2048, seed=4).half()
    amax = x.abs().max()  # float16 amax is promoted too
    codes, scale = tensor_quant.tensor_quant(x, amax)
    ref_codes, ref_scale = _ref_codes(x.float().numpy(), amax.float().numpy(), 8, False, True)
    assert codes.dtype == torch.float16 and scale.dtype == torch.float16
    np.testing.assert_array_equal(codes.float().numpy(), ref_codes)
    assert scale.item() == np.float16(ref_scale).item()
    out = tensor_quant.fake_tensor_quant(x, amax)
    ref = ref_codes.astype(np.float16) / np.float16(ref_scale)
    np.testing.assert_array_equal(out.numpy().view(np.uint16), ref.view(np.uint16))


def test_float16_scale_overflow():
    x = _rand(64, seed=5).half()
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant.tensor_quant(x, torch.tensor(1e-4).half())
    out = tensor_quant.fake_tensor_quant(x, torch.tensor(1e-4).half())
    assert torch.isfinite(out).all()


def test_python_number_amax_is_a_float32_tensor():
    x = _rand(100, seed=6)
    assert torch.equal(
        tensor_quant.fake_tensor_quant(x, 2.5), tensor_quant.fake_tensor_quant(x, torch.tensor(2.5))
    )


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("fn", ["fake", "legacy", "codes"])
def test_straight_through_gradient_with_clipping_and_no_amax_gradient(fn):
    x = torch.tensor([-3.0, -1.0, -0.2, 0.0, 0.7, 1.0, 2.0], requires_grad=True)
    amax = torch.tensor(1.0, requires_grad=True)
    if fn == "fake":
        out = tensor_quant.fake_tensor_quant(x, amax)
    elif fn == "legacy":
        out = tensor_quant.legacy_fake_tensor_quant(x, amax)
    else:
        out = tensor_quant.tensor_quant(x, amax)[0]
    (out * torch.arange(1.0, 8.0)).sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0]  # |x| <= amax passes
    assert amax.grad is None


def test_per_channel_gradient_mask():
    x = torch.tensor([[0.5, 1.5], [0.5, 1.5]], requires_grad=True)
    amax = torch.tensor([[1.0], [2.0]])
    tensor_quant.fake_tensor_quant(x, amax).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_affine_values_and_gradient():
    x = torch.tensor([-1.0, -13.0, -101.0, -128.0, 0.0, 2.0, 5.0, 13.0, 93.0, 111.0, 127.0])
    np.testing.assert_allclose(
        tensor_quant.fake_affine_tensor_quant(x, x.min(), x.max()), x, atol=1e-5
    )
    xg = torch.tensor([-2.0, -0.5, 0.5, 3.0], requires_grad=True)
    out = tensor_quant.fake_affine_tensor_quant(xg, torch.tensor(-1.0), torch.tensor(1.0), 4)
    out.sum().backward()
    assert xg.grad.tolist() == [0.0, 1.0, 1.0, 0.0]
    step = 2.0 / 15
    assert out[1].item() == pytest.approx(round(-0.5 / step) * step, abs=1e-6)


# ---------------------------------------------------------------- cuda_ext (the kernel's values)
@pytest.mark.parametrize("num_bits", [3, 8, 11])
@pytest.mark.parametrize("unsigned", [False, True])
def test_cuda_ext_is_the_kernels_formula(num_bits, unsigned):
    x = _rand(3000, seed=7)
    x = x.abs() if unsigned else x
    amax = x.abs().max() * 0.75
    for narrow in (True, False):  # the kernel is launched without it: always narrow
        out = cuda_ext.fake_tensor_quant(x, amax, num_bits, unsigned, narrow)
        _bits_equal(out, _ref_kernel(x.numpy(), amax.numpy(), num_bits, unsigned))
    assert (
        cuda_ext.fake_tensor_quant(torch.tensor([-5.0]), torch.tensor(1.0), 8, False, False).item()
        == -1.0
    )
    # float32: the kernel and the legacy formula agree when narrow
    assert torch.equal(
        cuda_ext.fake_tensor_quant(x, amax, num_bits, unsigned),
        tensor_quant.legacy_fake_tensor_quant(x, amax, num_bits, unsigned),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_cuda_ext_other_dtypes_go_through_float32(dtype):
    x = _rand(2, 4, 50, seed=8).to(dtype)
    amax = torch.tensor([1.0, 2.0, 0.5, 3.0])
    out = cuda_ext.fake_tensor_quant_with_axis(x, amax, 1)
    ref = _ref_kernel(x.float().numpy(), amax.reshape(1, 4, 1).numpy())
    assert out.dtype == dtype
    assert torch.equal(out, torch.from_numpy(ref).to(dtype))


def test_cuda_ext_in_place_axis_and_errors():
    x = _rand(3, 5, seed=9)
    ref = cuda_ext.fake_tensor_quant(x, torch.tensor(2.0))
    y = x.clone()
    assert cuda_ext.fake_tensor_quant_(y, torch.tensor(2.0)) is None and torch.equal(y, ref)
    amax = torch.tensor([1.0, 1e-26, 2.0]).reshape(1, 3, 1)  # read flat, as the kernel
    out = cuda_ext.fake_tensor_quant_with_axis(_rand(2, 3, 4, seed=1), amax, axis=1)
    assert out[:, 1].abs().sum() == 0
    with pytest.raises(RuntimeError, match="amax has 2 values"):
        cuda_ext.fake_tensor_quant_with_axis(x, torch.ones(2), 0)
    with pytest.raises(RuntimeError, match="one-element amax"):
        cuda_ext.fake_tensor_quant(x, torch.ones(3))
    with pytest.raises(RuntimeError, match="Negative values"):
        cuda_ext.fake_tensor_quant(x, torch.tensor(1.0), 8, True)
    with pytest.raises(RuntimeError, match="amax must be >= 0"):
        cuda_ext.fake_tensor_quant(x, torch.tensor(-1.0))


# ---------------------------------------------------------------- FP8 E4M3
def _e4m3_table() -> np.ndarray:
    """Every non-negative finite E4M3 value, in code order (code 0x7F is NaN)."""
    values = [m * 2.0**-9 for m in range(8)]  # exponent field 0: subnormals
    values += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)]
    return np.array(values[:127])


def _ref_e4m3(x: np.ndarray) -> np.ndarray:
    """Nearest E4M3 value, ties to the even code, |x| > 448 saturated, NaN kept."""
    table = _e4m3_table()
    out = np.empty_like(x, dtype=np.float64)
    for i, v in enumerate(x.astype(np.float64)):
        if math.isnan(v):
            out[i] = math.nan
            continue
        a = min(abs(v), 448.0)
        d = np.abs(table - a)
        best = np.flatnonzero(d == d.min())
        code = best[0] if len(best) == 1 else next(c for c in best if c % 2 == 0)
        out[i] = math.copysign(table[code], v)
    return out.astype(np.float32)


def test_fake_e4m3fy_rounding_saturation_and_subnormals():
    special = [2.0**-10, 3 * 2.0**-10, 2.0**-9, 2.0**-11, 1.8, 1.0625, 1.1875, 240.0, 448.0, 460.0,
               464.0, 500.0, 1e9, -1e9, 2.0**-6 * 1.0625, -0.0]  # fmt: skip
    x = np.concatenate([np.array(special, np.float32), (np.random.default_rng(0).standard_normal(3000)
                        * np.float32(50)).astype(np.float32)])  # fmt: skip
    out = cuda_ext.fake_e4m3fy(torch.from_numpy(x))
    _bits_equal(out, _ref_e4m3(x))
    assert out[:4].tolist() == [0.0, 2.0**-8, 2.0**-9, 0.0]
    edge = torch.tensor([math.inf, -math.inf, math.nan])
    res = cuda_ext.fake_e4m3fy(edge)
    assert res[:2].tolist() == [448.0, -448.0] and math.isnan(res[2].item())
    assert cuda_ext.fake_e4m3fy(torch.tensor([1.8], dtype=torch.float16)).dtype == torch.float16


def test_scaled_e4m3_values_tiny_zeroing_and_gradient():
    x = torch.tensor([-2.0, -1.8, -0.2, 0.0, 0.4, 1.4, 1.8, 1e-30])
    out = tensor_quant.scaled_e4m3(x, None)
    _bits_equal(out[:-1], _ref_e4m3(x[:-1].numpy()))
    amax = torch.tensor(2.0)
    scaled = tensor_quant.scaled_e4m3(x, amax)
    scale = 448.0 / amax
    expect = torch.from_numpy(_ref_e4m3((x * scale).numpy())) / scale
    expect[x.abs() < EPS] = 0.0
    assert torch.equal(scaled, expect)
    assert scaled[1].item() == pytest.approx(-1.8571, abs=1e-4)  # upstream's table
    assert tensor_quant.scaled_e4m3(torch.tensor([1e-30]), torch.tensor(1e-30)).item() == 0.0
    xg = torch.tensor([-3.0, 1.0, 2.5], requires_grad=True)
    tensor_quant.scaled_e4m3(xg, torch.tensor(2.0)).sum().backward()
    assert xg.grad.tolist() == [0.0, 1.0, 0.0]
    xg = torch.tensor([-500.0, 400.0], requires_grad=True)
    tensor_quant.scaled_e4m3(xg).sum().backward()
    assert xg.grad.tolist() == [0.0, 1.0]  # 448 without amax
    with pytest.raises(NotImplementedError, match="E=4 & M=3"):
        tensor_quant.scaled_e4m3(x, None, 5, 2)


# ---------------------------------------------------------------- QuantDescriptor
def test_descriptor_fields_amax_type_and_constants():
    d = QuantDescriptor()
    assert (d.num_bits, d.name, d.axis, d.amax, d.calib_method) == (8, None, None, None, "max")
    assert (d.fake_quant, d.unsigned, d.narrow_range, d.learn_amax, d.scale_amax) == (
        True, False, False, False, None,
    )  # fmt: skip
    a = QuantDescriptor(amax=0.7)
    assert (
        isinstance(a.amax, np.ndarray) and a.amax.dtype == np.float32 and a.amax == np.float32(0.7)
    )
    assert QuantDescriptor(amax=[1.3, 1.4]).amax.tolist() == np.float32([1.3, 1.4]).tolist()
    assert QuantDescriptor(num_bits=(4, 3)).num_bits == (4, 3)
    assert QuantDescriptor(num_bits=16, axis=(0, 1, 3)).axis == (0, 1, 3)
    assert tensor_quant.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL.axis == 0
    assert tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL.axis == 1
    assert tensor_quant.QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned
    assert tensor_quant.ScaledQuantDescriptor is QuantDescriptor
    with pytest.raises(AttributeError):
        d.num_bits = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_bits": -1}, ValueError, "num_bits must be > 0, not -1"),
        ({"num_bits": 8.0}, TypeError, "num_bits must be a postive integer or tuple"),
        ({"num_bits": [4, 3]}, TypeError, "tuple \\(4,3\\)"),
        ({"name": 3}, TypeError, "name must be a string or None"),
        ({"amax": "oops"}, TypeError, "amax must be float, list or ndarray"),
        ({"amax": 1}, TypeError, "amax must be float, list or ndarray"),
        ({"amax": torch.tensor(1.0)}, TypeError, "amax must be float, list or ndarray"),
        ({"axis": (1, 2), "learn_amax": True}, TypeError, "axis is ignored and must be None"),
        ({"unknown": 1}, TypeError, "Unused keys: dict_keys\\(\\['unknown'\\]\\)"),
    ],
)
def test_descriptor_errors_are_upstreams(kwargs, error, message):
    with pytest.raises(error, match=message):
        QuantDescriptor(**kwargs)


@pytest.mark.parametrize(
    "desc",
    [
        QuantDescriptor(num_bits=2, name="a", fake_quant=True, axis=(1, 2), amax=3.1415926536),
        QuantDescriptor(num_bits=2, amax=0.1, unsigned=True),
        QuantDescriptor(axis=0, amax=[1.0, 2.5], fake_quant=False, scale_amax=2.0),
        QuantDescriptor(num_bits=(4, 3), narrow_range=True, calib_method="histogram"),
        QuantDescriptor(learn_amax=True, amax=1.5),
    ],
)
def test_descriptor_round_trips_through_dict_and_yaml(desc):
    assert QuantDescriptor(**desc.dict()) == desc
    assert QuantDescriptor.from_yaml(desc.to_yaml()) == desc


def test_descriptor_dict_str_and_equality():
    d = QuantDescriptor(num_bits=4, axis=(0,), amax=[1.0, 2.0])
    assert d.dict() == {"num_bits": 4, "name": None, "axis": (0,), "amax": [1.0, 2.0]}
    assert "axis:\n- 0\n" in d.to_yaml()
    assert str(QuantDescriptor()) == "QuantDescriptor(8bit fake axis= per-tensor)"
    s = QuantDescriptor(num_bits=4, name="w", fake_quant=False, axis=0, amax=0.5, learn_amax=False,
                        scale_amax=2.0, unsigned=True)  # fmt: skip
    assert str(s) == "w: (unsigned 4bit real axis=0 amax=0.5 full_range scale_amax=2.0)"
    assert d == QuantDescriptor(num_bits=4, axis=(0,), amax=[1.0, 2.0])
    assert d != QuantDescriptor(num_bits=4, axis=(0,), amax=[1.0, 2.5])
    assert d != QuantDescriptor(num_bits=4, axis=(0,), amax=[1.0, 2.0], narrow_range=True)
    with pytest.raises(TypeError):
        hash(d)


# ---------------------------------------------------------------- utils, clip
def test_reduce_amax_axes_keepdims_and_squeeze():
    x = torch.tensor([[[1.0, -4.0]], [[2.0, 0.5]]])  # (2, 1, 2)
    assert utils.reduce_amax(x).item() == 4.0 and utils.reduce_amax(x, keepdims=False).dim() == 0
    assert utils.reduce_amax(x, axis=0).shape == (1, 1, 2)
    assert utils.reduce_amax(x, axis=0, keepdims=False).tolist() == [[2.0, 4.0]]
    assert utils.reduce_amax(x, axis=(0,)).tolist() == [[[2.0, 4.0]]]
    assert utils.reduce_amax(x, axis=(0,), keepdims=False).tolist() == [2.0, 4.0]  # all size-1 dims
    assert utils.reduce_amax(x, axis=(0, 2)).shape == ()  # one value left: squeezed
    with pytest.raises(ValueError, match="Cannot reduce more axes"):
        utils.reduce_amax(x, axis=(0, 1, 2, 0))
    xg = x.clone().requires_grad_()
    assert not utils.reduce_amax(xg).requires_grad


def test_clip_broadcast_values_and_pact_gradients():
    x = _rand(6, 4, seed=10, scale=1.0).requires_grad_()
    lo, hi = torch.tensor(-0.3, requires_grad=True), torch.tensor(0.5, requires_grad=True)
    out = qf.clip(x, lo, hi)
    assert torch.equal(out, x.detach().clamp(-0.3, 0.5))
    g = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    out.backward(g)
    xd = x.detach()
    assert torch.equal(x.grad, torch.where((xd > -0.3) & (xd < 0.5), g, torch.zeros(())))
    assert lo.grad.item() == pytest.approx(g[xd <= -0.3].sum().item(), abs=1e-6)
    assert hi.grad.item() == pytest.approx(g[xd >= 0.5].sum().item(), abs=1e-6)
    lo_c, hi_c = torch.tensor([[-0.1, -0.2, -0.3, -0.4]]), torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    assert torch.equal(
        qf.clip(x.detach(), lo_c, hi_c), torch.max(torch.min(x.detach(), hi_c), lo_c)
    )
    xb = x.detach().clone().requires_grad_()
    qf.clip(xb, lo_c, hi_c).sum().backward()  # fixed per-column bounds train x
    assert xb.grad.sum() > 0
    with pytest.raises(ValueError, match="can only be scalar"):
        qf.clip(x, lo_c.requires_grad_(), hi).sum().backward()


def test_clip_module_learnable_bounds():
    m = Clip(-1.0, 2.0, learn_min=True, learn_max=True)
    assert sorted(m.state_dict()) == ["clip_value_max", "clip_value_min"]
    x = torch.tensor([-3.0, 0.0, 5.0], requires_grad=True)
    m(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 0.0]
    assert m.clip_value_min.grad.item() == 1.0 and m.clip_value_max.grad.item() == 1.0
    fixed = Clip(torch.tensor(0.3), torch.tensor(0.7))
    assert fixed(torch.tensor([0.0, 0.5, 1.0])).tolist() == pytest.approx([0.3, 0.5, 0.7])
    assert list(fixed.state_dict()) == []
    Clip(-np.array(2.0, np.float32), np.array(2.0, np.float32), True, True)  # numpy scalars
    with pytest.raises(ValueError, match="must be scalar"):
        Clip(torch.tensor(0.3), torch.tensor(0.7), learn_min=True)


def test_quant_bounds_helper():
    assert tensor_quant.quant_bounds(8, False, True) == (-127, 127)
    assert tensor_quant.quant_bounds(8, False, False) == (-128, 127)
    assert tensor_quant.quant_bounds(4, True, False) == (0, 15)
    assert tensor_quant.quant_bounds(16, False, False) == (-32768, 32767)


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
def test_cuda_fake_tensor_quant_takes_the_kernel_path():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = _rand(4, 8, 16, seed=11)
    amax = x.abs().amax(dim=(0, 2), keepdim=True) * 0.8
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        xc = x.to(dtype).cuda()
        got = tensor_quant.fake_tensor_quant(xc, amax.cuda(), 8, False, False).cpu()
        want = cuda_ext.fake_tensor_quant_with_axis(x.to(dtype), amax.flatten(), 1)  # always narrow
        assert torch.equal(got, want)
        per_tensor = tensor_quant.fake_tensor_quant(xc, amax.max().cuda()).cpu()
        assert torch.equal(per_tensor, cuda_ext.fake_tensor_quant(x.to(dtype), amax.max()))
    e = torch.linspace(-500, 500, 4001)
    assert torch.equal(cuda_ext.fake_e4m3fy(e.cuda()).cpu(), cuda_ext.fake_e4m3fy(e))


@pytest.mark.gpu
def test_cuda_quantizer_forward_does_not_sync_with_the_host():
    """The kernel path reads nothing back (as upstream's compiled kernel): a quantizer call on
    CUDA must not stall the stream; a negative amax comes out NaN instead of an error there."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from qdq.compat.pytorch_quantization import nn as quant_nn

    conv = quant_nn.QuantConv2d(3, 8, 3).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    conv.input_quantizer.amax = torch.tensor(3.0, device="cuda")
    conv.weight_quantizer.amax = conv.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = conv(x)
        bad = cuda_ext.fake_tensor_quant(x, torch.tensor(-1.0, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == (2, 8, 14, 14) and bool(torch.isnan(bad).all())


def test_functions_called_directly_export_qdq_with_constant_scales() -> None:
    """A hand-written quantized forward (tensor_quant's functions, no TensorQuantizer) exports as
    Q/DQ with constant scales, per tensor, per channel, E4M3 and integer codes, and ONNX Runtime
    agrees with torch up to a rounding-boundary flip."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")

    class Hand(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = tensor_quant.fake_tensor_quant(x, torch.tensor(2.0), 8, False, False)
            b = tensor_quant.fake_tensor_quant(
                x, torch.tensor([[1.0], [2.0], [3.0]]), 8, False, False
            )
            c = tensor_quant.scaled_e4m3(x, torch.tensor(2.0))
            q, s = tensor_quant.tensor_quant(x, torch.tensor(2.0), 8, False, False)
            return torch.stack([a, b, c, q / s])

    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    f = io.BytesIO()
    torch.onnx.export(Hand(), (x,), f, dynamo=False, opset_version=19)
    graph = onnx.load_from_string(f.getvalue()).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 4 and ops.count("DequantizeLinear") == 3
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    assert all(n.input[1] in constants for n in graph.node if n.op_type == "QuantizeLinear")
    per_channel = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.attribute]
    assert [a.i for n in per_channel for a in n.attribute if a.name == "axis"] == [0]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(f.getvalue(), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    want = Hand()(x).numpy()
    assert np.abs(got - want).max() <= 3.0 / 127 * 1.0001
    assert np.mean(np.abs(got - want) > 1e-6) < 0.01


def test_direct_export_refuses_an_amax_read_from_a_buffer() -> None:
    class Buffered(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("amax", torch.tensor(2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return tensor_quant.fake_tensor_quant(x, self.amax, 8, False, False)

    with pytest.raises(Exception, match="constant amax"):
        torch.onnx.export(Buffered(), (torch.randn(4),), io.BytesIO(), dynamo=False)
