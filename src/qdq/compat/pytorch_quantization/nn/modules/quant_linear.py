"""``QuantLinear``: ``torch.nn.Linear`` with quantized input and (per row) weight."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.compat.pytorch_quantization import tensor_quant as tq
from qdq.compat.pytorch_quantization.nn.modules._utils import QuantMixin, pop_quant_desc_in_kwargs

__all__ = ["Linear", "QuantLinear"]


class QuantLinear(QuantMixin, nn.Linear):
    """``torch.nn.Linear`` (a subclass) with quantized input and per-output-row weight.

    Example:
        >>> QuantLinear(4, 2)(torch.randn(3, 4)).shape
        torch.Size([3, 2])
    """

    default_quant_desc_weight = tq.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(in_features, out_features, bias)
        desc_in, desc_w = pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(desc_in, desc_w)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        quant_input, quant_weight = self._quant(input)
        return F.linear(quant_input, quant_weight, self.bias)


Linear = QuantLinear
