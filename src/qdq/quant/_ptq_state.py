"""The state :mod:`qdq.ptq` learns on a weight :class:`~qdq.quant.Quantizer` (AdaRound codes, a
bias correction): set, apply, export and check it. The storage format and the staleness rules are
described in :mod:`qdq.quant.learned`; :class:`PtqState` is the part of the quantizer that uses them.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from qdq._validate import normalize_axis
from qdq.config import QuantSpec
from qdq.quant import learned as learned_state
from qdq.quant.primitives import quant_range, scale_from_amax

__all__ = ["PtqState"]


class PtqState(nn.Module):
    """Learned-state methods of :class:`~qdq.quant.Quantizer` (its base class)."""

    amax: torch.Tensor
    spec: QuantSpec
    name: str
    _mode: Any
    _learned_key: tuple[Any, ...] | None

    @property
    def learned(self) -> dict[str, Any]:
        """What :mod:`qdq.ptq` learned for this weight quantizer (``{}`` when nothing).

        Keys: ``"rounding"`` and/or ``"bias_correction"`` (each the settings used), ``"weight"``
        and ``"amax"`` (what it was learned from; see :mod:`qdq.quant.learned`).
        """
        record = self._buffers.get("learned_record")
        return learned_state.decode(record) if isinstance(record, torch.Tensor) else {}

    @property
    def has_rounding(self) -> bool:
        """Whether learned INT8 codes (``rounding_codes``) replace nearest rounding."""
        return "rounding_codes" in self._buffers

    @property
    def has_bias_delta(self) -> bool:
        """Whether a bias correction (``bias_delta``) is added to the layer's bias."""
        return "bias_delta" in self._buffers

    def set_rounding(
        self, codes: torch.Tensor, weight: torch.Tensor, settings: dict[str, Any]
    ) -> None:
        """Use ``codes`` (integers in the spec's range, ``weight``'s shape) for ``weight``.

        The quantized weight becomes ``scale · codes`` (amax and scale unchanged). A bias
        correction measured with the previous rounding is dropped, with a warning.

        Raises:
            ValueError: no amax yet, a shape mismatch, or codes outside the integer range.
        """
        if self.amax.numel() == 0:
            raise ValueError(f"quantizer {self.name!r} has no amax: calibrate before rounding")
        if self.spec.format != "int8":
            raise ValueError(
                f"quantizer {self.name!r} is {self.spec.format.upper()}: learned rounding (AdaRound, "
                "kernel sums) chooses integer codes; an FP8 weight rounds to nearest"
            )
        qmin, qmax = quant_range(self.spec.num_bits, self.spec.narrow_range)
        if codes.shape != weight.shape:
            raise ValueError(
                f"quantizer {self.name!r}: codes of shape {tuple(codes.shape)} for a weight of "
                f"shape {tuple(weight.shape)}"
            )
        if codes.numel() and (int(codes.min()) < qmin or int(codes.max()) > qmax):
            raise ValueError(f"quantizer {self.name!r}: codes outside [{qmin}, {qmax}]")
        if self.has_bias_delta:
            warnings.warn(
                f"quantizer {self.name!r}: its bias correction was measured with the previous "
                "rounding and is dropped; run qdq.ptq.bias.correct_bias again",
                stacklevel=2,
            )
            self.clear_learned("bias_correction")
        self.register_buffer(
            "rounding_codes", codes.detach().to(device=self.amax.device, dtype=torch.int8)
        )
        self._write_record(weight, "rounding", settings)

    def set_bias_delta(
        self, delta: torch.Tensor, weight: torch.Tensor, settings: dict[str, Any]
    ) -> None:
        """Add ``delta`` (one value per output channel) to the layer's bias when quantizing.

        Raises:
            ValueError: no amax yet, or ``delta`` does not have one value per channel of
                ``weight`` along axis 0.
        """
        if self.amax.numel() == 0:
            raise ValueError(f"quantizer {self.name!r} has no amax: calibrate before correcting")
        if delta.dim() != 1 or weight.dim() == 0 or delta.numel() != weight.shape[0]:
            raise ValueError(
                f"quantizer {self.name!r}: bias delta of shape {tuple(delta.shape)} for a weight "
                f"of shape {tuple(weight.shape)} (one value per output channel expected)"
            )
        value = delta.detach().to(device=self.amax.device, dtype=torch.float32)
        self.register_buffer("bias_delta", value)
        self._write_record(weight, "bias_correction", settings)

    def clear_learned(self, what: str | None = None) -> None:
        """Forget learned state: ``"rounding"``, ``"bias_correction"`` or (``None``) both."""
        if what not in (None, "rounding", "bias_correction"):
            raise ValueError(f"what must be 'rounding', 'bias_correction' or None, got {what!r}")
        record = self.learned
        for part, buffer in (("rounding", "rounding_codes"), ("bias_correction", "bias_delta")):
            if what in (None, part):
                self._buffers.pop(buffer, None)
                record.pop(part, None)
        if "rounding" in record or "bias_correction" in record:
            self.register_buffer("learned_record", learned_state.encode(record, self.amax.device))
        else:
            self._buffers.pop("learned_record", None)
        self._learned_key = None

    def corrected_bias(
        self, bias: torch.Tensor | None, weight: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The layer's bias as the INT8 model uses it: ``bias + bias_delta`` in ``QUANTIZE`` mode
        (``bias_delta`` alone for a layer without bias), ``bias`` otherwise.

        Called by the call-site runtime with the bias argument of the layer's call; ``weight``
        gives the dtype when there is no bias. At export the sum of two constants is folded into
        the bias initializer by both exporters.
        """
        delta = self._buffers.get("bias_delta")
        if self._mode != "quantize" or not isinstance(delta, torch.Tensor):
            return bias
        if bias is None:
            dtype = weight.dtype if isinstance(weight, torch.Tensor) else delta.dtype
            return delta if delta.dtype == dtype else delta.to(dtype)
        return bias + delta.to(bias.dtype)

    def export_constants(self, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        """Buffers :func:`qdq.export_onnx` attaches for the export: ``export_weight`` =
        ``scale · code`` when rounding is learned (it quantizes back to exactly ``code``)."""
        codes = self._buffers.get("rounding_codes")
        if not isinstance(codes, torch.Tensor):
            return {}
        return {"export_weight": codes.to(scale.dtype) * self._broadcast(scale, codes.dim())}

    def _broadcast(self, scale: torch.Tensor, ndim: int) -> torch.Tensor:
        axis = normalize_axis(self.spec.axis, ndim)
        if axis is None:
            return scale.reshape(())
        shape = [1] * ndim
        shape[axis] = -1
        return scale.reshape(shape)

    def _rounded_weight(self, x: torch.Tensor) -> torch.Tensor:
        """``scale · code`` in float32 (as ``DequantizeLinear``), in ``x``'s dtype; the gradient
        passes straight to the float weight (which then makes the codes stale)."""
        codes = self._buffers["rounding_codes"]
        assert codes is not None
        scale = scale_from_amax(self.amax.detach(), self.spec.num_bits)
        out = (codes.to(torch.float32) * self._broadcast(scale, codes.dim())).to(x.dtype)
        if torch.is_grad_enabled() and x.requires_grad:
            out = out + (x - x.detach())
        return out

    def _write_record(self, weight: torch.Tensor, part: str, settings: dict[str, Any]) -> None:
        record = self.learned
        record[part] = dict(settings)
        record["weight"] = {
            "shape": list(weight.shape),
            "dtype": str(weight.dtype),
            "sums": learned_state.fingerprint(weight),
        }
        record["amax"] = [float(v) for v in self.amax.detach().reshape(-1).cpu()]
        self.register_buffer("learned_record", learned_state.encode(record, self.amax.device))
        self._learned_key = None

    def _check_learned(self, x: torch.Tensor) -> None:
        """Raise :class:`~qdq.quant.learned.StaleStateError` when the float weight or amax moved
        since the state was learned (re-checked only when either was replaced or written)."""
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return
        try:
            key = (x.data_ptr(), x._version, x.dtype, x.device, self.amax.data_ptr(),
                   self.amax._version, self.amax.dtype)  # fmt: skip
        except (RuntimeError, NotImplementedError):  # fake or inference tensors: check every time
            key = None
        if key is not None and key == getattr(self, "_learned_key", None):
            return
        record = self.learned
        why = learned_state.check_fingerprint(record, x, self.amax)
        if why:
            parts = " and ".join(p for p in ("rounding", "bias_correction") if p in record)
            raise learned_state.StaleStateError(
                f"quantizer {self.name!r}: its learned {parts} no longer fits ({why}); run "
                "qdq.ptq again on the current weights, or drop it with "
                f"clear_learned() on {self.name!r}"
            )
        self._learned_key = key
