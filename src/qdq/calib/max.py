"""Running absolute-maximum calibrator, per tensor or per channel."""

from __future__ import annotations

import numpy as np
import torch

from qdq._validate import normalize_axis
from qdq.calib.base import CalibrationError, Calibrator, all_reduce, nonfinite_error

__all__ = ["MaxCalibrator"]


class MaxCalibrator(Calibrator):
    """Track ``max |x|`` over all batches, globally (``axis=None``) or per channel along ``axis``.

    Args:
        axis: the channel axis kept in the result (e.g. 0 for Conv/Linear weights); ``None`` reduces
            everything to one number.

    Example:
        >>> cal = MaxCalibrator(axis=0)
        >>> cal.collect(torch.tensor([[1.0, -3.0], [0.5, 0.25]]))
        >>> cal.compute_amax()
        tensor([3.0000, 0.5000])
    """

    methods = ("max",)

    def __init__(self, axis: int | None = None) -> None:
        super().__init__()
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise TypeError(f"axis must be an int or None, got {type(axis).__name__}")
        self.axis = axis
        self._amax: torch.Tensor | None = None
        #: per batch: (index, whether its maxima were finite), read once when amax is read
        self._finite: list[tuple[int, torch.Tensor]] = []
        #: the first of those read back without NaN/inf by :meth:`_receive_reads`, not raised yet
        self._bad_read: int | None = None

    def _collect(self, x: torch.Tensor, index: int) -> None:
        ax = normalize_axis(self.axis, x.dim())
        if x.numel() == 0:
            return
        a = x.abs()
        if ax is None:
            batch_max = a.max().to(torch.float32)
        else:
            dims = [d for d in range(x.dim()) if d != ax]
            batch_max = (a.amax(dim=dims) if dims else a).to(torch.float32)
        # no host synchronisation per batch (a GPU would wait for it): checked when amax is read
        self._finite.append((index, torch.isfinite(batch_max).all()))
        if self._amax is None:
            self._amax = batch_max
            return
        if self._amax.shape != batch_max.shape:
            raise CalibrationError(
                f"calibration batch {index} has {batch_max.numel()} channels along axis "
                f"{self.axis}, earlier batches had {self._amax.numel()}"
            )
        self._amax = torch.maximum(self._amax, batch_max)

    def _reset(self) -> None:
        self._amax = None
        self._finite = []
        self._bad_read = None

    def _pending_reads(self, method: str) -> list[torch.Tensor]:
        del method
        if not self._finite:
            return []
        return [torch.stack([f for _, f in self._finite]).to(torch.int64)]

    def _receive_reads(self, values: list[np.ndarray]) -> None:
        self._take_flags(values[0].tolist())

    def _take_flags(self, flags: list[int] | list[bool]) -> None:
        """Keep the first batch whose flag is false (NaN/inf) to raise; forget the flags."""
        bad = [index for (index, _), ok in zip(self._finite, flags, strict=True) if not ok]
        self._finite = []
        if bad and self._bad_read is None:
            self._bad_read = bad[0]

    def _check_finite(self) -> None:
        """Raise for the first batch collected with NaN/inf (one read back for all of them,
        none when :func:`qdq.calib.batched.read_back` read them already)."""
        if self._finite:
            self._take_flags(torch.stack([f for _, f in self._finite]).cpu().tolist())
        if self._bad_read is not None:
            index, self._bad_read = self._bad_read, None
            raise nonfinite_error(index)

    def _sync(self, group: object) -> None:
        self._check_finite()
        # first agree on the channel count (-1: this rank saw nothing), then take the max
        n = -1 if self._amax is None else self._amax.numel()
        low = -(n if n >= 0 else 1 << 62)  # max(-n) over the ranks with data = -min(n)
        sizes = all_reduce(torch.tensor([n, low], dtype=torch.int64), "max", group)
        largest, smallest = int(sizes[0]), -int(sizes[1])
        if largest < 0:
            return  # no rank collected anything
        if smallest != largest:
            raise CalibrationError(
                f"ranks collected different channel counts along axis {self.axis} "
                f"(from {smallest} to {largest}; this rank {n})"
            )
        local = self._amax if self._amax is not None else torch.zeros(largest)
        shape = self._amax.shape if self._amax is not None else None
        reduced = all_reduce(local.to(torch.float32).reshape(-1), "max", group)
        if shape is None:  # a rank without data adopts the others' layout
            shape = torch.Size([]) if self.axis is None else torch.Size([largest])
        self._amax = reduced.reshape(shape)

    def _absorb(self, other: Calibrator) -> None:
        assert isinstance(other, MaxCalibrator)
        if other.axis != self.axis:
            raise TypeError(
                f"cannot merge a max along axis {other.axis} into one along {self.axis}"
            )
        self._check_finite()
        other._check_finite()
        if other._amax is None:
            return
        if self._amax is None:
            self._amax = other._amax.clone()
        elif self._amax.shape != other._amax.shape:
            raise CalibrationError(
                f"cannot merge a max over {other._amax.numel()} channels into one over "
                f"{self._amax.numel()}"
            )
        else:
            self._amax = torch.maximum(self._amax, other._amax.to(self._amax.device))

    def compute_amax(self, method: str = "max", *, percentile: float | None = None) -> torch.Tensor:
        """Return the running abs-max (``method`` must be ``"max"``)."""
        self._check_method(method, percentile)
        self._check_has_data()
        self._check_finite()
        if self._amax is None:
            raise CalibrationError("MaxCalibrator collected only empty tensors")
        return self._amax.clone()

    def __repr__(self) -> str:
        return f"MaxCalibrator(axis={self.axis}, batches={self.num_batches})"
