"""NVIDIA ``pytorch_quantization``'s API on qdq's engine (see ``docs/compat.md``).

Scripts change only their import::

    from qdq.compat.pytorch_quantization import nn as quant_nn, quant_modules, calib
    from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

or call :func:`qdq.compat.install_alias` once, after which ``import pytorch_quantization`` resolves
here. Numerics are qdq's: bit-exact with ONNX ``QuantizeLinear``/``DequantizeLinear``.
"""

from __future__ import annotations

from qdq.compat.pytorch_quantization import calib, nn, quant_modules, tensor_quant

__version__ = "2.2.1+qdq"

__all__ = ["calib", "nn", "quant_modules", "tensor_quant"]
