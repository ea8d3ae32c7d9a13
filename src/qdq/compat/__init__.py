"""Compatibility layers for scripts written against other quantization toolkits.

``qdq.compat.pytorch_quantization`` mirrors NVIDIA's ``pytorch_quantization``;
``qdq.compat.recipes`` holds the helpers NVIDIA's recipes copy around (``QuantAdd``, ...). Nothing here is
imported by ``import qdq``; nothing is patched until asked: :func:`install_alias` makes
``import pytorch_quantization`` (and its submodules) resolve to qdq's, :func:`uninstall_alias`
removes those entries again.

Example:
    >>> import qdq.compat
    >>> qdq.compat.install_alias()
    >>> import pytorch_quantization
    >>> pytorch_quantization.__name__
    'qdq.compat.pytorch_quantization'
    >>> qdq.compat.uninstall_alias()
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["install_alias", "uninstall_alias"]

_TARGET = "qdq.compat.pytorch_quantization"
_SUBMODULES = (
    "",
    ".tensor_quant",
    ".calib",
    ".calib.max",
    ".calib.histogram",
    ".nn",
    ".nn.modules",
    ".nn.modules._utils",
    ".nn.modules.tensor_quantizer",
    ".nn.modules.quant_conv",
    ".nn.modules.quant_linear",
    ".nn.modules.quant_pooling",
    ".quant_modules",
)


def install_alias(name: str = "pytorch_quantization") -> None:
    """Register qdq's modules in ``sys.modules`` under ``name`` (and its submodule names).

    Raises:
        RuntimeError: a different module is already imported under ``name`` (e.g. the real
            ``pytorch_quantization``); aliasing it would mix two implementations.
    """
    present = sys.modules.get(name)
    if present is not None and present.__name__ != _TARGET:
        raise RuntimeError(
            f"{name!r} is already imported from {getattr(present, '__file__', present)}; "
            "install the alias before anything imports it"
        )
    for suffix in _SUBMODULES:
        sys.modules[name + suffix] = importlib.import_module(_TARGET + suffix)


def uninstall_alias(name: str = "pytorch_quantization") -> None:
    """Remove the entries :func:`install_alias` added (only ones that point to qdq's modules)."""
    for suffix in _SUBMODULES:
        mod = sys.modules.get(name + suffix)
        if mod is not None and mod.__name__ == _TARGET + suffix:
            del sys.modules[name + suffix]
