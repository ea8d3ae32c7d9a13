"""``QuantLinear`` (alias ``Linear``): ``torch.nn.Linear`` with quantized input and weight."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.compat.pytorch_quantization import tensor_quant
from qdq.compat.pytorch_quantization.nn.modules import _utils

__all__ = ["Linear", "QuantLinear"]


class QuantLinear(nn.Linear, _utils.QuantMixin):
    """``torch.nn.Linear`` (a subclass) computing ``quant(x) @ quant(W).T + b``.

    Args:
        in_features, out_features, bias, device, dtype: as ``torch.nn.Linear``.

    Keyword Args:
        quant_desc_input: the input's descriptor (default: 8-bit per tensor).
        quant_desc_weight: the weight's descriptor (default: 8-bit per output row, axis 0).

    Raises:
        ValueError: a descriptor with ``fake_quant=False``.
        TypeError: another keyword argument ("Unused keys").

    Example:
        >>> QuantLinear(4, 2)(torch.randn(3, 4)).shape
        torch.Size([3, 2])
    """

    default_quant_desc_input = tensor_quant.QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input = self.input_quantizer(input)
        quant_weight = self.weight_quantizer(self.weight)
        return F.linear(quant_input, quant_weight, bias=self.bias)


Linear = QuantLinear
