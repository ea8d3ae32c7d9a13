"""``QuantConv1d/2d/3d`` and ``QuantConvTranspose1d/2d/3d``: the torch conv classes with an input
and a weight quantizer.

Each is a subclass of its torch class (``isinstance(m, torch.nn.Conv2d)`` holds, which qdq's
placement relies on; upstream's derive from ``_ConvNd`` only). The torch classes are bound when this
module is imported, so constructors reach the real ``torch.nn.Conv2d`` even while
:func:`~qdq.compat.pytorch_quantization.quant_modules.initialize` has replaced the name.

Constructors take torch's arguments, then ``quant_desc_input=`` / ``quant_desc_weight=`` (defaults:
the class's ``default_quant_desc_*``); ``device=``/``dtype=`` are accepted too. ``forward`` quantizes
the input and the weight and convolves as the torch class does. Two differences from upstream, both
only outside the default ``padding_mode="zeros"`` / ``dilation=1`` cases: non-zero padding modes pad
as torch pads (upstream's Conv pads "circular" with an older torch formula and "reflect"/"replicate"
with zeros), and ConvTranspose's ``output_size`` takes ``dilation`` into account (as torch does).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.compat.pytorch_quantization import tensor_quant
from qdq.compat.pytorch_quantization.nn.modules import _utils

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "QuantConv1d",
    "QuantConv2d",
    "QuantConv3d",
    "QuantConvTranspose1d",
    "QuantConvTranspose2d",
    "QuantConvTranspose3d",
]

_Size = Any  # an int or a tuple, as torch accepts


class _QuantConvNd(_utils.QuantMixin):
    """What every quant conv adds to its torch class: the descriptors and ``_quant``."""

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR

    def _quant(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantized input and the quantized ``self.weight``."""
        this: Any = self
        return this._input_quantizer(input), this._weight_quantizer(this.weight)


class _QuantConv(_QuantConvNd):
    """Constructor and forward of ``QuantConv1d/2d/3d`` (the torch class follows in the MRO)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, dilation: _Size = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        conv: Any = super()
        conv.__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                      bias, padding_mode, device=device, dtype=dtype)  # fmt: skip
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input, quant_weight = self._quant(input)
        this: Any = self
        output: torch.Tensor = this._conv_forward(quant_input, quant_weight, this.bias)
        return output


class QuantConv1d(_QuantConv, nn.Conv1d):
    """``torch.nn.Conv1d`` with a quantized input and a per-output-channel quantized weight."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL


class QuantConv2d(_QuantConv, nn.Conv2d):
    """``torch.nn.Conv2d`` with a quantized input and a per-output-channel quantized weight.

    Example:
        >>> conv = QuantConv2d(3, 8, 3)
        >>> conv(torch.randn(1, 3, 8, 8)).shape
        torch.Size([1, 8, 6, 6])
    """

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL


class QuantConv3d(_QuantConv, nn.Conv3d):
    """``torch.nn.Conv3d`` with a quantized input and a per-output-channel quantized weight."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL


_TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class _QuantConvTransposeNd(_QuantConvNd):
    """Constructor and forward of ``QuantConvTranspose1d/2d/3d`` (torch class next in the MRO)."""

    _num_spatial_dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, output_padding: _Size = 0, groups: int = 1, bias: bool = True,
                 dilation: _Size = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None, **kwargs: Any) -> None:  # fmt: skip
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        conv: Any = super()
        conv.__init__(in_channels, out_channels, kernel_size, stride, padding, output_padding,
                      groups, bias, dilation, padding_mode, device=device, dtype=dtype)  # fmt: skip
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def _output_padding_nd(self, input: torch.Tensor, output_size: list[int] | None,
                           stride: Any, padding: Any, kernel_size: Any, num_spatial_dims: int,
                           dilation: Any = None) -> list[int]:  # fmt: skip
        """The output padding that gives ``output_size`` (torch's ``_output_padding``)."""
        this: Any = self
        out: list[int] = this._output_padding(
            input, output_size, stride, padding, kernel_size, num_spatial_dims, dilation
        )
        return out

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """Transposed convolution of the quantized input and weight.

        Args:
            input: ``(N, C_in, *spatial)`` or unbatched.
            output_size: the spatial (or full) output shape to produce, as torch's.

        Raises:
            ValueError: a ``padding_mode`` other than ``"zeros"``.
        """
        this: Any = self
        if this.padding_mode != "zeros":
            raise ValueError(f"Only `zeros` padding mode is supported for {type(self).__name__}")
        dims = self._num_spatial_dims
        output_padding = self._output_padding_nd(
            input, output_size, this.stride, this.padding, this.kernel_size, dims, this.dilation
        )
        quant_input, quant_weight = self._quant(input)
        output: torch.Tensor = _TRANSPOSED[dims](
            quant_input, quant_weight, this.bias, this.stride, this.padding, output_padding,
            this.groups, this.dilation,
        )  # fmt: skip
        return output


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` with a quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 1


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` with a quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 2


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` with a quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    _num_spatial_dims = 3


# upstream's short names (quant_nn.Conv2d, ...)
_ConvNd = _QuantConvNd
Conv1d, Conv2d, Conv3d = QuantConv1d, QuantConv2d, QuantConv3d
ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = (
    QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d,
)  # fmt: skip
