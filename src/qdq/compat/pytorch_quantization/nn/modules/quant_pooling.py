"""Quantized pooling: ``QuantMaxPool*``, ``QuantAvgPool*``, ``QuantAdaptiveAvgPool*``.

Subclasses of the torch pooling classes that quantize their input, then pool as torch does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qdq.compat.pytorch_quantization.nn.modules._utils import (
    QuantInputMixin,
    pop_quant_desc_in_kwargs,
)

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "QuantAdaptiveAvgPool1d",
    "QuantAdaptiveAvgPool2d",
    "QuantAdaptiveAvgPool3d",
    "QuantAvgPool1d",
    "QuantAvgPool2d",
    "QuantAvgPool3d",
    "QuantMaxPool1d",
    "QuantMaxPool2d",
    "QuantMaxPool3d",
]

_Size = Any


class _QuantPoolMixin(QuantInputMixin):
    """Quantize the input, then pool as the torch class (next in the MRO) does."""

    def forward(self, input: torch.Tensor) -> Any:
        pool: Any = super()
        return pool.forward(self.input_quantizer(input))


class _QuantMaxPool(_QuantPoolMixin):
    def __init__(self, kernel_size: _Size, stride: _Size | None = None, padding: _Size = 0,
                 dilation: _Size = 1, return_indices: bool = False, ceil_mode: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        base: Any = super()
        base.__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
        self.init_quantizer(pop_quant_desc_in_kwargs(type(self), input_only=True, **kwargs))


class QuantMaxPool1d(_QuantMaxPool, nn.MaxPool1d):
    """``torch.nn.MaxPool1d`` with a quantized input."""


class QuantMaxPool2d(_QuantMaxPool, nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` with a quantized input.

    Example:
        >>> QuantMaxPool2d(2)(torch.randn(1, 1, 4, 4)).shape
        torch.Size([1, 1, 2, 2])
    """


class QuantMaxPool3d(_QuantMaxPool, nn.MaxPool3d):
    """``torch.nn.MaxPool3d`` with a quantized input."""


class QuantAvgPool1d(_QuantPoolMixin, nn.AvgPool1d):
    """``torch.nn.AvgPool1d`` with a quantized input."""

    def __init__(self, kernel_size: _Size, stride: _Size | None = None, padding: _Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 **kwargs: Any) -> None:  # fmt: skip
        base: Any = super()
        base.__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.init_quantizer(pop_quant_desc_in_kwargs(type(self), input_only=True, **kwargs))


class _QuantAvgPoolNd(_QuantPoolMixin):
    def __init__(self, kernel_size: _Size, stride: _Size | None = None, padding: _Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None, **kwargs: Any) -> None:  # fmt: skip
        base: Any = super()
        base.__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        self.init_quantizer(pop_quant_desc_in_kwargs(type(self), input_only=True, **kwargs))


class QuantAvgPool2d(_QuantAvgPoolNd, nn.AvgPool2d):
    """``torch.nn.AvgPool2d`` with a quantized input."""


class QuantAvgPool3d(_QuantAvgPoolNd, nn.AvgPool3d):
    """``torch.nn.AvgPool3d`` with a quantized input."""


class _QuantAdaptiveAvgPool(_QuantPoolMixin):
    def __init__(self, output_size: _Size, **kwargs: Any) -> None:
        base: Any = super()
        base.__init__(output_size)
        self.init_quantizer(pop_quant_desc_in_kwargs(type(self), input_only=True, **kwargs))


class QuantAdaptiveAvgPool1d(_QuantAdaptiveAvgPool, nn.AdaptiveAvgPool1d):
    """``torch.nn.AdaptiveAvgPool1d`` with a quantized input."""


class QuantAdaptiveAvgPool2d(_QuantAdaptiveAvgPool, nn.AdaptiveAvgPool2d):
    """``torch.nn.AdaptiveAvgPool2d`` with a quantized input."""


class QuantAdaptiveAvgPool3d(_QuantAdaptiveAvgPool, nn.AdaptiveAvgPool3d):
    """``torch.nn.AdaptiveAvgPool3d`` with a quantized input."""


# upstream's short aliases (quant_nn.MaxPool2d, ...)
MaxPool1d, MaxPool2d, MaxPool3d = QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d
AvgPool1d, AvgPool2d, AvgPool3d = QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d
AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d = (
    QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d,
)  # fmt: skip
