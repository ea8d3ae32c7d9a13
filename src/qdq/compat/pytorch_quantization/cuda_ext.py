"""``pytorch_quantization.cuda_ext`` in pure torch: the compiled extension's kernels, any device.

Upstream compiles these four functions from CUDA; here they are torch ops that give the kernels'
values on CPU and CUDA alike:

* every element is computed in float32 (``(float)input``, amax cast to float32) and the result is
  cast back to the input's dtype, so float16/bfloat16/float64 inputs round like the kernel;
* ``scale = bound / amax``, ``rint(input * scale)`` (half to even), clamp, ``/ scale``; an amax below
  ``2**-24`` gives 0;
* the kernels are launched without ``narrow_range``, which then takes its default ``True``: the
  signed range is always ``[-bound, bound]`` whatever ``narrow_range`` says (upstream's behaviour
  on a GPU, kept so that GPU training gives upstream's numbers);
* ``fake_e4m3fy`` is the float32 → FP8 E4M3 → float32 cast of ``__nv_fp8_e4m3`` (round to
  nearest even, saturating at ±448, NaN kept).

Where a kernel would trip a device assert (negative amax, negative input with ``unsigned``) these
raise :class:`RuntimeError`, the type a failed kernel check raises.

Example:
    >>> import torch
    >>> fake_tensor_quant(torch.tensor([0.5, -2.0]), torch.tensor(1.27))
    tensor([ 0.5000, -1.2700])
"""

from __future__ import annotations

import torch

__all__ = ["fake_e4m3fy", "fake_tensor_quant", "fake_tensor_quant_", "fake_tensor_quant_with_axis"]

#: The kernels' zero-amax threshold: the smallest float16 subnormal.
EPSILON = 1.0 / (1 << 24)
#: The largest finite E4M3 value.
E4M3_MAX = 448.0


def _bound(num_bits: int, unsigned: bool) -> int:
    return (1 << (num_bits - 1 + int(unsigned))) - 1


def _check(inputs: torch.Tensor, amax: torch.Tensor, unsigned: bool) -> None:
    """The kernels' argument checks, without a host sync per call on a GPU.

    A negative amax is refused on the CPU; on CUDA (where reading it back would stall every
    quantizer call, and the kernel does not check it either) its elements come out NaN instead, in
    :func:`_quant_dequant`. A negative input with ``unsigned`` is a device assert in the kernel: it
    is checked everywhere (unsigned quantizers are rare, so is that read-back).
    """
    if not inputs.is_floating_point():
        raise RuntimeError(f"fake_tensor_quant takes a floating-point tensor, got {inputs.dtype}")
    if unsigned and bool((inputs < 0).any()):
        raise RuntimeError("Negative values encountered in unsigned quantization.")
    if not amax.is_cuda and bool((amax < 0).any()):
        raise RuntimeError("amax must be >= 0 (the kernel asserts amax >= 0)")


def _quant_dequant(x: torch.Tensor, amax: torch.Tensor, bound: int) -> torch.Tensor:
    """The kernel's ``fake_tensor_quant_device`` on float32 ``x`` with broadcastable ``amax``."""
    # a tensor numerator: torch computes ``number / tensor`` as ``reciprocal(tensor) * number``,
    # which rounds twice; the kernel divides once
    scale = torch.tensor(float(bound), dtype=torch.float32, device=amax.device) / amax
    out = torch.clamp(torch.round(x * scale), -bound, bound) / scale
    out = torch.where(amax < EPSILON, torch.zeros((), dtype=out.dtype, device=out.device), out)
    if amax.is_cuda:  # a negative amax (refused on the CPU, see _check) reads as NaN
        out = torch.where(amax < 0, torch.full((), float("nan"), device=out.device), out)
    return out


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize-dequantize with one amax (the kernel's values; ``narrow_range`` is not used).

    Args:
        inputs: a floating-point tensor (any layout, any device).
        amax: a one-element tensor.
        num_bits, unsigned: the integer range, ``bound = 2**(num_bits - 1 + unsigned) - 1``.
        narrow_range: accepted and ignored, as by the compiled kernel (always narrow).

    Returns:
        A new tensor of ``inputs``'s dtype and shape.

    Raises:
        RuntimeError: ``amax`` has more than one element or a negative value; a negative input
            with ``unsigned=True``.
    """
    if amax.numel() != 1:
        raise RuntimeError(f"fake_tensor_quant takes a one-element amax, got {amax.numel()}")
    amax_f = amax.detach().reshape(()).to(device=inputs.device, dtype=torch.float32)
    _check(inputs, amax_f, unsigned)
    out = _quant_dequant(inputs.detach().float(), amax_f, _bound(num_bits, unsigned))
    return out.to(inputs.dtype)


def fake_tensor_quant_(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> None:
    """:func:`fake_tensor_quant` written into ``inputs`` (in place; returns ``None`` as upstream)."""
    with torch.no_grad():
        inputs.copy_(fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range))


def fake_tensor_quant_with_axis(
    inputs: torch.Tensor,
    amax: torch.Tensor,
    axis: int,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize-dequantize with one amax per index of ``axis`` (``narrow_range`` is not used).

    Args:
        inputs: a floating-point tensor.
        amax: ``inputs.shape[axis]`` values, in any shape (read flat, as the kernel does).
        axis: the axis of ``inputs`` the amax values run along (negative counts from the end).

    Raises:
        RuntimeError: ``amax`` does not have ``inputs.shape[axis]`` elements (the kernel would read
            past its end), a negative amax, a negative input with ``unsigned=True``.

    Example:
        >>> x = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        >>> fake_tensor_quant_with_axis(x, torch.tensor([1.27, 1e-30]), axis=1)
        tensor([[0.5000, 0.0000],
                [0.5000, 0.0000]])
    """
    axis = axis % inputs.dim() if inputs.dim() else 0
    if inputs.dim() == 0 or amax.numel() != inputs.shape[axis]:
        raise RuntimeError(
            f"fake_tensor_quant_with_axis: amax has {amax.numel()} values but inputs of shape "
            f"{tuple(inputs.shape)} has {inputs.shape[axis] if inputs.dim() else 0} along "
            f"axis {axis}"
        )
    shape = [1] * inputs.dim()
    shape[axis] = -1
    amax_f = amax.detach().reshape(shape).to(device=inputs.device, dtype=torch.float32)
    _check(inputs, amax_f, unsigned)
    out = _quant_dequant(inputs.detach().float(), amax_f, _bound(num_bits, unsigned))
    return out.to(inputs.dtype)


def fake_e4m3fy(inputs: torch.Tensor) -> torch.Tensor:
    """Round every element to the nearest FP8 E4M3 value (saturating at ±448), same dtype.

    The value goes through float32 first (as the kernel's ``static_cast<float>``); ties go to the
    even code; the smallest non-zero magnitude is ``2**-9`` (a subnormal); ``±inf`` become
    ``±448``; NaN stays NaN.

    Example:
        >>> fake_e4m3fy(torch.tensor([1.8, 500.0, 0.001, -0.0009])).tolist()
        [1.75, 448.0, 0.001953125, -0.0]
    """
    if not inputs.is_floating_point():
        raise RuntimeError(f"fake_e4m3fy takes a floating-point tensor, got {inputs.dtype}")
    x = inputs.detach().float().clamp(-E4M3_MAX, E4M3_MAX)  # saturate: torch's cast gives NaN
    return x.to(torch.float8_e4m3fn).to(torch.float32).to(inputs.dtype)
