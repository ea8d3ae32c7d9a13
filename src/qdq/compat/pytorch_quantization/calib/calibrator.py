"""``pytorch_quantization.calib.calibrator``: the ``_Calibrator`` base class.

Every calibrator answers three calls, as upstream's: :meth:`collect` one tensor's statistics,
:meth:`compute_amax` from what was collected, :meth:`reset` to forget it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["_Calibrator"]

_log = logging.getLogger("qdq.compat")
_warned_negative = False

Axis = int | tuple[int, ...] | list[int] | None


class _Calibrator:
    """Base of the calibrators: holds the quantizer's ``num_bits``, ``axis`` and ``unsigned``.

    Args:
        num_bits: the quantization width (an int, or ``(4, 3)`` for E4M3).
        axis: the kept axis or axes (``None``: per tensor), as in ``QuantDescriptor``.
        unsigned: the quantizer's range is unsigned.
    """

    def __init__(self, num_bits: int | tuple[int, int], axis: Axis, unsigned: bool) -> None:
        self._num_bits = num_bits
        self._axis = axis
        self._unsigned = unsigned

    @property
    def num_bits(self) -> int | tuple[int, int]:
        """The quantization width given at construction."""
        return self._num_bits

    @property
    def axis(self) -> Axis:
        """The kept axis or axes (``None``: per tensor)."""
        return self._axis

    @property
    def unsigned(self) -> bool:
        """Whether the quantizer's range is unsigned."""
        return self._unsigned

    def collect(self, x: torch.Tensor) -> None:
        """Fold one tensor's statistics in (subclasses implement it)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget what was collected (subclasses implement it)."""
        raise NotImplementedError

    def compute_amax(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """The amax from what was collected (subclasses implement it)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"num_bits={self._num_bits} axis={self._axis} unsigned={self._unsigned}"


def abs_if_negative(x: torch.Tensor) -> torch.Tensor:
    """``x.abs()`` when ``x`` holds a negative value (logged once per process, as upstream),
    else ``x`` itself: calibrators see magnitudes."""
    global _warned_negative
    if bool(torch.min(x) < 0.0):
        if not _warned_negative:
            _warned_negative = True
            _log.info(
                "Calibrator encountered negative values. It shouldn't happen after ReLU. "
                "Make sure this is the right tensor to calibrate."
            )
        return x.abs()
    return x
