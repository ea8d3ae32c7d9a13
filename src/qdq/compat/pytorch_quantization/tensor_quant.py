"""``pytorch_quantization.tensor_quant`` on qdq's numerics: descriptors and (fake) quantization.

Names, signatures and defaults follow NVIDIA's ``pytorch_quantization`` 2.x documentation. The
arithmetic is qdq's (:mod:`qdq.quant.primitives`), bit-exact with ONNX ``QuantizeLinear`` →
``DequantizeLinear``:

* ``q = saturate(round_half_even(x / (amax / qmax)))`` — a *division* by the float32 scale.
  Upstream computes ``round(x * (qmax / amax))`` (multiplication by the inverse scale), which differs
  from ONNX Runtime / TensorRT by one code on a few values per million;
* ``amax`` at or below ``2**-24`` is floored (the scale is never zero or negative), where upstream
  returns zeros for such tensors;
* signed widths 2..8 and unsigned widths 2..8 (ONNX ``int8`` / ``uint8``); one quantization axis at
  most (ONNX cannot express multi-axis scales; upstream accepts any broadcastable ``amax``).

Example:
    >>> import torch
    >>> from qdq.compat.pytorch_quantization import tensor_quant
    >>> tensor_quant.fake_tensor_quant(torch.tensor([0.5, 1.0, 3.0]), torch.tensor(1.27))
    tensor([0.5000, 1.0000, 1.2700])
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch

from qdq.quant.primitives import _FakeQuantSTE, check_amax_values, quant_range

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
    "QuantDescriptor",
    "ScaledQuantDescriptor",
    "fake_tensor_quant",
    "quant_bounds",
    "tensor_quant",
]

CALIB_METHODS = ("max", "histogram")


def _check_axis(axis: object) -> None:
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


def _as_floats(amax: object) -> float | tuple[float, ...]:
    if isinstance(amax, torch.Tensor):
        values = amax.detach().cpu().reshape(-1).tolist()
        return float(values[0]) if amax.dim() == 0 else tuple(float(v) for v in values)
    if isinstance(amax, (int, float)) and not isinstance(amax, bool):
        return float(amax)
    if isinstance(amax, (list, tuple)):
        return tuple(float(v) for v in amax)
    raise TypeError(f"amax must be a number, a sequence or a tensor, got {type(amax).__name__}")


@dataclass(frozen=True)
class ScaledQuantDescriptor:
    """How a :class:`~qdq.compat.pytorch_quantization.nn.TensorQuantizer` quantizes (upstream's
    ``QuantDescriptor``; immutable, as upstream's is).

    Args:
        num_bits: integer width, 2..8.
        name: an optional name (upstream keeps it for messages).
        fake_quant: quantize-dequantize (``True``) or return the integer codes.
        axis: ``None`` (per tensor) or the one axis *kept* (per channel), an int or a 1-tuple.
        amax: an initial amax (a number or a sequence, stored as floats).
        learn_amax: make ``amax`` a trainable parameter (per tensor only).
        scale_amax: multiply amax by this number before quantizing (experiments only).
        calib_method: ``"max"`` or ``"histogram"`` (which calibrator the quantizer gets).
        unsigned: quantize to ``[0, 2**num_bits - 1]``.
        narrow_range: signed range ``[-qmax, qmax]`` instead of ``[-qmax-1, qmax]``.

    Raises:
        ValueError, TypeError: a field with a value upstream would reject, naming it.

    Example:
        >>> QuantDescriptor(num_bits=8, axis=(0,)).axis
        (0,)
    """

    num_bits: int = 8
    name: str | None = None
    _: KW_ONLY
    fake_quant: bool = True
    axis: int | tuple[int, ...] | None = None
    amax: float | tuple[float, ...] | None = None
    learn_amax: bool = False
    scale_amax: float | None = None
    calib_method: str = "max"
    unsigned: bool = False
    narrow_range: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_bits, bool) or not isinstance(self.num_bits, int):
            raise TypeError(f"num_bits must be an int, got {self.num_bits!r}")
        if not 2 <= self.num_bits <= 8:
            raise ValueError(f"num_bits must be in 2..8 (INT8 Q/DQ), got {self.num_bits}")
        _check_axis(self.axis)
        if self.amax is not None:
            object.__setattr__(self, "amax", _as_floats(self.amax))
        if self.calib_method not in CALIB_METHODS:
            raise ValueError(
                f"calib_method must be one of {CALIB_METHODS}, got {self.calib_method!r}"
            )
        if self.learn_amax and self.axis is not None:
            raise TypeError(f"axis must be None when learn_amax is true, got {self.axis!r}")
        if self.scale_amax is not None and not isinstance(self.scale_amax, (int, float)):
            raise TypeError(f"scale_amax must be a number or None, got {self.scale_amax!r}")

    def dict(self) -> dict[str, Any]:
        """The descriptor as a plain dict (every field; ``name`` only when set)."""
        out = dataclasses.asdict(self)
        if out["name"] is None:
            del out["name"]
        return out

    def __str__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.dict().items())
        return f"QuantDescriptor({fields})"


#: Upstream's public name for :class:`ScaledQuantDescriptor`.
QuantDescriptor = ScaledQuantDescriptor

QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
# ConvTranspose weights are (C_in, C_out/groups, k...): upstream 2.2 keeps the output channels
# (axis 1), as ONNX Runtime and ModelOpt-ONNX do. qdq's own planner decides per TensorRT version
# (rule V12); scripts that want axis 0 pass quant_desc_weight explicitly.
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)


def quant_bounds(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    """The integer range ``(qmin, qmax)`` of a descriptor's quantization.

    Example:
        >>> quant_bounds(8, False, True), quant_bounds(8, True, False)
        ((-127, 127), (0, 255))
    """
    if unsigned:
        quant_range(num_bits)  # validates num_bits
        return 0, (1 << num_bits) - 1
    return quant_range(num_bits, narrow_range)


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize and dequantize ``inputs`` exactly as ONNX ``QuantizeLinear`` → ``DequantizeLinear``.

    Args:
        inputs: a floating-point tensor.
        amax: a number, or a tensor broadcastable to ``inputs`` with at most one dimension of size
            > 1 (the per-channel axis), e.g. ``(C, 1, 1, 1)`` for Conv weights.
        num_bits, unsigned, narrow_range: the integer range (upstream's defaults).

    Returns:
        ``inputs``'s shape and dtype; the gradient is the straight-through estimator (zero outside
        ``[-amax, amax]``).

    Raises:
        ValueError: negative or non-finite amax, or an amax with more than one channel axis.
        TypeError: negative inputs with ``unsigned=True`` (as upstream), non-float inputs.

    Example:
        >>> fake_tensor_quant(torch.tensor([-1.0, 0.3, 2.0]), 1.0, unsigned=False)
        tensor([-1.0000,  0.2992,  1.0000])
    """
    amax_t, axis = _amax_and_axis(inputs, amax)
    check_amax_values(amax_t, what="amax")
    qmin, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    if unsigned and bool((inputs < 0).any()):
        raise TypeError("negative values encountered in unsigned quantization")
    out: torch.Tensor = _FakeQuantSTE.apply(inputs, amax_t, axis, qmin, qmax, False)
    return out


def tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``inputs`` to integer codes (as a float tensor), returning ``(codes, scale)``.

    ``scale`` follows upstream's convention, ``qmax / amax`` (the *inverse* of the ONNX scale), so
    ``codes / scale`` dequantizes. The codes are those of ONNX ``QuantizeLinear``.

    Example:
        >>> q, s = tensor_quant(torch.tensor([0.5, -3.0]), torch.tensor(1.27))
        >>> q, s
        (tensor([  50., -127.]), tensor(100.))
    """
    fq = fake_tensor_quant(inputs, amax, num_bits, unsigned, narrow_range)
    amax_t, axis = _amax_and_axis(inputs, amax)
    _, qmax = quant_bounds(num_bits, unsigned, narrow_range)
    step = torch.clamp(amax_t.detach().to(torch.float32) / qmax, min=2.0**-24 / qmax)
    if axis is not None:
        shape = [1] * inputs.dim()
        shape[axis] = -1
        step = step.reshape(shape)
    codes = torch.round(fq.detach().to(torch.float32) / step)  # exact: |q| <= 255
    amax_shape = amax.shape if isinstance(amax, torch.Tensor) else torch.Size([])
    floored = torch.clamp(amax_t.detach().to(torch.float32), min=2.0**-24)
    scale = (qmax / floored).reshape(amax_shape)
    return codes.to(inputs.dtype), scale


def _amax_and_axis(
    inputs: torch.Tensor, amax: torch.Tensor | float
) -> tuple[torch.Tensor, int | None]:
    """A broadcastable amax → (1-D or scalar amax, the channel axis of ``inputs`` or None)."""
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}")
    amax_t = amax if isinstance(amax, torch.Tensor) else torch.tensor(float(amax))
    amax_t = amax_t.to(inputs.device)
    if amax_t.numel() == 1:
        return amax_t.reshape(()), None
    if amax_t.dim() > inputs.dim():
        raise ValueError(f"amax of shape {tuple(amax_t.shape)} has more dims than the inputs")
    shape = [1] * (inputs.dim() - amax_t.dim()) + list(amax_t.shape)
    axes = [d for d, n in enumerate(shape) if n != 1]
    if len(axes) != 1:
        raise ValueError(
            f"amax of shape {tuple(amax_t.shape)} varies along {len(axes)} axes; ONNX Q/DQ (and "
            "qdq) quantize per tensor or along one axis"
        )
    ax = axes[0]
    if shape[ax] != inputs.shape[ax]:
        raise ValueError(
            f"amax of shape {tuple(amax_t.shape)} does not broadcast to inputs {tuple(inputs.shape)}"
        )
    return amax_t.reshape(-1), ax


def single_axis(axis: int | tuple[int, ...] | None) -> int | None:
    """The one kept axis of a descriptor's ``axis`` (``(0,)`` → 0), or None."""
    if isinstance(axis, tuple):
        return axis[0]
    return axis
