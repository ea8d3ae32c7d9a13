"""``pytorch_quantization.nn.TensorQuantizer`` on qdq's numerics and calibrators.

Stages, as upstream: ``forward`` feeds the calibrator when calibration is enabled, and fake-quantizes
when quantization is enabled (both, one or none); ``disable()`` bypasses everything. amax lives in the
``_amax`` buffer (so ``state_dict`` keys match upstream's: ``..._input_quantizer._amax``); before any
amax is set the quantizer quantizes with the input's own abs-max (upstream's dynamic mode).

Export: inside ``torch.onnx.export(..., dynamo=False)`` a quantizer writes ONNX
``QuantizeLinear``/``DequantizeLinear`` with its float32 scale ``amax / qmax``:

* with ``TensorQuantizer.use_fb_fake_quant = True`` (upstream ≤ 2.1 scripts) through torch's own
  ``torch.fake_quantize_per_tensor_affine`` / ``per_channel_affine`` ops, which the exporter maps
  to Q/DQ;
* otherwise through qdq's Q/DQ emission (no ``enable_onnx_export()`` needed).

Outside an export the numerics are always qdq's (bit-exact with ONNX Runtime), also with
``use_fb_fake_quant`` (torch's kernel multiplies by the inverse scale, qdq's does not). Q/DQ cannot
express a narrow range: the graph saturates at ``-qmax-1`` where torch (narrow) saturates at ``-qmax``.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, ClassVar

import torch
from torch import nn

from qdq.compat.pytorch_quantization.calib import HistogramCalibrator, MaxCalibrator
from qdq.compat.pytorch_quantization.tensor_quant import (
    QuantDescriptor,
    fake_tensor_quant,
    quant_bounds,
    single_axis,
    tensor_quant,
)
from qdq.quant.onnx_qdq import emit_qdq
from qdq.quant.primitives import MIN_SCALE

__all__ = ["TensorQuantizer"]

_log = logging.getLogger("qdq.compat")


class TensorQuantizer(nn.Module):
    """Quantizes one tensor as a :class:`QuantDescriptor` says; calibrates it on demand.

    Args:
        quant_desc: the descriptor (default: 8-bit per tensor, max calibration).
        disabled: start bypassed.
        if_quant: start with quantization on.
        if_clip: start with the clip stage on (``learn_amax``: amax is a trainable parameter
            that gets qdq's LSQ gradient; upstream's separate PACT ``Clip`` module is not built).
        if_calib: start with calibration on.

    Example:
        >>> q = TensorQuantizer(QuantDescriptor(num_bits=8, amax=1.27))
        >>> q(torch.tensor([0.5, 3.0]))
        tensor([0.5000, 1.2700])
    """

    #: Export through ``torch.fake_quantize_*`` ops (class-wide, as upstream).
    use_fb_fake_quant: ClassVar[bool] = False

    def __init__(
        self,
        quant_desc: QuantDescriptor = QuantDescriptor(),  # noqa: B008 (frozen: safe)
        disabled: bool = False,
        if_quant: bool = True,
        if_clip: bool = False,
        if_calib: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(quant_desc, QuantDescriptor):
            raise TypeError(
                f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}"
            )
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range
        self._scale: torch.Tensor | None = None
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = if_clip
        self._if_calib = if_calib
        if self._learn_amax:  # trainable (upstream's learn_amax is per tensor too)
            init = 1.0 if quant_desc.amax is None else quant_desc.amax
            self.register_parameter("_amax", nn.Parameter(torch.tensor(init, dtype=torch.float32)))
        elif quant_desc.amax is not None:
            self.register_buffer("_amax", torch.tensor(quant_desc.amax, dtype=torch.float32))
        self._calibrator: MaxCalibrator | HistogramCalibrator
        if quant_desc.calib_method == "histogram":
            self._calibrator = HistogramCalibrator(
                num_bits=self._num_bits, axis=None, unsigned=self._unsigned
            )
        else:
            self._calibrator = MaxCalibrator(
                num_bits=self._num_bits, axis=self._axis, unsigned=self._unsigned
            )

    # ------------------------------------------------------------------ properties
    @property
    def num_bits(self) -> int:
        return self._num_bits

    @property
    def maxbound(self) -> int:
        return quant_bounds(self._num_bits, self._unsigned, self._narrow_range)[1]

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @property
    def axis(self) -> int | tuple[int, ...] | None:
        return self._axis

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @property
    def scale(self) -> torch.Tensor | None:
        """Upstream's scale ``maxbound / amax`` of the last integer quantization."""
        return self._scale

    @property
    def amax(self) -> torch.Tensor | None:
        """The amax in use (detached), or ``None`` before one is set or calibrated."""
        amax = self._amax_tensor()
        return None if amax is None else amax.detach()

    @amax.setter
    def amax(self, value: torch.Tensor | float | None) -> None:
        if value is None:
            raise TypeError("amax cannot be set to None")
        t = torch.as_tensor(value, dtype=torch.float32).detach()
        if not hasattr(self, "_amax"):
            self.register_buffer("_amax", t.clone())
            return
        current: Any = self._amax
        with torch.no_grad():
            if current.shape == t.shape:
                current.copy_(t.to(current.device))
            elif isinstance(current, nn.Parameter):
                raise ValueError(f"amax shape {tuple(t.shape)} != learned {tuple(current.shape)}")
            else:
                self.register_buffer("_amax", t.clone().to(current.device))

    def _amax_tensor(self) -> torch.Tensor | None:
        """The ``_amax`` buffer or parameter itself (not detached), or None."""
        amax = self.__dict__["_buffers"].get("_amax")
        if amax is None:
            amax = self.__dict__["_parameters"].get("_amax")
        return amax

    # ------------------------------------------------------------------ stages
    def disable(self) -> None:
        self._disabled = True

    def enable(self) -> None:
        self._disabled = False

    def disable_clip(self) -> None:
        self._if_clip = False

    def enable_clip(self) -> None:
        if not self._learn_amax:
            raise ValueError("enable_clip needs a quantizer built with learn_amax=True")
        self._if_clip = True

    def disable_calib(self) -> None:
        self._if_calib = False

    def enable_calib(self) -> None:
        self._if_calib = True

    def disable_quant(self) -> None:
        self._if_quant = False

    def enable_quant(self) -> None:
        self._if_quant = True

    def reset_amax(self) -> None:
        """Remove the amax (back to the dynamic mode) and reset the calibrator."""
        if hasattr(self, "_amax"):
            delattr(self, "_amax")
        self._calibrator.reset()

    def load_calib_amax(self, *args: Any, **kwargs: Any) -> None:
        """Set amax from the calibrator: ``load_calib_amax()`` (max) or
        ``load_calib_amax("entropy" | "mse" | "percentile", percentile=99.99, ...)``.

        Positional and keyword arguments go to the calibrator's ``compute_amax`` (upstream's
        signature); ``strict=False`` logs instead of raising when there is no amax.

        Raises:
            RuntimeError: no calibration data (``strict=True``, the default).
        """
        strict = bool(kwargs.pop("strict", True))
        amax = self._calibrator.compute_amax(*args, **kwargs)
        if amax is None:
            message = f"{self}: no calibration data, amax not loaded"
            if strict:
                raise RuntimeError(message + " (run batches with enable_calib() first)")
            _log.warning(message)
            return
        self.amax = amax

    def init_learn_amax(self) -> None:
        """Start learning from the calibrated amax (per tensor: the largest value)."""
        if not self._learn_amax:
            raise ValueError("init_learn_amax needs a quantizer built with learn_amax=True")
        amax = (
            self._calibrator.compute_amax() if isinstance(self._calibrator, MaxCalibrator) else None
        )
        if amax is not None:
            with torch.no_grad():
                self._amax_tensor().copy_(amax.max())  # type: ignore[union-attr]

    # ------------------------------------------------------------------ forward
    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        stored = self._amax_tensor()
        if stored is not None:
            amax = stored
        else:  # dynamic: the input's own abs-max (per tensor or along the axis)
            ax = single_axis(self._axis)
            dims = [d for d in range(inputs.dim()) if ax is None or d != ax % inputs.dim()]
            amax = inputs.detach().abs().amax(dim=dims, keepdim=True).to(torch.float32)
        if self._scale_amax is not None:
            amax = amax * self._scale_amax
        return amax

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._disabled:
            return inputs
        outputs = inputs
        if self._if_calib:
            self._calibrator.collect(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)
        return outputs

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        amax = self._get_amax(inputs)
        if torch.onnx.is_in_onnx_export():
            return self._export_qdq(inputs, amax)
        if not self._fake_quant:
            outputs, self._scale = tensor_quant(
                inputs, amax, self._num_bits, self._unsigned, self._narrow_range
            )
            return outputs
        return fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)

    def _export_qdq(self, inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        qmax = self.maxbound
        qmin = 0 if self._unsigned else -qmax - 1  # Q/DQ has no narrow range
        flat = amax.detach().to(torch.float32).reshape(-1)
        with warnings.catch_warnings():  # amax is fixed at export (a buffer): constants are right
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            sizes = [int(n) for n in amax.shape]
            # the scale as a constant of the graph (TensorRT requires constant Q/DQ scales, rule
            # V09), not a Clip/Reshape subgraph of the amax buffer; float32 values kept exactly
            values = torch.clamp(flat / qmax, min=MIN_SCALE).tolist()
            scale = torch.tensor(values, dtype=torch.float32)
        axis = None
        if math.prod(sizes) > 1:
            shape = [1] * (inputs.dim() - len(sizes)) + sizes
            axis = next(d for d, n in enumerate(shape) if n != 1)
        zp_dtype = torch.uint8 if self._unsigned else torch.int8
        if not type(self).use_fb_fake_quant:
            if self._unsigned:
                raise ValueError("qdq's Q/DQ export is signed; set use_fb_fake_quant for uint8")
            zero = torch.zeros(scale.shape if axis is not None else (), dtype=zp_dtype)
            return emit_qdq(
                inputs, scale if axis is not None else scale.reshape(()), zero, axis, 13
            )
        if axis is None:
            zp = torch.zeros((), dtype=torch.int32)
            return torch.fake_quantize_per_tensor_affine(inputs, scale.reshape(()), zp, qmin, qmax)
        zp = torch.zeros(scale.shape, dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(inputs, scale, zp, axis, qmin, qmax)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        key = prefix + "_amax"
        if key in state_dict:  # a calibrated checkpoint into a fresh quantizer (as upstream)
            self.amax = state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        parts = [f"{self._num_bits}bit", "fake" if self._fake_quant else "real"]
        parts.append("per-tensor" if self._axis is None else f"axis={self._axis}")
        amax = self.amax
        if amax is None:
            parts.append("amax=dynamic")
        elif amax.numel() == 1:
            parts.append(f"amax={float(amax):.4f}")
        else:
            parts.append(f"amax=[{float(amax.min()):.4f}, {float(amax.max()):.4f}]({amax.numel()})")
        parts.append(f"calibrator={type(self._calibrator).__name__}")
        stages = [s for s, on in (("quant", self._if_quant), ("calib", self._if_calib)) if on]
        return " ".join(parts + stages)
