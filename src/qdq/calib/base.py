"""The calibrator protocol: ``collect(x)`` batches, then ``compute_amax(method)``, ``reset()``."""

from __future__ import annotations

import abc

import numpy as np
import torch

__all__ = ["CalibrationError", "Calibrator", "all_reduce", "distributed_active"]


class CalibrationError(ValueError):
    """Bad calibration data or state (NaN/inf in a batch, no data, a changed shape, ...)."""


class Calibrator(abc.ABC):
    """Base class of calibrators: streaming statistics of a tensor → a clipping magnitude ``amax``.

    Subclasses implement :meth:`_collect`, :meth:`compute_amax`, :meth:`_reset` and :attr:`methods`.
    The base class validates inputs and counts batches, so every error names the batch it came from.
    """

    #: The ``method`` names :meth:`compute_amax` accepts.
    methods: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._num_batches = 0

    @property
    def num_batches(self) -> int:
        """How many batches :meth:`collect` has seen since the last :meth:`reset`."""
        return self._num_batches

    def collect(self, x: torch.Tensor) -> None:
        """Add one batch of data to the statistics.

        Raises:
            TypeError: ``x`` is not a floating-point tensor.
            CalibrationError: ``x`` contains NaN or inf (the message names the batch index).
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"calibrators collect torch.Tensor batches, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"calibrators collect floating-point tensors, got dtype {x.dtype}")
        index = self._num_batches
        with torch.no_grad():
            self._collect(x.detach() if x.requires_grad else x, index)  # a detach is an op
        self._num_batches += 1

    def reset(self) -> None:
        """Forget everything collected."""
        self._num_batches = 0
        self._reset()

    def sync(self, group: object = None) -> None:
        """Combine the statistics collected on every rank of a ``torch.distributed`` process
        group, so that every rank holds what one process would have collected from all batches.

        A no-op without ``torch.distributed`` or with one process. Every rank must call it, in the
        same order for every calibrator (a collective). Ranks that saw no data take part.

        Raises:
            CalibrationError: ranks collected tensors of different channel counts.
        """
        if not distributed_active(group):
            return
        self._sync(group)
        self._num_batches = int(all_reduce(torch.tensor([self._num_batches]), "sum", group)[0])

    def _sync(self, group: object) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be synchronised across ranks")

    def absorb(self, other: Calibrator) -> None:
        """Add ``other``'s statistics to these, exactly as if its batches had been collected
        here too (the union of two sets of batches; :func:`qdq.calib.parts.calibrate_parts`).

        Raises:
            TypeError: ``other`` is another kind of calibrator, or has other settings.
            CalibrationError: the two collected tensors of different channel counts.
        """
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        self._absorb(other)
        self._num_batches += other._num_batches

    def _absorb(self, other: Calibrator) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot merge statistics")

    def _pending_reads(self, method: str) -> list[torch.Tensor]:
        """The device tensors :meth:`compute_amax` by ``method`` would read back now, as 1-D
        int64 tensors on one device (bit patterns: a float64 is viewed as int64), or ``[]``.

        :func:`qdq.calib.batched.read_back` reads those of every calibrator in one transfer and
        hands each its values through :meth:`_receive_reads`, so that computing the amax of many
        calibrators waits for the device once, not once per calibrator.
        """
        del method
        return []

    def _receive_reads(self, values: list[np.ndarray]) -> None:
        """Take the host copies of :meth:`_pending_reads` (same order and sizes, int64): they
        stand for the device values until the statistics change. Raises nothing: a bad batch is
        reported when the amax is computed."""
        raise NotImplementedError(f"{type(self).__name__} asked for no reads")

    @abc.abstractmethod
    def compute_amax(self, method: str = "max", *, percentile: float | None = None) -> torch.Tensor:
        """Return ``amax`` (float32, on the device of the collected data) by ``method``."""

    @abc.abstractmethod
    def _collect(self, x: torch.Tensor, index: int) -> None: ...

    @abc.abstractmethod
    def _reset(self) -> None: ...

    def _check_method(self, method: str, percentile: float | None) -> None:
        if method not in self.methods:
            raise ValueError(
                f"unknown calibration method {method!r} for {type(self).__name__}; "
                f"choose one of {', '.join(self.methods)}"
            )
        if percentile is not None and method != "percentile":
            raise ValueError(f"percentile= is only used by method='percentile', not {method!r}")

    def _check_has_data(self) -> None:
        if self._num_batches == 0:
            raise CalibrationError(
                f"{type(self).__name__} has collected no data: run calibration batches first"
            )


def nonfinite_error(index: int) -> CalibrationError:
    """The error for a batch holding NaN or inf."""
    return CalibrationError(
        f"calibration batch {index} contains NaN or inf values; fix the data or the model upstream"
    )


def distributed_active(group: object = None) -> bool:
    """``torch.distributed`` is initialised and ``group`` (default: the world) has > 1 rank."""
    d = torch.distributed
    if not (d.is_available() and d.is_initialized()):
        return False
    return bool(d.get_world_size(group) > 1)  # type: ignore[arg-type]


def all_reduce(t: torch.Tensor, op: str, group: object = None) -> torch.Tensor:
    """``t`` reduced over the ranks (``op``: ``"sum"`` or ``"max"``), returned on ``t``'s device.

    Runs on the backend's device: CUDA for nccl, the CPU otherwise (gloo).
    """
    d = torch.distributed
    nccl = d.get_backend(group) == "nccl"  # type: ignore[arg-type]
    work = t.detach().clone().to("cuda" if nccl else "cpu")
    reduce_op = d.ReduceOp.SUM if op == "sum" else d.ReduceOp.MAX
    d.all_reduce(work, op=reduce_op, group=group)  # type: ignore[call-overload]
    return work.to(t.device)
