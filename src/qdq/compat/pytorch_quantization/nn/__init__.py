"""``pytorch_quantization.nn`` (``from pytorch_quantization import nn as quant_nn``).

Every quant module is a subclass of its torch module: ``QuantConv1d/2d/3d``,
``QuantConvTranspose1d/2d/3d``, ``QuantLinear``, ``QuantMaxPool1d/2d/3d``, ``QuantAvgPool1d/2d/3d``,
``QuantAdaptiveAvgPool1d/2d/3d``, ``QuantInstanceNorm1d/2d/3d``, ``QuantLSTM``, ``QuantLSTMCell``
(and upstream's short aliases ``Conv2d``, ``Linear``, ``LSTM``, ...), plus :class:`TensorQuantizer`
and :class:`Clip`. The submodules ``functional`` (``clip``) and ``_functions`` (the recurrences) are
attributes, as they are upstream once its modules are imported.
"""

from __future__ import annotations

from qdq.compat.pytorch_quantization.nn import _functions as _functions  # nn._functions.quant_rnn
from qdq.compat.pytorch_quantization.nn import functional, modules
from qdq.compat.pytorch_quantization.nn.modules import *  # noqa: F403 (upstream re-exports them all)
from qdq.compat.pytorch_quantization.nn.modules._utils import (
    QuantInputMixin,
    QuantMixin,
    pop_quant_desc_in_kwargs,
)

__all__ = [
    *(name for name in modules.__all__ if name != "_utils"),
    "QuantInputMixin",
    "QuantMixin",
    "functional",
    "modules",
    "pop_quant_desc_in_kwargs",
]
