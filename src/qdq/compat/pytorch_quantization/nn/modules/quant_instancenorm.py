"""``QuantInstanceNorm1d/2d/3d``: the torch InstanceNorm classes with a quantized input.

Each is a subclass of its torch class; its constructor takes torch's arguments and then
``quant_desc_input=`` (default: the class's ``default_quant_desc_input``, 8-bit per tensor).
``forward`` quantizes the input and normalizes it as torch does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qdq.compat.pytorch_quantization.nn.modules import _utils

__all__ = ["QuantInstanceNorm1d", "QuantInstanceNorm2d", "QuantInstanceNorm3d"]


class _QuantInstanceNorm(_utils.QuantInputMixin):
    """Constructor and forward shared by the three classes (the torch class follows in the MRO)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device: Any = None,
                 dtype: Any = None, **kwargs: Any) -> None:  # fmt: skip
        norm: Any = super()
        norm.__init__(num_features, eps, momentum, affine, track_running_stats, device=device,
                      dtype=dtype)  # fmt: skip
        self.init_quantizer(_utils.pop_quant_desc_in_kwargs(type(self), input_only=True, **kwargs))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        norm: Any = super()
        output: torch.Tensor = norm.forward(self.input_quantizer(input))
        return output


class QuantInstanceNorm1d(_QuantInstanceNorm, nn.InstanceNorm1d):
    """``torch.nn.InstanceNorm1d`` over a quantized ``(N, C, L)`` (or ``(C, L)``) input."""


class QuantInstanceNorm2d(_QuantInstanceNorm, nn.InstanceNorm2d):
    """``torch.nn.InstanceNorm2d`` over a quantized ``(N, C, H, W)`` input.

    Example:
        >>> QuantInstanceNorm2d(3)(torch.randn(2, 3, 4, 4)).shape
        torch.Size([2, 3, 4, 4])
    """


class QuantInstanceNorm3d(_QuantInstanceNorm, nn.InstanceNorm3d):
    """``torch.nn.InstanceNorm3d`` over a quantized ``(N, C, D, H, W)`` input."""
