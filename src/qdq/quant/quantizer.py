"""The ``Quantizer`` module: a spec, a calibrator, an ``amax`` buffer and a mode."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qdq.calib import CalibrationError, make_calibrator
from qdq.config import CalibSpec, QuantSpec
from qdq.quant.onnx_qdq import current_exporter, emit_qdq
from qdq.quant.primitives import check_amax_values, fake_quant_unchecked

__all__ = ["QuantMode", "Quantizer", "quantizer_mode"]


class QuantMode(str, enum.Enum):
    """What a :class:`Quantizer` does in ``forward``."""

    CALIBRATE = "calibrate"  #: feed the calibrator, return the input unchanged
    QUANTIZE = "quantize"  #: fake-quantize with the stored amax
    BYPASS = "bypass"  #: return the input unchanged


class Quantizer(nn.Module):
    """Fake-quantizes a tensor with ONNX Q/DQ numerics; collects calibration data on demand.

    Args:
        spec: bits, per-channel axis, narrow range.
        calib: how amax is calibrated (default: histogram + entropy per tensor, max per channel).
        name: a human name used in messages and reports (e.g. ``"layer1.0.conv1.input"``).

    Example:
        >>> q = Quantizer(name="demo")
        >>> q.mode = QuantMode.CALIBRATE
        >>> _ = q(torch.linspace(-2.0, 2.0, 101))
        >>> q.load_calib_amax("max")
        tensor(2.)
        >>> q.mode = QuantMode.QUANTIZE
        >>> q(torch.tensor([0.01, 1.0, 3.0]))
        tensor([0.0157, 1.0079, 2.0000])
    """

    amax: torch.Tensor

    def __init__(
        self, spec: QuantSpec | None = None, calib: CalibSpec | None = None, *, name: str = ""
    ) -> None:
        super().__init__()
        self.spec = spec if spec is not None else QuantSpec()
        if calib is None:
            calib = CalibSpec() if self.spec.axis is None else CalibSpec.weights()
        self.calib = calib
        self.name = name
        self.calibrator = make_calibrator(self.spec, calib)
        self.mode = QuantMode.QUANTIZE
        self.export_opset = 13
        self.register_buffer("amax", torch.empty(0))

    # ------------------------------------------------------------------ state
    @property
    def mode(self) -> QuantMode:
        """The current :class:`QuantMode` (assign a mode or its string value)."""
        return self._mode

    @mode.setter
    def mode(self, value: QuantMode | str) -> None:
        try:
            self._mode = QuantMode(value)
        except ValueError:
            choices = ", ".join(m.value for m in QuantMode)
            raise ValueError(
                f"quantizer {self.name!r}: unknown mode {value!r}; choose one of {choices}"
            ) from None

    @property
    def is_calibrated(self) -> bool:
        """Whether an amax is set."""
        return self.amax.numel() > 0

    def set_amax(self, amax: torch.Tensor | float) -> None:
        """Set amax directly (validated: finite, non-negative, the right number of channels)."""
        t = torch.as_tensor(amax, dtype=torch.float32).detach()
        check_amax_values(t, what=f"quantizer {self.name!r} amax")
        if self.spec.axis is None:
            if t.numel() != 1:
                raise ValueError(
                    f"quantizer {self.name!r} is per-tensor but got amax of shape {tuple(t.shape)}"
                )
            t = t.reshape(())
        else:
            t = t.reshape(-1)
        self.amax = t.to(self.amax.device)

    def load_calib_amax(
        self, method: str | None = None, *, percentile: float | None = None
    ) -> torch.Tensor:
        """Compute amax from the collected statistics and store it; return it.

        Args:
            method: ``"max"``, ``"entropy"``, ``"mse"`` or ``"percentile"``; default ``self.calib``'s.
            percentile: for ``method="percentile"``; default ``self.calib.percentile``.

        Raises:
            CalibrationError: nothing was collected (the message names this quantizer).
        """
        m = self.calib.method if method is None else method
        if m == "percentile" and percentile is None:
            percentile = self.calib.percentile
        try:
            amax = self.calibrator.compute_amax(m, percentile=percentile)
        except CalibrationError as err:
            raise CalibrationError(f"quantizer {self.name!r}: {err}") from None
        self.set_amax(amax)
        return self.amax.clone()

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the current mode to ``x``."""
        if self._mode is QuantMode.BYPASS:
            return x
        if current_exporter() is not None and self._mode is QuantMode.QUANTIZE:
            return self._export_qdq(x)
        if self._mode is QuantMode.CALIBRATE:
            try:
                self.calibrator.collect(x)
            except CalibrationError as err:
                raise CalibrationError(f"quantizer {self.name!r}: {err}") from None
            return x
        if not self.is_calibrated:
            raise RuntimeError(
                f"quantizer {self.name!r} has no amax: calibrate it first "
                "(qdq.calibrate / load_calib_amax / set_amax) or set mode='bypass'"
            )
        return fake_quant_unchecked(
            x,
            self.amax,
            num_bits=self.spec.num_bits,
            axis=self.spec.axis,
            narrow_range=self.spec.narrow_range,
        )

    def _export_qdq(self, x: torch.Tensor) -> torch.Tensor:
        scale = getattr(self, "export_scale", None)
        zero_point = getattr(self, "export_zero_point", None)
        if not isinstance(scale, torch.Tensor) or not isinstance(zero_point, torch.Tensor):
            raise RuntimeError(
                f"quantizer {self.name!r} has no export scale; export with qdq.export_onnx"
            )
        return emit_qdq(x, scale, zero_point, self.spec.axis, int(self.export_opset))

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        key = prefix + "amax"
        if key in state_dict:  # amax's shape is only known once calibrated: adopt the saved one
            self.amax = torch.empty_like(state_dict[key], device=self.amax.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        parts = [f"name={self.name!r}"] if self.name else []
        parts.append(f"mode={self._mode.value}")
        parts.append(f"bits={self.spec.num_bits}")
        if self.spec.axis is not None:
            parts.append(f"axis={self.spec.axis}")
        if self.spec.narrow_range:
            parts.append("narrow")
        if not self.is_calibrated:
            parts.append("amax=None")
        elif self.amax.dim() == 0:
            parts.append(f"amax={float(self.amax):.6g}")
        else:
            lo, hi = float(self.amax.min()), float(self.amax.max())
            parts.append(f"amax=[{self.amax.numel()}] {lo:.4g}..{hi:.4g}")
        parts.append(f"calib={self.calib.calibrator}/{self.calib.method}")
        return ", ".join(parts)


@contextlib.contextmanager
def quantizer_mode(module: nn.Module, mode: QuantMode | str) -> Iterator[list[Quantizer]]:
    """Temporarily put every :class:`Quantizer` inside ``module`` in ``mode``; restore on exit.

    Example:
        >>> net = torch.nn.Sequential(Quantizer(name="in"))
        >>> with quantizer_mode(net, "calibrate"):
        ...     _ = net(torch.ones(4))
        >>> net[0].mode.value
        'quantize'
    """
    target = QuantMode(mode)
    quantizers = [m for m in module.modules() if isinstance(m, Quantizer)]
    saved = [q.mode for q in quantizers]
    try:
        for q in quantizers:
            q.mode = target
        yield quantizers
    finally:
        for q, old in zip(quantizers, saved, strict=True):
            q.mode = old
