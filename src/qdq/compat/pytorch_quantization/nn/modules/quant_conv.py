"""``QuantConv1d/2d/3d`` and ``QuantConvTranspose1d/2d/3d``: subclasses of the torch classes
(``isinstance(m, torch.nn.Conv2d)`` holds) that quantize their input and weight.

The torch classes are bound when this module is imported, so constructors still reach the real
``torch.nn.Conv2d`` while :func:`~qdq.compat.pytorch_quantization.quant_modules.initialize` has
replaced the name in ``torch.nn``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.compat.pytorch_quantization import tensor_quant as tq
from qdq.compat.pytorch_quantization.nn.modules._utils import QuantMixin, pop_quant_desc_in_kwargs

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

_Size = Any  # int or tuple, as torch accepts


class _QuantConvMixin(QuantMixin):
    """The constructor and forward of ``QuantConv1d/2d/3d`` (torch's signature, then the
    ``quant_desc_input``/``quant_desc_weight`` keywords); the torch class comes next in the MRO."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, dilation: _Size = 1, groups: int = 1, bias: bool = True,
                 padding_mode: Any = "zeros", **kwargs: Any) -> None:  # fmt: skip
        conv: Any = super()
        conv.__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                      bias, padding_mode)  # fmt: skip
        self._setup(kwargs)

    def _setup(self, kwargs: dict[str, Any]) -> None:
        desc_in, desc_w = pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(desc_in, desc_w)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        this: Any = self
        quant_input, quant_weight = self._quant(input)
        out: torch.Tensor = this._conv_forward(quant_input, quant_weight, this.bias)
        return out


class QuantConv1d(_QuantConvMixin, nn.Conv1d):
    """``torch.nn.Conv1d`` with quantized input and (per output channel) weight."""

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL


class QuantConv2d(_QuantConvMixin, nn.Conv2d):
    """``torch.nn.Conv2d`` with quantized input and (per output channel) weight.

    Example:
        >>> conv = QuantConv2d(3, 8, 3)
        >>> conv(torch.randn(1, 3, 8, 8)).shape
        torch.Size([1, 8, 6, 6])
    """

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL


class QuantConv3d(_QuantConvMixin, nn.Conv3d):
    """``torch.nn.Conv3d`` with quantized input and (per output channel) weight."""

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL


_TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class _QuantConvTransposeMixin(QuantMixin):
    """The constructor and forward of ``QuantConvTranspose1d/2d/3d`` (torch's signature, then the
    quantization keywords); the torch class comes next in the MRO."""

    _dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, output_padding: _Size = 0, groups: int = 1, bias: bool = True,
                 dilation: _Size = 1, padding_mode: Any = "zeros", **kwargs: Any) -> None:  # fmt: skip
        conv: Any = super()
        conv.__init__(in_channels, out_channels, kernel_size, stride, padding, output_padding,
                      groups, bias, dilation, padding_mode)  # fmt: skip
        self._setup(kwargs)

    def _setup(self, kwargs: dict[str, Any]) -> None:
        desc_in, desc_w = pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(desc_in, desc_w)

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        this: Any = self
        if this.padding_mode != "zeros":
            raise ValueError(f"only 'zeros' padding is supported for {type(self).__name__}")
        output_padding = this._output_padding(
            input, output_size, this.stride, this.padding, this.kernel_size, self._dims,
            this.dilation,
        )  # fmt: skip
        quant_input, quant_weight = self._quant(input)
        out: torch.Tensor = _TRANSPOSED[self._dims](
            quant_input, quant_weight, this.bias, this.stride, this.padding, output_padding,
            this.groups, this.dilation,
        )  # fmt: skip
        return out


class QuantConvTranspose1d(_QuantConvTransposeMixin, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` with quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    _dims = 1


class QuantConvTranspose2d(_QuantConvTransposeMixin, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` with quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    _dims = 2


class QuantConvTranspose3d(_QuantConvTransposeMixin, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` with quantized input and weight (weight axis 1)."""

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    _dims = 3


# upstream's short aliases (quant_nn.Conv2d, ...)
Conv1d, Conv2d, Conv3d = QuantConv1d, QuantConv2d, QuantConv3d
ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = (
    QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d,
)  # fmt: skip
