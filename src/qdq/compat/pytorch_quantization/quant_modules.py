"""``pytorch_quantization.quant_modules``: the one opt-in monkey-patch of ``torch.nn``.

:func:`initialize` replaces ``torch.nn.Conv2d`` and friends by their quant classes, so models built
*afterwards* get quantizers without code changes; :func:`deactivate` puts the original classes back
exactly. Nothing is patched on import. Modules built before ``initialize`` stay float (as upstream).

The default map (:data:`_DEFAULT_QUANT_MAP`) is upstream 2.2.1's: Conv1d/2d/3d,
ConvTranspose1d/2d/3d, Linear, LSTM, LSTMCell, AvgPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d. MaxPool and
InstanceNorm have quant classes but are not in the map, as upstream.

Example:
    >>> import torch
    >>> from qdq.compat.pytorch_quantization import nn as quant_nn, quant_modules
    >>> quant_modules.initialize()
    >>> try:
    ...     conv = torch.nn.Conv2d(3, 8, 3)
    ... finally:
    ...     quant_modules.deactivate()
    >>> isinstance(conv, quant_nn.QuantConv2d), torch.nn.Conv2d is quant_nn.QuantConv2d
    (True, False)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import NamedTuple

import torch

from qdq.compat.pytorch_quantization import nn as quant_nn

__all__ = ["QuantModuleReplacementHelper", "deactivate", "enable_onnx_export", "initialize"]

_log = logging.getLogger("qdq.compat")


class _quant_entry(NamedTuple):  # noqa: N801 (upstream's name)
    orig_mod: ModuleType
    mod_name: str
    replace_mod: type


_DEFAULT_QUANT_MAP: list[_quant_entry] = [
    _quant_entry(torch.nn, "Conv1d", quant_nn.QuantConv1d),
    _quant_entry(torch.nn, "Conv2d", quant_nn.QuantConv2d),
    _quant_entry(torch.nn, "Conv3d", quant_nn.QuantConv3d),
    _quant_entry(torch.nn, "ConvTranspose1d", quant_nn.QuantConvTranspose1d),
    _quant_entry(torch.nn, "ConvTranspose2d", quant_nn.QuantConvTranspose2d),
    _quant_entry(torch.nn, "ConvTranspose3d", quant_nn.QuantConvTranspose3d),
    _quant_entry(torch.nn, "Linear", quant_nn.QuantLinear),
    _quant_entry(torch.nn, "LSTM", quant_nn.QuantLSTM),
    _quant_entry(torch.nn, "LSTMCell", quant_nn.QuantLSTMCell),
    _quant_entry(torch.nn, "AvgPool1d", quant_nn.QuantAvgPool1d),
    _quant_entry(torch.nn, "AvgPool2d", quant_nn.QuantAvgPool2d),
    _quant_entry(torch.nn, "AvgPool3d", quant_nn.QuantAvgPool3d),
    _quant_entry(torch.nn, "AdaptiveAvgPool1d", quant_nn.QuantAdaptiveAvgPool1d),
    _quant_entry(torch.nn, "AdaptiveAvgPool2d", quant_nn.QuantAdaptiveAvgPool2d),
    _quant_entry(torch.nn, "AdaptiveAvgPool3d", quant_nn.QuantAdaptiveAvgPool3d),
]


class QuantModuleReplacementHelper:
    """Holds what :func:`initialize` replaced, so :func:`deactivate` restores exactly that."""

    def __init__(self) -> None:
        self.default_quant_map = list(_DEFAULT_QUANT_MAP)
        # upstream's spelling; entries are (module, name, the original object)
        self.orginal_func_map: list[_quant_entry] = []
        self.quant_map: list[_quant_entry] = []

    def prepare_state(
        self,
        float_module_list: Iterable[str] | None = None,
        custom_map: Iterable[tuple[ModuleType, str, type]] | None = None,
    ) -> None:
        """Choose the entries: the default map without ``float_module_list`` names, plus
        ``custom_map`` entries ``(module, "Name", QuantClass)``.

        Raises:
            TypeError: a malformed custom entry.
            ValueError: a name that the target module does not have.
        """
        skip = set(float_module_list or ())
        entries = [e for e in self.default_quant_map if e.mod_name not in skip]
        for item in custom_map or ():
            if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[1], str)):
                raise TypeError(
                    f"custom_quant_modules entries are (module, name, class), got {item!r}"
                )
            entries.append(_quant_entry(*item))
        for e in entries:
            if not hasattr(e.orig_mod, e.mod_name):
                raise ValueError(
                    f"{getattr(e.orig_mod, '__name__', e.orig_mod)} has no {e.mod_name!r}"
                )
        self.quant_map = entries

    def apply_quant_modules(self) -> None:
        """Replace every chosen name, remembering the original object."""
        for e in self.quant_map:
            original = getattr(e.orig_mod, e.mod_name)
            self.orginal_func_map.append(_quant_entry(e.orig_mod, e.mod_name, original))
            setattr(e.orig_mod, e.mod_name, e.replace_mod)

    def restore_float_modules(self) -> None:
        """Put back every original, in reverse order."""
        while self.orginal_func_map:
            mod, name, original = self.orginal_func_map.pop()
            setattr(mod, name, original)


_HELPER = QuantModuleReplacementHelper()
#: Upstream's name for the helper that holds the patch state.
_quant_module_helper_object = _HELPER


def initialize(
    float_module_list: Iterable[str] | None = None,
    custom_quant_modules: Iterable[tuple[ModuleType, str, type]] | None = None,
) -> None:
    """Replace ``torch.nn`` classes by quant classes until :func:`deactivate`.

    Args:
        float_module_list: names of the default map to leave alone, e.g. ``["Linear"]``.
        custom_quant_modules: extra ``(module, "Name", QuantClass)`` replacements.

    Calling it again first undoes the previous call, so the originals are never lost.
    """
    if _HELPER.orginal_func_map:
        _log.info("quant_modules.initialize called again: restoring the previous patch first")
        _HELPER.restore_float_modules()
    _HELPER.prepare_state(float_module_list, custom_quant_modules)
    _HELPER.apply_quant_modules()
    _log.info("quant_modules: patched %s", ", ".join(e.mod_name for e in _HELPER.quant_map))


def deactivate() -> None:
    """Restore every class :func:`initialize` replaced (a no-op when nothing is patched)."""
    _HELPER.restore_float_modules()


@contextlib.contextmanager
def enable_onnx_export() -> Iterator[None]:
    """Upstream 2.2's export switch: sets ``TensorQuantizer._enable_onnx_export`` for the block
    (and clears it again, also on an error).

    With it on, a quantizer checks before quantizing that it can be exported (an ``amax``, no
    calibration running), as upstream. Quantizers write Q/DQ inside ``torch.onnx.export`` with or
    without it.

    Example:
        >>> from qdq.compat.pytorch_quantization import nn as quant_nn
        >>> with enable_onnx_export():
        ...     quant_nn.TensorQuantizer._enable_onnx_export
        True
        >>> quant_nn.TensorQuantizer._enable_onnx_export
        False
    """
    quant_nn.TensorQuantizer._enable_onnx_export = True
    try:
        yield
    finally:
        quant_nn.TensorQuantizer._enable_onnx_export = False
