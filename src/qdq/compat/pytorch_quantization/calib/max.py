"""``pytorch_quantization.calib.MaxCalibrator`` backed by :class:`qdq.calib.MaxCalibrator`."""

from __future__ import annotations

import torch

from qdq.calib import MaxCalibrator as _QdqMax
from qdq.compat.pytorch_quantization.tensor_quant import _check_axis, single_axis

__all__ = ["MaxCalibrator"]


class MaxCalibrator:
    """Running ``max |x|``, per tensor or along the kept ``axis`` (upstream's signature).

    :meth:`compute_amax` returns amax with the collected tensor's rank (kept dims of size 1,
    e.g. ``(C, 1, 1, 1)`` for Conv weights), as upstream stores ``_amax``; ``None`` before any data.

    Args:
        num_bits: the quantization width (kept for the quantizer; max does not depend on it).
        axis: ``None`` or the one kept axis (an int or a 1-tuple).
        unsigned: the quantizer's range is unsigned.
        track_amax: also keep every batch's amax in :attr:`amaxs`.

    Example:
        >>> cal = MaxCalibrator(8, axis=0)
        >>> cal.collect(torch.tensor([[1.0, -3.0], [0.5, 0.25]]))
        >>> cal.compute_amax()
        tensor([[3.0000],
                [0.5000]])
    """

    def __init__(
        self,
        num_bits: int = 8,
        axis: int | tuple[int, ...] | None = None,
        unsigned: bool = False,
        track_amax: bool = False,
    ) -> None:
        _check_axis(axis)
        self._num_bits = num_bits
        self._axis = axis
        self._unsigned = unsigned
        self._track_amax = track_amax
        self._amaxs: list[torch.Tensor] = []
        self._impl = _QdqMax(axis=single_axis(axis))
        self._shape: list[int] | None = None

    def collect(self, x: torch.Tensor) -> None:
        """Fold one batch into the running max (and :attr:`amaxs` with ``track_amax``).

        Raises:
            TypeError: not a floating-point tensor.
            qdq.calib.CalibrationError: NaN/inf values, or a changed channel count.
        """
        before = self._impl.num_batches
        self._impl.collect(x)
        ax = single_axis(self._axis)
        shape = [1] * x.dim()
        if ax is not None:
            shape[ax] = x.shape[ax]
        self._shape = shape
        if self._track_amax and self._impl.num_batches > before:
            dims = [d for d in range(x.dim()) if ax is None or d != ax % x.dim()]
            self._amaxs.append(x.detach().abs().amax(dim=dims).to(torch.float32).cpu())

    def reset(self) -> None:
        """Forget everything collected."""
        self._impl.reset()
        self._amaxs = []
        self._shape = None

    def compute_amax(self) -> torch.Tensor | None:
        """The running abs-max in the collected tensor's rank, or ``None`` before any data."""
        if self._impl.num_batches == 0 or self._shape is None:
            return None
        return self._impl.compute_amax().reshape(self._shape)

    @property
    def amaxs(self) -> list[torch.Tensor] | None:
        """Every batch's amax (``track_amax=True``), else ``None``."""
        return self._amaxs if self._track_amax else None

    def __repr__(self) -> str:
        return (
            f"MaxCalibrator(num_bits={self._num_bits}, axis={self._axis}, "
            f"unsigned={self._unsigned}, track_amax={self._track_amax})"
        )
