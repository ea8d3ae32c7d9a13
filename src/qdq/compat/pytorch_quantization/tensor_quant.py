"""``pytorch_quantization.tensor_quant``: descriptors and the (fake) quantization functions.

The arithmetic is upstream's, op for op, so values match NVIDIA's package bit for bit on the same
torch build:

* integer quantization (:func:`tensor_quant`, :func:`fake_tensor_quant` on CPU,
  :func:`legacy_fake_tensor_quant`): ``scale = bound / amax`` as a tensor division,
  ``clamp(round(x * scale), min_bound, bound)`` (round half to even), dequantized as
  ``codes / scale`` in the input's dtype; float16 inputs and amax are computed in float32; an amax at
  or below ``2**-24`` quantizes to 0 (its returned scale is 1);
* :func:`fake_tensor_quant` on CUDA takes the extension's path (:mod:`.cuda_ext`): float32 per
  element, always narrow range, results cast to the input dtype, as upstream's GPU kernel;
* :func:`scaled_e4m3`: FP8 E4M3 with ``scale = 448 / amax``; values below ``2**-24`` become 0.

Gradients are upstream's: the straight-through estimator with clipping (the gradient passes where
``|x| <= amax``, zero elsewhere) and no gradient for amax.

These differ from ONNX ``QuantizeLinear``/``DequantizeLinear``, which divide by ``amax / bound``:
the two roundings disagree by one code on a few values per million (``docs/compat.md``).

Example:
    >>> import torch
    >>> fake_tensor_quant(torch.tensor([0.5, 1.0, 3.0]), torch.tensor(1.27))
    tensor([0.5000, 1.0000, 1.2700])
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.autograd import Function

from qdq.compat.pytorch_quantization import cuda_ext
from qdq.compat.pytorch_quantization._descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
    ScaledQuantDescriptor,
)
from qdq.compat.pytorch_quantization._onnx_symbolic import (
    _onnx_fp8_dequantize,  # noqa: F401 (upstream's private names live in tensor_quant)
    _onnx_fp8_quantize,  # noqa: F401
    _onnx_int8_helper,  # noqa: F401
    codes_symbolic,
    e4m3_symbolic,
    int8_symbolic,
)

__all__ = [
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "FakeAffineTensorQuantFunction",
    "FakeTensorQuantFunction",
    "LegacyFakeTensorQuantFunction",
    "QuantDescriptor",
    "ScaledE4M3Function",
    "ScaledQuantDescriptor",
    "TensorQuantFunction",
    "fake_affine_tensor_quant",
    "fake_tensor_quant",
    "legacy_fake_tensor_quant",
    "quant_bounds",
    "scaled_e4m3",
    "tensor_quant",
]

_log = logging.getLogger("pytorch_quantization")

#: amax at or below this (the smallest float16 subnormal) quantizes everything to 0.
EPSILON = 1.0 / (1 << 24)
#: The largest float16 value: a larger scale cannot be returned in float16.
FP16_MAX = 65504


def _as_amax(amax: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """``amax`` as a tensor (a number becomes a float32 scalar on ``like``'s device)."""
    if isinstance(amax, torch.Tensor):
        return amax
    return torch.tensor(float(amax), dtype=torch.float32, device=like.device)


def _tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes (a float tensor) and the scale ``bound / amax``: upstream's shared body.

    Returns:
        ``(codes, scale)``: codes in ``inputs``'s dtype for float16 inputs (float32 otherwise, or
        whatever torch's type promotion gives, as upstream), the scale as computed (float32 for a
        float32 or float16 amax) with 1 where amax was tiny.

    Raises:
        TypeError: a negative input with ``unsigned=True``.
        ValueError: a negative amax.
    """
    if isinstance(amax, torch.Tensor) and inputs.dim() != amax.dim():
        _log.debug("amax %s and inputs %s differ in rank: broadcast", amax.size(), inputs.size())
    if unsigned and inputs.min() < 0.0:
        raise TypeError("Negative values encountered in unsigned quantization.")
    # in float32: float16 would overflow (x * scale reaches 2**num_bits - 1 times x / amax)
    input_dtype = inputs.dtype
    if inputs.dtype == torch.half:
        inputs = inputs.float()
    if amax.dtype == torch.half:
        amax = amax.float()
    min_amax = amax.min()
    if min_amax < 0:
        raise ValueError("Negative values in amax")

    max_bound = torch.tensor(2.0 ** (num_bits - 1 + int(unsigned)) - 1.0, device=amax.device)
    min_bound: torch.Tensor | int
    if unsigned:
        min_bound = 0
    elif narrow_range:
        min_bound = -max_bound
    else:
        min_bound = -max_bound - 1
    scale = max_bound / amax

    tiny = bool(min_amax <= EPSILON)
    if tiny:  # amax 0 (or below float16's resolution): every value quantizes to 0
        zero_amax = amax <= EPSILON
        scale[zero_amax] = 0
    outputs = torch.clamp((inputs * scale).round_(), min_bound, max_bound)  # type: ignore[arg-type]
    if tiny:
        scale[zero_amax] = 1.0  # so that codes / scale stays 0
    if input_dtype == torch.half:
        outputs = outputs.half()
    return outputs, scale


def _ste_grad(inputs: torch.Tensor, amax: torch.Tensor, grad_outputs: torch.Tensor) -> torch.Tensor:
    """The straight-through estimator with clipping: ``grad`` where ``|x| <= amax``, else 0."""
    zero = grad_outputs.new_zeros(())
    return torch.where(inputs.abs() <= amax, grad_outputs, zero)


#: Upstream's name for :func:`_ste_grad`.
_fake_tensor_quant_backward = _ste_grad


class TensorQuantFunction(Function):
    """Integer quantization with upstream's STE gradient: returns ``(codes, scale)``.

    The codes are a float tensor (``codes / scale`` dequantizes); the scale has ``amax``'s shape.
    """

    symbolic = staticmethod(codes_symbolic)

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        amax: torch.Tensor,
        num_bits: int = 8,
        unsigned: bool = False,
        narrow_range: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(inputs, amax)
        outputs, scale = _tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
        if outputs.dtype == torch.half and scale.max() > FP16_MAX:
            raise ValueError(f"scale is too large for FP16 with amax={amax}")
        return outputs, scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor, grad_scale: torch.Tensor) -> tuple[Any, ...]:
        inputs, amax = ctx.saved_tensors
        return _ste_grad(inputs, amax, grad_outputs), None, None, None, None


class LegacyFakeTensorQuantFunction(Function):
    """Fake quantization on any device: :class:`TensorQuantFunction`'s codes divided by the scale."""

    symbolic = staticmethod(int8_symbolic)

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        amax: torch.Tensor,
        num_bits: int = 8,
        unsigned: bool = False,
        narrow_range: bool = True,
    ) -> torch.Tensor:
        ctx.save_for_backward(inputs, amax)
        outputs, scale = _tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
        return outputs / scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        inputs, amax = ctx.saved_tensors
        return _ste_grad(inputs, amax, grad_outputs), None, None, None, None


class FakeTensorQuantFunction(Function):
    """Fake quantization: the legacy formula on CPU, the extension kernel's on CUDA.

    On CUDA a one-element amax takes :func:`.cuda_ext.fake_tensor_quant` and an amax with one
    axis of channels :func:`.cuda_ext.fake_tensor_quant_with_axis` (the axis is the position of
    that dimension in amax's shape); whatever the kernel refuses falls back to the legacy formula.
    """

    symbolic = staticmethod(int8_symbolic)

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        amax: torch.Tensor,
        num_bits: int = 8,
        unsigned: bool = False,
        narrow_range: bool = True,
    ) -> torch.Tensor:
        ctx.save_for_backward(inputs, amax)
        if inputs.is_cuda:
            try:
                if amax.numel() == 1:
                    return cuda_ext.fake_tensor_quant(
                        inputs, amax, num_bits, unsigned, narrow_range
                    )
                axis = list(amax.shape).index(amax.numel())
                return cuda_ext.fake_tensor_quant_with_axis(
                    inputs, amax.squeeze(), axis, num_bits, unsigned, narrow_range
                )
            except (RuntimeError, ValueError):
                pass  # several axes, a shape the kernel does not take, or bad values: legacy
        outputs, scale = _tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
        return outputs / scale.to(inputs.dtype)

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        inputs, amax = ctx.saved_tensors
        return _ste_grad(inputs, amax, grad_outputs), None, None, None, None


class ScaledE4M3Function(Function):
    """FP8 E4M3 fake quantization, unscaled (``amax=None``) or with ``scale = 448 / amax``."""

    symbolic = staticmethod(e4m3_symbolic)

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        amax: torch.Tensor | float | None = None,
        E: int = 4,  # noqa: N803 (upstream's argument names)
        M: int = 3,  # noqa: N803
    ) -> torch.Tensor:
        if E != 4 or M != 3:
            raise NotImplementedError("Only support E=4 & M=3 for now.")
        ctx.save_for_backward(inputs)
        ctx.amax = amax
        tiny = inputs.abs() < EPSILON
        if amax is None:
            outputs = cuda_ext.fake_e4m3fy(inputs)
        else:
            # written as upstream does: torch computes ``448.0 / tensor`` as reciprocal * 448
            scale = 448.0 / amax
            outputs = cuda_ext.fake_e4m3fy(inputs * scale) / scale
        # a tiny value would get a huge scale and come back as inf/nan: it is 0
        outputs[tiny] = 0.0
        return outputs

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        (inputs,) = ctx.saved_tensors
        bound = ctx.amax if ctx.amax is not None else cuda_ext.E4M3_MAX
        amax = torch.as_tensor(bound, dtype=torch.float32, device=inputs.device)
        return _ste_grad(inputs, amax, grad_outputs), None, None, None


class FakeAffineTensorQuantFunction(Function):
    """Asymmetric (scale and zero point) fake quantization of ``[min_range, max_range]``.

    Experimental, as upstream: ``step = (max - min) / (2**n - 1)``, the zero point rounded to a
    whole step; the gradient passes inside ``[min_range, max_range]``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        min_range: torch.Tensor,
        max_range: torch.Tensor,
        num_bits: int = 8,
    ) -> torch.Tensor:
        ctx.save_for_backward(inputs, min_range, max_range)
        step_size = (max_range - min_range) / (2.0**num_bits - 1)
        min_bound = -(2.0 ** (num_bits - 1))
        max_bound = 2.0 ** (num_bits - 1) - 1
        quant_zero = torch.round(min_range / step_size) - min_bound
        quantized = torch.clamp(torch.round(inputs / step_size) - quant_zero, min_bound, max_bound)
        return (quantized + quant_zero) * step_size

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[Any, ...]:
        inputs, min_range, max_range = ctx.saved_tensors
        inside = (inputs <= max_range) * (inputs >= min_range)
        return torch.where(inside, grad_outputs, grad_outputs.new_zeros(())), None, None, None


def tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to integer codes (held in a float tensor): returns ``(codes, scale)``.

    Args:
        inputs: a floating-point tensor.
        amax: a tensor broadcastable to ``inputs`` (``(C, 1, 1, 1)`` for per-channel Conv weights,
            any number of axes) or a number.
        num_bits: the width (``bound = 2**(num_bits - 1 + unsigned) - 1``).
        unsigned: codes in ``[0, bound]``.
        narrow_range: signed codes in ``[-bound, bound]`` (default) instead of
            ``[-bound - 1, bound]``.

    Returns:
        ``codes`` and ``scale = bound / amax`` in ``inputs``'s dtype; ``codes / scale``
        dequantizes.

    Raises:
        TypeError: a negative input with ``unsigned=True``.
        ValueError: a negative amax; a float16 input whose scale exceeds 65504.

    Example:
        >>> tensor_quant(torch.tensor([0.5, -3.0]), torch.tensor(1.27))
        (tensor([  50., -127.]), tensor(100.))
    """
    out: tuple[torch.Tensor, torch.Tensor] = TensorQuantFunction.apply(
        inputs, _as_amax(amax, inputs), num_bits, unsigned, narrow_range
    )
    return out


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize and dequantize (the arguments of :func:`tensor_quant`); the STE gradient.

    On CUDA the kernel path ignores ``narrow_range`` (always narrow), as upstream's extension.

    Example:
        >>> fake_tensor_quant(torch.tensor([-1.0, 0.3, 2.0]), torch.tensor(1.0))
        tensor([-1.0000,  0.2992,  1.0000])
    """
    out: torch.Tensor = FakeTensorQuantFunction.apply(
        inputs, _as_amax(amax, inputs), num_bits, unsigned, narrow_range
    )
    return out


def legacy_fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """:func:`fake_tensor_quant` by the legacy formula on every device (``codes / scale``)."""
    out: torch.Tensor = LegacyFakeTensorQuantFunction.apply(
        inputs, _as_amax(amax, inputs), num_bits, unsigned, narrow_range
    )
    return out


def fake_affine_tensor_quant(
    inputs: torch.Tensor, min_range: torch.Tensor, max_range: torch.Tensor, num_bits: int = 8
) -> torch.Tensor:
    """Asymmetric fake quantization of ``[min_range, max_range]`` (tensors), see
    :class:`FakeAffineTensorQuantFunction`.

    Example:
        >>> x = torch.tensor([-1.0, 0.0, 2.0, 3.0])
        >>> fake_affine_tensor_quant(x, x.min(), x.max(), 4)  # step 4 / 15
        tensor([-1.0667,  0.0000,  1.8667,  2.9333])
    """
    out: torch.Tensor = FakeAffineTensorQuantFunction.apply(inputs, min_range, max_range, num_bits)
    return out


def scaled_e4m3(
    inputs: torch.Tensor,
    amax: torch.Tensor | float | None = None,
    E: int = 4,  # noqa: N803 (upstream's argument names)
    M: int = 3,  # noqa: N803
) -> torch.Tensor:
    """FP8 E4M3 fake quantization: ``e4m3(x * 448 / amax) * amax / 448``, or ``e4m3(x)``.

    Args:
        inputs: a floating-point tensor.
        amax: ``None`` (no scaling) or a number/tensor (one value: FP8 export takes a scalar).
        E, M: exponent and mantissa bits; only ``(4, 3)``.

    Returns:
        ``inputs``'s dtype; values with ``|x| < 2**-24`` are 0. The gradient passes where
        ``|x| <= amax`` (448 without amax).

    Raises:
        NotImplementedError: another format than E4M3.

    Example:
        >>> scaled_e4m3(torch.tensor([1.8, -0.2, 600.0])).tolist()
        [1.75, -0.203125, 448.0]
    """
    out: torch.Tensor = ScaledE4M3Function.apply(inputs, amax, E, M)
    return out


# ---------------------------------------------------------------- helpers of the other compat files
def quant_bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    """The integer range ``(min_bound, max_bound)`` :func:`tensor_quant` clamps to.

    Example:
        >>> quant_bounds(8, False, True), quant_bounds(8, False, False), quant_bounds(8, True, False)
        ((-127, 127), (-128, 127), (0, 255))
    """
    bound = (1 << (num_bits - 1 + int(unsigned))) - 1
    if unsigned:
        return 0, bound
    return (-bound if narrow_range else -bound - 1), bound


def single_axis(axis: int | tuple[int, ...] | None) -> int | None:
    """The first kept axis of a descriptor's ``axis`` (``(0,)`` → 0), or None."""
    if isinstance(axis, tuple):
        return axis[0]
    return axis


def _check_axis(axis: object) -> None:
    """Refuse an ``axis`` that is not None, an int or a 1-tuple of ints (qdq's calibrators)."""
    if axis is None:
        return
    items = axis if isinstance(axis, tuple) else (axis,)
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
    if isinstance(axis, tuple) and len(axis) != 1:
        raise ValueError(
            f"axis={axis!r}: qdq quantizes per tensor or along one axis (ONNX Q/DQ cannot "
            "express several)"
        )
