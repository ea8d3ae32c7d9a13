""":func:`calibrate_weights`: every quantized module's weight amax straight from its weight.

Re-exported by ``pytorch_quantization.calib`` and ``calib.histogram`` (where upstream defines it).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from qdq.compat.pytorch_quantization.calib._amax import (
    _compute_amax_mse,
    _compute_amax_percentile,
)

__all__ = ["calibrate_weights"]

_log = logging.getLogger("qdq.compat")
_METHODS = ("max", "mse", "percentile")


#: Weights laid out ``(C_in, C_out/groups, k...)``: the output channels are axis 1. The quant
#: ConvTranspose classes subclass these (so calib needs nothing from the quant modules, which
#: import calib).
_TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def _channel_axis(module: torch.nn.Module, perchannel: bool) -> int | None:
    if not perchannel:
        return None
    return 1 if isinstance(module, _TRANSPOSED) else 0


def _histograms(
    weight: torch.Tensor, axis: int | None, num_bins: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``np.histogram`` of ``|weight|`` over ``[0, max]``, whole (always 2048 bins, as upstream)
    or one per channel along ``axis`` (``num_bins`` bins)."""
    if axis is None:
        w = weight.abs().cpu().detach().numpy()
        return [np.histogram(w, bins=2048, range=(0, w.max()))]
    out = []
    for i in range(weight.shape[axis]):
        index = torch.tensor(i, device=weight.device)
        w = weight.index_select(axis, index).abs().cpu().detach().numpy()
        out.append(np.histogram(w, bins=num_bins, range=(0, w.max())))
    return out


def calibrate_weights(
    model: torch.nn.Module,
    method: str = "percentile",
    perchannel: bool = True,
    percentile: float = 99.99,
    num_bins: int = 2048,
) -> None:
    """Set the weight amax of every module with a ``weight`` and a ``weight_quantizer`` from the
    weight itself, by ``method`` — not by the calibrator the quantizer holds.

    Per channel, the axis is the output channels (dim 0; dim 1 for transposed convolutions) and
    each channel gets its own ``num_bins``-bin histogram; per tensor the histogram has 2048 bins
    whatever ``num_bins`` says (as upstream). The histograms are numpy's over ``[0, max|w|]``.

    Args:
        model: the model; its quantized modules are changed in place.
        method: ``"percentile"`` (default), ``"mse"`` or ``"max"``.
        perchannel: one amax per output channel (default) or one per tensor.
        percentile: for ``"percentile"``.
        num_bins: bins of each per-channel histogram.

    Raises:
        TypeError: an unknown method ("Unsupported calibration method ...").

    Example:
        >>> from qdq.compat.pytorch_quantization import nn as quant_nn
        >>> conv = quant_nn.QuantConv2d(3, 4, 3)
        >>> calibrate_weights(conv, method="max")
        >>> tuple(conv.weight_quantizer.amax.shape)
        (4, 1, 1, 1)
    """
    for name, module in model.named_modules():
        if not (hasattr(module, "weight") and hasattr(module, "weight_quantizer")):
            continue
        _log.info("Calibrate weight of %s", name)
        if method not in _METHODS:
            raise TypeError(f"Unsupported calibration method {method}")
        quantizer = module.weight_quantizer
        weight: torch.Tensor = module.weight
        axis = _channel_axis(module, perchannel)
        amaxs: list[torch.Tensor | None] = []
        if method == "max":
            with torch.no_grad():
                reduce = [d for d in range(weight.dim()) if d != axis]
                amaxs.append(torch.amax(weight.abs(), dim=reduce, keepdim=True))
                if amaxs[0] is not None and amaxs[0].numel() == 1:
                    amaxs[0] = amaxs[0].reshape(())
        else:
            num_bits, unsigned = quantizer.num_bits, quantizer.unsigned
            for hist, edges in _histograms(weight, axis, num_bins):
                if method == "mse":
                    amax = _compute_amax_mse(hist, edges, num_bits, unsigned, device=weight.device)
                else:
                    amax = _compute_amax_percentile(hist, edges, percentile)
                amaxs.append(amax)
        if axis is None:
            result = amaxs[0]
        else:
            shape = [1] * weight.dim()
            shape[axis] = weight.shape[axis]
            result = torch.stack(amaxs).reshape(shape)  # type: ignore[arg-type]
        assert result is not None
        quantizer.amax = result.detach().cpu().numpy()
