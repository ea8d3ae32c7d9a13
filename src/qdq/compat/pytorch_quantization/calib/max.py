"""``pytorch_quantization.calib.max``: :class:`MaxCalibrator`, the running absolute maximum."""

from __future__ import annotations

import numpy as np
import torch

from qdq.compat.pytorch_quantization.calib.calibrator import Axis, _Calibrator, abs_if_negative

__all__ = ["MaxCalibrator"]


def _kept_axes(axis: Axis, rank: int) -> list[int]:
    """The non-negative kept axes of a rank-``rank`` tensor (``axis=None``: none kept)."""
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    return [a + rank if a < 0 else a for a in axes if a is not None]


def _abs_max_keep(x: torch.Tensor, reduce: list[int]) -> torch.Tensor:
    """``max |x|`` over the ``reduce`` dims, kept as size-1 dims; a single value comes back as a
    0-dim tensor (upstream's ``reduce_amax`` shapes), dtype as ``x``'s."""
    with torch.no_grad():
        out = x.abs()
        for dim in reduce:
            out = torch.amax(out, dim=dim, keepdim=True)
        if out.numel() == 1:
            out = out.reshape(())
        return out


class MaxCalibrator(_Calibrator):
    """Tracks ``max |x|`` over every collected tensor, per tensor or along the kept ``axis``.

    The amax keeps the collected tensor's rank with size-1 reduced dims (``(C, 1, 1, 1)`` for a
    Conv weight with ``axis=0``); a per-tensor amax is a 0-dim tensor. Its dtype and device are the
    collected tensor's.

    Args:
        num_bits: the quantization width (max does not depend on it).
        axis: ``None`` (per tensor), or the kept axis or axes (ints, negative counts from the end).
        unsigned: the quantizer's range is unsigned.
        track_amax: also keep every batch's amax (numpy arrays) in :attr:`amaxs`.

    Example:
        >>> cal = MaxCalibrator(8, 0, False)
        >>> cal.collect(torch.tensor([[1.0, -3.0], [0.5, 0.25]]))
        >>> cal.compute_amax()
        tensor([[3.0000],
                [0.5000]])
    """

    def __init__(
        self,
        num_bits: int | tuple[int, int] = 8,
        axis: Axis = None,
        unsigned: bool = False,
        track_amax: bool = False,
    ) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._track_amax = track_amax
        if track_amax:
            self._amaxs: list[np.ndarray] = []
        self._calib_amax: torch.Tensor | None = None

    @property
    def amaxs(self) -> list[np.ndarray]:
        """Every collected batch's amax, in order (only with ``track_amax=True``).

        Raises:
            AttributeError: the calibrator was built without ``track_amax``.
        """
        if not self._track_amax:
            raise AttributeError("MaxCalibrator keeps amaxs only when built with track_amax=True")
        return self._amaxs

    def collect(self, x: torch.Tensor) -> None:
        """Fold ``max |x|`` into the running maximum.

        Raises:
            RuntimeError: the amax shape changed from an earlier batch ("amax shape changed!").
        """
        x = abs_if_negative(x)
        kept = _kept_axes(self._axis, x.dim())
        local = _abs_max_keep(x, [d for d in range(x.dim()) if d not in kept]).detach()
        if self._calib_amax is None:
            self._calib_amax = local
        else:
            if local.shape != self._calib_amax.shape:
                raise RuntimeError(
                    f"amax shape changed! {tuple(self._calib_amax.shape)} collected before, "
                    f"{tuple(local.shape)} now"
                )
            self._calib_amax.copy_(torch.max(self._calib_amax, local))
        if self._track_amax:  # a copy: on the CPU the first batch's amax is the running one
            self._amaxs.append(local.cpu().numpy().copy())

    def reset(self) -> None:
        """Forget the running maximum (the tracked :attr:`amaxs` stay, as upstream)."""
        self._calib_amax = None

    def compute_amax(self) -> torch.Tensor | None:
        """The running maximum (the calibrator's own tensor), or ``None`` before any data."""
        return self._calib_amax

    def __str__(self) -> str:
        return f"MaxCalibrator(track_amax={self._track_amax})"

    def __repr__(self) -> str:
        text = f"MaxCalibrator({super().__repr__()} calib_amax={self._calib_amax}"
        text += f" track_amax={self._track_amax}"
        if self._track_amax:
            text += f" amaxs={self._amaxs}"
        return text + ")"
