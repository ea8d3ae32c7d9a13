"""``pytorch_quantization.nn.TensorQuantizer``: the module that (fake-)quantizes one tensor.

Stages run in upstream's order in :meth:`TensorQuantizer.forward`:

1. ``pre_quant_scale`` (SmoothQuant activation scaling) multiplies the input, when set;
2. ``disable()`` returns the (scaled) input untouched;
3. the calibrator collects the input when calibration is on;
4. the clip stage (``learn_amax``: a :class:`Clip` with trainable bounds) clips it;
5. the quant stage fake-quantizes (or quantizes, ``fake_quant=False``) with
   :func:`~qdq.compat.pytorch_quantization.tensor_quant.fake_tensor_quant` /
   :func:`~qdq.compat.pytorch_quantization.tensor_quant.tensor_quant` /
   :func:`~qdq.compat.pytorch_quantization.tensor_quant.scaled_e4m3` (``num_bits=(4, 3)``), so
   values and gradients are upstream's bit for bit.

amax lives in the ``_amax`` buffer and the SmoothQuant scale in ``_pre_quant_scale``; the learned
clip range in ``clip.clip_value_min``/``clip.clip_value_max``: ``state_dict`` keys are upstream's.
Before an amax is set the quantizer uses the input's own abs-max (upstream's dynamic mode).

Inside ``torch.onnx.export(..., dynamo=False)`` the quant stage writes ONNX
``QuantizeLinear``/``DequantizeLinear`` instead (see :mod:`._quantizer_export`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from qdq.compat.pytorch_quantization import calib
from qdq.compat.pytorch_quantization.nn.modules._quantizer_export import export_qdq
from qdq.compat.pytorch_quantization.nn.modules.clip import Clip
from qdq.compat.pytorch_quantization.tensor_quant import (
    QuantDescriptor,
    fake_tensor_quant,
    scaled_e4m3,
    tensor_quant,
)

__all__ = ["TensorQuantizer"]

_log = logging.getLogger(__name__)

_E4M3 = (4, 3)


def _reduce_amax(inputs: torch.Tensor, axis: list[int] | None) -> torch.Tensor:
    """``pytorch_quantization.utils.reduce_amax(inputs, axis, keepdims=True)``: the abs-max over
    ``axis`` (all dims when None, a 0-d tensor), kept dims; squeezed when one element remains."""
    with torch.no_grad():
        out = inputs.abs()
        if axis is None:
            return torch.max(out)
        for dim in axis:
            out = torch.max(out, dim=dim, keepdim=True)[0]
        if out.numel() == 1:
            out = out.squeeze()
        return out


def _as_buffer_value(value: Any, device: torch.device | None = None) -> torch.Tensor:
    """A fresh tensor of ``value`` (number, list, ndarray or tensor), as ``torch.tensor`` makes it."""
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        return out if device is None else out.to(device)
    return torch.tensor(value, device=device)


class TensorQuantizer(nn.Module):
    """Quantizes one tensor as a :class:`QuantDescriptor` says; calibrates it on demand.

    Args:
        quant_desc: the descriptor (default: 8-bit, per tensor, dynamic amax, max calibrator).
        disabled: start bypassed (``forward`` returns its input).
        if_quant: start with the quant stage on.
        if_clip: start with the clip stage on (needs ``learn_amax``; ``learn_amax`` turns it on).
        if_calib: start with the calibrator collecting.

    Raises:
        ValueError: ``if_clip`` without ``learn_amax``.

    Read-only properties: ``axis``, ``fake_quant``, ``scale``, ``step_size``, ``maxbound``.
    Mutable properties: ``num_bits``, ``unsigned``, ``narrow_range``, ``amax``, ``pre_quant_scale``.

    Example:
        >>> q = TensorQuantizer(QuantDescriptor(num_bits=8, amax=1.27))
        >>> q(torch.tensor([0.5, 3.0]))
        tensor([0.5000, 1.2700])
    """

    #: Set by ``quant_modules.enable_onnx_export()``: check the quantizer is calibrated first.
    _enable_onnx_export: ClassVar[bool] = False
    #: Export through ``torch.fake_quantize_*`` ops (class-wide; upstream ≤ 2.1 scripts set it).
    use_fb_fake_quant: ClassVar[bool] = False

    # registered only when set: hasattr() tells whether there is one (upstream's protocol)
    _amax: torch.Tensor
    _pre_quant_scale: torch.Tensor
    clip: Any  # a Clip, only with learn_amax

    def __init__(
        self,
        quant_desc: QuantDescriptor = QuantDescriptor(),  # noqa: B008 (read-only: safe)
        disabled: bool = False,
        if_quant: bool = True,
        if_clip: bool = False,
        if_calib: bool = False,
    ) -> None:
        super().__init__()
        self._num_bits: Any = quant_desc.num_bits
        self._fake_quant: bool = quant_desc.fake_quant
        self._axis: Any = quant_desc.axis
        self._scale_amax: Any = quant_desc.scale_amax
        self._learn_amax: bool = quant_desc.learn_amax
        self._unsigned: bool = quant_desc.unsigned
        self._narrow_range: bool = quant_desc.narrow_range
        self._scale: Any = 1.0 if quant_desc.fake_quant else None
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = if_calib
        if quant_desc.amax is not None:
            self.register_buffer("_amax", torch.tensor(np.asarray(quant_desc.amax, np.float32)))
        if self._learn_amax:  # the Clip module (two scalar parameters) only when learning
            if quant_desc.amax is None:
                self.clip = Clip(-1.0, 1.0, learn_min=True, learn_max=True)
            else:  # float32 ndarrays (a negated 0-d array would decay to a numpy scalar)
                init: Any = np.asarray(quant_desc.amax, np.float32)
                low: Any = np.asarray(-init)
                self.clip = Clip(low, init, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()
        self._calibrator: Any = None
        if quant_desc.calib_method == "histogram":
            self._calibrator = calib.HistogramCalibrator(
                num_bits=self._num_bits, axis=self._axis, unsigned=self._unsigned
            )
        elif quant_desc.calib_method == "max":
            self._calibrator = calib.MaxCalibrator(
                num_bits=self._num_bits, axis=self._axis, unsigned=self._unsigned
            )

    # ------------------------------------------------------------------ properties
    @property
    def num_bits(self) -> Any:
        """The width: an int, or ``(4, 3)`` for FP8 E4M3."""
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value: Any) -> None:
        self._num_bits = value

    @property
    def maxbound(self) -> float | int:
        """The largest code: ``2**(num_bits - 1 + unsigned) - 1`` (448.0 for E4M3)."""
        if self._num_bits == _E4M3:
            return 448.0
        return (1 << (self._num_bits - 1 + int(self._unsigned))) - 1

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._unsigned = value

    @property
    def narrow_range(self) -> bool:
        return self._narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._narrow_range = value

    @property
    def axis(self) -> Any:
        return self._axis

    @property
    def fake_quant(self) -> bool:
        return self._fake_quant

    @property
    def scale(self) -> Any:
        """The scale ``maxbound / amax`` of the last real (``fake_quant=False``) quantization;
        ``1.0`` for a fake quantizer, ``None`` before a real one ran."""
        if self._fake_quant:
            _log.error("Fake quantize mode doesn't use scale explicitly!")
        if self._scale is None:
            _log.critical("Accessing scale before quantizing any tensor!")
        return self._scale

    @property
    def step_size(self) -> torch.Tensor | None:
        """``amax / (2**(num_bits - 1 + unsigned) - 1)``; None (and an error log) when dynamic."""
        if not hasattr(self, "_amax"):
            _log.error("step_size is undefined under dynamic amax mode!")
            return None
        step: torch.Tensor = self._amax / (2.0 ** (self._num_bits - 1 + int(self._unsigned)) - 1.0)
        return step

    @property
    def amax(self) -> torch.Tensor | None:
        """The ``_amax`` buffer itself, or None in dynamic mode."""
        if not hasattr(self, "_amax"):
            return None
        amax: torch.Tensor = self._amax
        return amax

    @amax.setter
    def amax(self, value: Any) -> None:
        """Set amax (number, list, ndarray or tensor); creates the buffer when there is none.

        Raises:
            RuntimeError: a value of another shape than the existing buffer.
        """
        if value is None:
            _log.error("Setting amax no None is meaningless.")
            return
        if not hasattr(self, "_amax"):
            self.register_buffer("_amax", _as_buffer_value(value))
            return
        new = _as_buffer_value(value, self._amax.device)
        if self._amax.shape != new.shape:
            raise RuntimeError("Changing shape when setting amax is not allowed.")
        self._amax.data.copy_(new.data)

    @property
    def pre_quant_scale(self) -> torch.Tensor | None:
        """The SmoothQuant factor the input is multiplied by before anything else, or None."""
        if not hasattr(self, "_pre_quant_scale"):
            return None
        scale: torch.Tensor = self._pre_quant_scale
        return scale

    @pre_quant_scale.setter
    def pre_quant_scale(self, value: Any) -> None:
        """Set it (kept in the ``_pre_quant_scale`` buffer, so it is saved in the state_dict).

        Raises:
            RuntimeError: a value of another shape than the existing buffer.
        """
        if value is None:
            _log.error("Setting pre_quant_scale no None is meaningless.")
            return
        if not hasattr(self, "_pre_quant_scale"):
            self.register_buffer("_pre_quant_scale", _as_buffer_value(value))
            return
        new = _as_buffer_value(value, self._pre_quant_scale.device)
        if self._pre_quant_scale.shape != new.shape:
            raise RuntimeError("Changing shape when setting pre_quant_scale is not allowed.")
        self._pre_quant_scale.data.copy_(new.data)

    # ------------------------------------------------------------------ stages
    def disable(self) -> None:
        """Bypass the module: ``forward`` returns its input (after ``pre_quant_scale``)."""
        self._disabled = True

    def enable(self) -> None:
        self._disabled = False

    def disable_clip(self) -> None:
        """Turn the clip stage off and freeze the clip bounds."""
        self._if_clip = False
        self.clip.clip_value_min.requires_grad = False
        self.clip.clip_value_max.requires_grad = False

    def enable_clip(self) -> None:
        """Turn the clip stage on; its bounds become trainable.

        Raises:
            ValueError: the quantizer was not built with ``learn_amax=True``.
        """
        if not self._learn_amax:
            raise ValueError("learn_amax is False. Cannot enable clip.")
        _log.info("Enable `clip` stage for amax learning.")
        self.clip.clip_value_min.requires_grad = True
        self.clip.clip_value_max.requires_grad = True
        self._if_clip = True

    def disable_calib(self) -> None:
        _log.info("Disable %s", type(self._calibrator).__name__)
        self._if_calib = False

    def enable_calib(self) -> None:
        """Turn calibration on.

        Raises:
            ValueError: no calibrator (a ``calib_method`` other than max/histogram).
        """
        if self._calibrator is None:
            raise ValueError("Calibrator was not created, cannot enable calibration.")
        _log.info("Enable %s", type(self._calibrator).__name__)
        self._if_calib = True

    def disable_quant(self) -> None:
        self._if_quant = False

    def enable_quant(self) -> None:
        self._if_quant = True

    # ------------------------------------------------------------------ calibration
    def load_calib_amax(self, *args: Any, **kwargs: Any) -> None:
        """Set amax from the calibrator, creating the ``_amax`` buffer when needed.

        Arguments go to the calibrator's ``compute_amax`` (``"entropy"``, ``"percentile",
        percentile=99.99``, ...), except ``strict`` (default True).

        Raises:
            RuntimeError: no calibrator, or the calibrator has no amax yet (it saw no tensor) and
                ``strict`` is true; with ``strict=False`` amax becomes NaN and a warning is logged.
        """
        strict = kwargs.pop("strict", True)
        if getattr(self, "_calibrator", None) is None:
            raise RuntimeError("Calibrator not created.")
        calib_amax = self._calibrator.compute_amax(*args, **kwargs)
        if calib_amax is None:
            message = (
                "Calibrator returned None. This usually happens when calibrator hasn't seen any "
                "tensor."
            )
            if strict:
                raise RuntimeError(
                    message
                    + " Passing 'strict=False' to `load_calib_amax()` will ignore the error."
                )
            _log.warning("%s Set amax to NaN!", message)
            calib_amax = torch.tensor(math.nan)
        _log.info("Load calibrated amax, shape=%s.", tuple(calib_amax.shape))
        if not hasattr(self, "_amax"):
            self.register_buffer("_amax", calib_amax.data)
        else:
            self._amax.copy_(calib_amax)

    def init_learn_amax(self) -> None:
        """Start the learned clip range at ``[-amax, amax]`` (per channel: the largest amax).

        Raises:
            RuntimeError: ``learn_amax`` is false, or there is no amax to start from.
        """
        if self._learn_amax is False:
            raise RuntimeError("Called init_learn_amax with learn_amax=False.")
        if not hasattr(self, "_amax"):
            raise RuntimeError(
                "init_learn_amax needs an amax: set one or call load_calib_amax() first."
            )
        if self._amax.numel() != 1:
            _log.warning("Per channel learned amax not supported. Initializing with max(amax).")
            init_amax = torch.max(self._amax)
        else:
            init_amax = self._amax
        self.clip.clip_value_min.data.copy_(-init_amax.data)
        self.clip.clip_value_max.data.copy_(init_amax.data)

    # ------------------------------------------------------------------ forward
    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        """The amax to quantize ``inputs`` with: the buffer, else the input's abs-max over the
        dims not in ``axis``; times ``scale_amax``; detached; float32 unless float64."""
        if hasattr(self, "_amax"):
            amax = self._amax
        else:
            reduce_axis = None
            if self._axis is not None:
                kept = self._axis if isinstance(self._axis, (list, tuple)) else [self._axis]
                reduce_axis = [d for d in range(inputs.dim()) if d not in kept]
            amax = _reduce_amax(inputs, reduce_axis).detach()
        if self._scale_amax is not None:
            amax = amax.detach() * self._scale_amax
        amax = amax.detach()  # upstream: .data (which torch.export cannot trace)
        if amax.dtype not in (torch.double, torch.float):
            amax = amax.float()
        return amax

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The quant stage for an integer width (clips first when amax is learned)."""
        if self._learn_amax:
            inputs = self.clip(inputs)
            amax = torch.max(-self.clip.clip_value_min, self.clip.clip_value_max).detach()
        else:
            amax = self._get_amax(inputs)
        if torch.onnx.is_in_onnx_export():
            return self._export(inputs, amax)
        if self._fake_quant:
            out: torch.Tensor = fake_tensor_quant(
                inputs, amax, self._num_bits, self._unsigned, self._narrow_range
            )
            return out
        # upstream passes no narrow_range here: tensor_quant's default (True) applies
        outputs, self._scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned)
        return outputs

    def _export(self, inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        return export_qdq(
            inputs, amax, self._num_bits, self._unsigned, type(self).use_fb_fake_quant,
            type(self).__name__,
        )  # fmt: skip

    def _check_onnx_readiness(self, inputs: torch.Tensor) -> None:
        """Upstream's checks under ``enable_onnx_export()``: calibrated; E4M3 per tensor.

        Raises:
            RuntimeError: no amax (the quantizer was never calibrated).
            ValueError: an E4M3 quantizer with a per-channel amax.
        """
        if not hasattr(self, "_amax"):
            raise RuntimeError(
                "Quantizer has not been calibrated. ONNX export requires the quantizer to be "
                "calibrated. Calibrate and load amax before exporting to ONNX."
            )
        if self._if_calib:
            _log.warning(
                "Quantizer is in calibration mode. Please complete calibration before exporting "
                "to ONNX for correct results."
            )
        amax = self._get_amax(inputs)
        if isinstance(self._num_bits, tuple) and amax.numel() != 1:
            raise ValueError(
                "E4M3 supports ONNX export only for per-tensor quantization (a scalar amax), got "
                f"amax of shape {tuple(amax.shape)}"
            )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run the enabled stages on ``inputs`` (see the module docstring for their order).

        Raises:
            RuntimeError: calibration on without a calibrator; clip on without ``learn_amax``.
        """
        if self._enable_onnx_export:
            self._check_onnx_readiness(inputs)
        if self.pre_quant_scale is not None:
            inputs = inputs * self.pre_quant_scale
        if self._disabled:
            return inputs
        outputs = inputs
        if self._if_calib:
            if self._calibrator is None:
                raise RuntimeError("Calibrator was not created.")
            self._calibrator.collect(inputs)
        if self._if_clip:
            if not self._learn_amax:
                raise RuntimeError("Clip without learning amax is not implemented.")
            outputs = self.clip(inputs)
        if self._if_quant:
            if not isinstance(self._num_bits, tuple):
                outputs = self._quant_forward(inputs)
            else:
                amax = self._get_amax(inputs)
                if torch.onnx.is_in_onnx_export():
                    return self._export(inputs, amax)
                exponent, mantissa = self._num_bits
                outputs = scaled_e4m3(inputs, amax, exponent, mantissa)
        return outputs

    # ------------------------------------------------------------------ printing, loading
    def _short_amax(self, fmt: str = ".4f") -> str:
        """``dynamic`` (no buffer), ``None``, the amax, or ``[min, max](count)`` per channel."""
        if not hasattr(self, "_amax"):
            return "dynamic"
        if self._amax is None:
            return "None"
        if self._amax.numel() == 1:
            return format(self._amax.item(), fmt)
        low, high = format(self._amax.min().item(), fmt), format(self._amax.max().item(), fmt)
        return f"[{low}, {high}]({self._amax.numel()})"

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        text = f"{'unsigned ' if self._unsigned else ''}{self._num_bits}bit"
        flags = [
            (self._narrow_range, " narrow"),
            (self._fake_quant, " fake"),
        ]
        text += "".join(s for on, s in flags if on)
        text += f" axis={self._axis}" if self._axis is not None else " per-tensor"
        text += f" amax={self._short_amax()}"
        text += f" *{self._scale_amax}" if self._scale_amax else ""
        text += " pre_quant_scale" if self.pre_quant_scale is not None else ""
        text += " learned" if self._learn_amax else ""
        if self._calibrator is not None:
            text += f" calibrator={type(self._calibrator).__name__}"
        text += f" scale={self._scale}" if self._scale is not None else ""
        stages = [(self._if_quant, " quant"), (self._if_clip, " clip"), (self._if_calib, " calib")]
        return text + "".join(s for on, s in stages if on)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """Load as ``nn.Module`` does, first creating ``_amax``/``_pre_quant_scale`` buffers the
        checkpoint has and this quantizer lacks (a calibrated checkpoint into a fresh model).

        The created buffer goes on the device of the quantizer's other tensors (the checkpoint's
        when it has none); upstream always moved it to CUDA.
        """
        for name in ("_amax", "_pre_quant_scale"):
            key = prefix + name
            here, there = name in self._buffers, key in state_dict
            if here and not there:
                _log.error("%s: No %s in state_dict.", prefix[:-1], name.lstrip("_"))
            elif there and not here:
                _log.debug("%s: creating the %r buffer to load into.", prefix[:-1], name)
                value = state_dict[key].data.clone()
                self.register_buffer(name, value.to(self._device_or(value.device)))
            elif there and here:
                _log.debug("%s: Overwriting %s.", prefix[:-1], name.lstrip("_"))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _device_or(self, default: torch.device) -> torch.device:
        for tensor in (*self._buffers.values(), *self.parameters()):
            if tensor is not None:
                return tensor.device
        return default
