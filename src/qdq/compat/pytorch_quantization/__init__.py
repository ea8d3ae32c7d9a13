"""NVIDIA ``pytorch_quantization`` 2.2.1's API on qdq (see ``docs/compat.md``).

Scripts change only their import::

    from qdq.compat.pytorch_quantization import nn as quant_nn, quant_modules, calib
    from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

or call :func:`qdq.compat.install_alias` once, after which ``import pytorch_quantization`` (and every
submodule name) resolves here. As upstream, the package re-exports :mod:`.quant_modules`'
``initialize``, ``deactivate`` and ``enable_onnx_export``. Values inside the compat namespace are
upstream's arithmetic bit for bit; an ONNX export writes TensorRT's QuantizeLinear/DequantizeLinear.

The submodules ``utils``, ``optim`` and ``cuda_ext`` load on first access (they are not needed to
import the package), ``calib``, ``nn``, ``quant_modules``, ``tensor_quant`` and ``version`` at once.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from qdq.compat.pytorch_quantization import calib, nn, quant_modules, tensor_quant, version
from qdq.compat.pytorch_quantization.quant_modules import (
    deactivate,
    enable_onnx_export,
    initialize,
)
from qdq.compat.pytorch_quantization.version import __version__

__all__ = [
    "__version__",
    "calib",
    "cuda_ext",
    "deactivate",
    "enable_onnx_export",
    "initialize",
    "nn",
    "optim",
    "quant_modules",
    "tensor_quant",
    "utils",
    "version",
]

_LAZY = ("cuda_ext", "optim", "utils")


def __getattr__(name: str) -> ModuleType:
    """Import ``utils``, ``optim`` and ``cuda_ext`` when first used (PEP 562)."""
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
