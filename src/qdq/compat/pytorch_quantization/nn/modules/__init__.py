"""``pytorch_quantization.nn.modules``: the quantizer, the quant modules and :class:`Clip`.

Upstream's ``nn.modules`` package re-exports nothing itself (``nn`` does); this one also re-exports
its submodules' public names, so both spellings work."""

from __future__ import annotations

from qdq.compat.pytorch_quantization.nn.modules import _utils
from qdq.compat.pytorch_quantization.nn.modules.clip import Clip
from qdq.compat.pytorch_quantization.nn.modules.quant_conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
)
from qdq.compat.pytorch_quantization.nn.modules.quant_instancenorm import (
    QuantInstanceNorm1d,
    QuantInstanceNorm2d,
    QuantInstanceNorm3d,
)
from qdq.compat.pytorch_quantization.nn.modules.quant_linear import (
    Linear,
    QuantLinear,
)
from qdq.compat.pytorch_quantization.nn.modules.quant_pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    QuantAdaptiveAvgPool1d,
    QuantAdaptiveAvgPool2d,
    QuantAdaptiveAvgPool3d,
    QuantAvgPool1d,
    QuantAvgPool2d,
    QuantAvgPool3d,
    QuantMaxPool1d,
    QuantMaxPool2d,
    QuantMaxPool3d,
)
from qdq.compat.pytorch_quantization.nn.modules.quant_rnn import (
    LSTM,
    LSTMCell,
    QuantLSTM,
    QuantLSTMCell,
)
from qdq.compat.pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = [
    "LSTM",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "Clip",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LSTMCell",
    "Linear",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "QuantAdaptiveAvgPool1d",
    "QuantAdaptiveAvgPool2d",
    "QuantAdaptiveAvgPool3d",
    "QuantAvgPool1d",
    "QuantAvgPool2d",
    "QuantAvgPool3d",
    "QuantConv1d",
    "QuantConv2d",
    "QuantConv3d",
    "QuantConvTranspose1d",
    "QuantConvTranspose2d",
    "QuantConvTranspose3d",
    "QuantInstanceNorm1d",
    "QuantInstanceNorm2d",
    "QuantInstanceNorm3d",
    "QuantLSTM",
    "QuantLSTMCell",
    "QuantLinear",
    "QuantMaxPool1d",
    "QuantMaxPool2d",
    "QuantMaxPool3d",
    "TensorQuantizer",
    "_utils",
]
