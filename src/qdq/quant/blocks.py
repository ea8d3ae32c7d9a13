"""Block-scaled formats as data beside INT8 and FP8 (issue 60): NVFP4, MXFP8 and INT4 weights.

A format is a :class:`BlockFormat` (element type, block size, scale type, per-tensor scale or
not); :func:`block_fake_quant` quantizes and dequantizes a tensor in it, in float32, with the
arithmetic of the exported graph, and the straight-through estimator for QAT. The blocks run along
one axis (the GEMM's reduction axis: ``-1`` for a ``Linear`` weight ``[out, in]`` and for
activations ``[..., in]``); that axis's length must be a multiple of the block size.

* **NVFP4** (E2M1 elements, blocks of 16, E4M3 block scales under a float32 per-tensor scale), as
  ModelOpt's ``NVFP4QTensor`` (``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``) and its
  export (``export_onnx.py``: ``TRT_FP4DynamicQuantize`` for activations, two
  ``DequantizeLinear`` for weights) compute it::

      gs  = amax / (6 * 448)                     per tensor, float32 (floored at MIN_SCALE)
      sb  = e4m3(min(block_amax / (6 * gs), 448)) per block, saturating; 0 -> 1.0
      s   = sb * gs                               float32: DequantizeLinear(sb, gs)
      out = e2m1(x / s) * s                       DequantizeLinear(q, s, block_size=16)

  ``amax`` is the tensor's amax (weights) or the calibrated amax (activations, whose blocks are
  quantized at run time). A block scale that is zero after rounding to E4M3 (a zero block, or one
  under half of E4M3's smallest subnormal) becomes 1.0, as ModelOpt writes 1.0 for a zero block
  (it checks before the rounding): the block's values are then under ``6·2**-10·gs`` and come out
  ±0, where an unguarded division gives NaN.
* **MXFP8** (E4M3 elements, blocks of 32, E8M0 power-of-two scales)::

      e   = e8m0_exponent(block_amax, rule)       "ceil" (TensorRT/ModelOpt) or "floor" (OCP)
      out = e4m3(x / 2**e) * 2**e                 saturating at ±448
* **INT4** (signed, symmetric, codes [-8, 7], ``scale = amax / 7`` as ModelOpt's INT4 export and
  TensorRT's INT4 weight-only GEMMs use it), per block along the input-channel axis or per
  channel (``block_size=None``)::

      s   = max(amax / 7, MIN_SCALE)              per block (or per channel)
      out = clip(round_half_even(x / s), -8, 7) * s

Every division is an IEEE float32 division (``x / s``, not a multiplication by ``1/s``) and every
product one float32 multiplication, so the values equal ONNX ``QuantizeLinear`` →
``DequantizeLinear`` on the same scales bit for bit (checked in tests/test_block_numerics.py
against ONNX Runtime for INT4 and the ONNX reference evaluator for NVFP4 and MXFP8). float16 and
bfloat16 inputs are computed in float32 and cast back. NaN stays NaN; ±inf saturates (a block
holding inf has an amax of inf: its other values come out 0; a NaN makes its block NaN, and an
NVFP4 tensor amax taken from a tensor holding NaN makes the whole tensor NaN). A -0.0 keeps its sign
in NVFP4 and MXFP8 (both element types have a -0 code); INT4 returns +0.0 as DequantizeLinear does.

The STE passes the gradient of ``x`` where ``|x| <= qmax · s`` (its block's clip range: 6·s,
448·2**e, 7·s) and zeroes it outside (and at NaN). ``amax`` gets no gradient here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from qdq._numerics import MIN_SCALE
from qdq._validate import normalize_axis
from qdq.quant.blocks_fp4 import (
    E2M1_MAX,
    E4M3_MAX,
    E8M0_RULES,
    e2m1_round,
    e4m3_round,
    e8m0_exponent,
    e8m0_scale,
)

__all__ = [
    "BLOCK_FORMATS",
    "INT4",
    "INT4_MAX",
    "INT4_MIN",
    "MXFP8",
    "NVFP4",
    "BlockFormat",
    "block_amax",
    "block_fake_quant",
    "block_scales",
]

INT4_MIN, INT4_MAX = -8, 7
_ELEMENTS = {"e2m1": E2M1_MAX, "e4m3": E4M3_MAX, "int4": float(INT4_MAX)}
_SCALES = ("e4m3", "e8m0", "float32")


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled quantization format, as data.

    Attributes:
        name: ``"nvfp4"``, ``"mxfp8"`` or ``"int4"``.
        element: the element type: ``"e2m1"``, ``"e4m3"`` or ``"int4"`` (codes [-8, 7]).
        block_size: elements per scale along the blocked axis; ``None``: one scale per channel
            (INT4 only).
        scale: the block scale's type: ``"e4m3"`` (NVFP4), ``"e8m0"`` (MX) or ``"float32"``.
        tensor_scale: a float32 per-tensor scale above the block scales (NVFP4's
            ``amax / (6·448)``).
        e8m0_rule: how an E8M0 scale follows from the block amax (:data:`E8M0_RULES`).

    Example:
        >>> NVFP4.block_size, NVFP4.qmax
        (16, 6.0)
        >>> INT4.with_block_size(64).block_size
        64
    """

    name: str
    element: str
    block_size: int | None
    scale: str
    tensor_scale: bool = False
    e8m0_rule: str = "ceil"

    def __post_init__(self) -> None:
        if self.element not in _ELEMENTS:
            raise ValueError(
                f"unknown element type {self.element!r}; choose from {sorted(_ELEMENTS)}"
            )
        if self.scale not in _SCALES:
            raise ValueError(f"unknown block scale type {self.scale!r}; choose from {_SCALES}")
        if self.e8m0_rule not in E8M0_RULES:
            raise ValueError(f"unknown E8M0 rule {self.e8m0_rule!r}; choose from {E8M0_RULES}")
        bs = self.block_size
        if bs is None:
            if self.element != "int4":
                raise ValueError(f"{self.name}: only INT4 may be per channel (block_size=None)")
        elif isinstance(bs, bool) or not isinstance(bs, int) or bs < 2 or bs % 2:
            raise ValueError(f"{self.name}: block_size must be an even int >= 2, got {bs!r}")
        if self.tensor_scale and self.scale != "e4m3":
            raise ValueError(f"{self.name}: a per-tensor scale goes with E4M3 block scales only")

    @property
    def qmax(self) -> float:
        """The largest element magnitude (6, 448 or 7): the clip range is ``qmax · scale``."""
        return _ELEMENTS[self.element]

    def with_block_size(self, block_size: int | None) -> BlockFormat:
        """This format with another block size (INT4's 32/64/128, or ``None`` per channel)."""
        return BlockFormat(
            self.name, self.element, block_size, self.scale, self.tensor_scale, self.e8m0_rule
        )


#: NVFP4: E2M1 values in blocks of 16, E4M3 block scales under a float32 per-tensor scale.
NVFP4 = BlockFormat("nvfp4", "e2m1", 16, "e4m3", tensor_scale=True)
#: MXFP8: E4M3 values in blocks of 32, E8M0 scales (TensorRT's rounding up of amax/448).
MXFP8 = BlockFormat("mxfp8", "e4m3", 32, "e8m0")
#: INT4 weights, signed symmetric [-8, 7], scale amax/7, blocks of 128 along the input channels.
INT4 = BlockFormat("int4", "int4", 128, "float32")
#: The formats by name.
BLOCK_FORMATS = {f.name: f for f in (NVFP4, MXFP8, INT4)}


def block_amax(x: torch.Tensor, fmt: BlockFormat, axis: int = -1) -> torch.Tensor:
    """The float32 amax of each block of ``x`` along ``axis``: ``x``'s shape with
    ``x.shape[axis]`` divided by the block size (the blocked scale layout of ONNX
    ``DequantizeLinear``), or 1 per channel (INT4 with ``block_size=None``: the amax over
    every other axis, shaped ``[x.shape[axis]]``). NaN in a block gives NaN.

    Example:
        >>> block_amax(torch.arange(32.0).reshape(1, 32), NVFP4)
        tensor([[15., 31.]])
    """
    ax = _check(x, fmt, axis)
    x32 = x.detach().to(torch.float32).abs()
    if fmt.block_size is None:
        dims = [d for d in range(x.dim()) if d != ax]
        return x32.amax(dim=dims) if dims else x32
    return x32.unflatten(ax, (-1, fmt.block_size)).amax(dim=ax + 1)


def block_scales(
    x: torch.Tensor,
    fmt: BlockFormat,
    amax: torch.Tensor | float | None = None,
    axis: int = -1,
    *,
    check_amax: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scales the exported graph holds for ``x``: ``(block_scale, tensor_scale)``.

    NVFP4: the E4M3 block scales (float32 values on the E4M3 grid) and the per-tensor scale
    ``amax / (6·448)`` (``amax``: the tensor's own when ``None``). MXFP8: the E8M0 exponents
    (float32 integers) and ``None``. INT4: the float32 scales ``amax / 7`` (``amax``: per block
    or per channel, the blocks' own when ``None``) and ``None``. ``check_amax=False`` skips the
    finite/non-negative check of ``amax`` (a host sync on CUDA), for an amax checked when it was
    set (:class:`~qdq.quant.block_quantizer.BlockQuantizer`).

    Example:
        >>> sb, gs = block_scales(torch.full((1, 16), 3.0), NVFP4)
        >>> sb.tolist(), torch.equal(gs, torch.tensor(3.0) / 2688)
        ([[448.0]], True)
    """
    ax = _check(x, fmt, axis)
    bamax = block_amax(x, fmt, ax)
    if fmt.element == "e2m1":
        tensor_amax = bamax.amax() if amax is None else _amax_tensor(amax, x, 1, check_amax)
        gs = _div(tensor_amax.reshape(()), E2M1_MAX * E4M3_MAX).clamp(min=MIN_SCALE)
        sb = e4m3_round(bamax / (gs * E2M1_MAX))  # float32 product, then the division
        return torch.where(sb == 0, torch.ones_like(sb), sb), gs
    if fmt.element == "e4m3":
        return e8m0_exponent(bamax, fmt.e8m0_rule), None
    if amax is not None:
        bamax = _amax_tensor(amax, x, bamax.numel(), check_amax).reshape(bamax.shape)
    return _div(bamax, float(INT4_MAX)).clamp(min=MIN_SCALE), None


def block_fake_quant(
    x: torch.Tensor,
    fmt: BlockFormat,
    amax: torch.Tensor | float | None = None,
    axis: int = -1,
    *,
    check_amax: bool = True,
) -> torch.Tensor:
    """Quantize and dequantize ``x`` in the block format ``fmt``, with the STE for QAT.

    Args:
        x: a float32, float16 or bfloat16 tensor (computed in float32, returned in its dtype).
        fmt: :data:`NVFP4`, :data:`MXFP8`, :data:`INT4` or another :class:`BlockFormat`.
        amax: NVFP4: the per-tensor amax (the calibrated one for activations; ``None``: ``x``'s
            own, as for weights). INT4: per-block (or per-channel) amax shaped as
            :func:`block_amax` returns it; ``None``: the blocks' own. MXFP8: must be ``None``
            (its scales are the blocks' own). Finite and non-negative.
        axis: the blocked axis (the reduction axis); its length must be a multiple of the
            block size.
        check_amax: check that ``amax`` is finite and non-negative (one host sync on CUDA);
            ``False`` for an amax checked when it was set.

    Returns:
        ``dequantize(quantize(x))`` with ``x``'s shape and dtype.

    Raises:
        ValueError: the blocked axis is not a multiple of the block size, ``axis`` is out of
            range, ``amax`` is negative, non-finite, misshapen, or given for MXFP8.
        TypeError: ``x`` is not a floating-point tensor.

    Example:
        >>> block_fake_quant(torch.tensor([[0.1, 0.3, 1.0, 2.9] * 4]), NVFP4)[0, :4]
        tensor([0.0000, 0.2417, 0.9667, 2.9000])
        >>> block_fake_quant(torch.tensor([[0.4, -3.3] * 16]), INT4.with_block_size(32))[0, :2]
        tensor([ 0.4714, -3.3000])
    """
    ax = _check(x, fmt, axis)
    if amax is not None and fmt.element == "e4m3":
        raise ValueError("MXFP8 scales are the blocks' own: amax must be None")
    block_scale, tensor_scale = block_scales(x, fmt, amax, ax, check_amax=check_amax)
    if fmt.element == "e2m1":
        assert tensor_scale is not None
        scale = block_scale * tensor_scale
    elif fmt.element == "e4m3":
        scale = e8m0_scale(block_scale)
    else:
        scale = block_scale
    return _BlockFakeQuant.apply(x, fmt, scale, ax)


def _check(x: torch.Tensor, fmt: BlockFormat, axis: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"fmt must be a BlockFormat, got {type(fmt).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{fmt.name} needs a tensor with a blocked axis, got a 0-d tensor")
    ax = normalize_axis(axis, x.dim())
    assert ax is not None
    bs = fmt.block_size
    if bs is not None and x.shape[ax] % bs:
        raise ValueError(
            f"{fmt.name}: axis {ax} of shape {tuple(x.shape)} has {x.shape[ax]} elements, "
            f"not a multiple of the block size {bs}"
        )
    return ax


def _amax_tensor(
    amax: torch.Tensor | float, x: torch.Tensor, numel: int, check: bool = True
) -> torch.Tensor:
    a = amax if isinstance(amax, torch.Tensor) else torch.tensor(float(amax))
    a = a.detach().to(device=x.device, dtype=torch.float32)
    if a.numel() != numel:
        raise ValueError(f"amax has {a.numel()} values, expected {numel} for x of shape "
                         f"{tuple(x.shape)}")  # fmt: skip
    if not check:
        return a
    bad = ~torch.isfinite(a) | (a < 0)
    if bool(bad.any()):
        raise ValueError(
            f"amax must be finite and >= 0, got {a.flatten()[bad.flatten()][:4].tolist()}"
        )
    return a


def _div(a: torch.Tensor, d: float) -> torch.Tensor:
    """``a / d`` as an IEEE float32 division on every device (the divisor a tensor: CUDA divides
    by a Python scalar as a multiplication by its reciprocal, see ``primitives._scale``)."""
    return a / torch.full((), d, dtype=torch.float32, device=a.device)


def _expand(scale: torch.Tensor, x: torch.Tensor, fmt: BlockFormat, ax: int) -> torch.Tensor:
    """``scale`` (the blocked layout, or per channel) broadcast against ``x``'s shape."""
    if fmt.block_size is None:
        shape = [1] * x.dim()
        shape[ax] = x.shape[ax]
        return scale.reshape(shape)
    return scale.repeat_interleave(fmt.block_size, dim=ax)


def _values(x32: torch.Tensor, fmt: BlockFormat, scale: torch.Tensor) -> torch.Tensor:
    scaled = x32 / scale
    if fmt.element == "e2m1":
        return e2m1_round(scaled) * scale
    if fmt.element == "e4m3":
        return e4m3_round(scaled) * scale
    # + 0.0: integer codes have no signed zero, so DequantizeLinear never returns -0.0
    return torch.addcmul(
        torch.zeros((), device=scale.device), scaled.round_().clamp_(INT4_MIN, INT4_MAX), scale
    )


class _BlockFakeQuant(torch.autograd.Function):
    """Block fake quantization with the straight-through estimator for ``x``."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, fmt: BlockFormat, scale: torch.Tensor, ax: int
    ) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
        s = _expand(scale, x32, fmt, ax)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x32.abs() <= s * fmt.qmax)  # NaN: outside
        out = _values(x32, fmt, s)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (grad,) = grads
        (inside,) = ctx.saved_tensors
        return (
            torch.where(inside, grad, torch.zeros((), dtype=grad.dtype, device=grad.device)),
            None,
            None,
            None,
        )
