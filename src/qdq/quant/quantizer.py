"""The ``Quantizer`` module: a spec, a calibrator, an ``amax`` buffer and a mode."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qdq._validate import normalize_axis
from qdq.calib import CalibrationError, make_calibrator
from qdq.config import CalibSpec, QuantSpec
from qdq.quant import learned as learned_state
from qdq.quant._kept import KeptState
from qdq.quant._ptq_state import PtqState
from qdq.quant.onnx_qdq import current_exporter, emit_qdq
from qdq.quant.primitives import (
    AMAX_GRADS,
    MIN_AMAX,
    _as_amax_tensor,
    check_amax_values,
    fake_quant_eager,
    fake_quant_unchecked,
    grad_scale,
    quant_range,
)

__all__ = ["QuantMode", "Quantizer", "ScaleShapeError", "quantizer_mode", "quantizers_of"]


class ScaleShapeError(ValueError):
    """An export scale whose shape does not match the tensor its quantizer quantizes."""


class QuantMode(str, enum.Enum):
    """What a :class:`Quantizer` does in ``forward``."""

    CALIBRATE = "calibrate"  #: feed the calibrator, return the input unchanged
    QUANTIZE = "quantize"  #: fake-quantize with the stored amax
    BYPASS = "bypass"  #: return the input unchanged


class Quantizer(PtqState, KeptState):
    """Fake-quantizes a tensor with ONNX Q/DQ numerics; collects calibration data on demand.

    A weight quantizer may also hold what :mod:`qdq.ptq` learned for its layer (AdaRound codes, a
    bias correction): see :mod:`qdq.quant.learned`. Both apply in ``QUANTIZE`` mode and at export
    only; ``BYPASS`` always returns the float weight.

    Args:
        spec: bits, per-channel axis, narrow range.
        calib: how amax is calibrated (default: histogram + entropy per tensor, max per channel).
        name: a human name used in messages and reports (e.g. ``"layer1.0.conv1.input"``).
        channels: for a per-channel ``spec``, the number of channels along ``spec.axis`` when
            known at construction; otherwise it is recorded from the first tensor or amax the
            quantizer sees (:attr:`channels`). Every later amax (``set_amax``, calibration results,
            ``load_state_dict``, manifests) and every tensor must match it.

    Example:
        >>> q = Quantizer(name="demo")
        >>> q.mode = QuantMode.CALIBRATE
        >>> _ = q(torch.linspace(-2.0, 2.0, 101))
        >>> q.load_calib_amax("max")
        tensor(2.)
        >>> q.mode = QuantMode.QUANTIZE
        >>> q(torch.tensor([0.01, 1.0, 3.0]))
        tensor([0.0157, 1.0079, 2.0000])
        >>> w = Quantizer(QuantSpec(axis=0), name="conv.weight", channels=8)
        >>> w.set_amax(torch.ones(3))
        Traceback (most recent call last):
        ...
        ValueError: quantizer 'conv.weight' is per-channel (axis 0, 8 channels) but got 3 amax values
    """

    amax: torch.Tensor

    def __init__(
        self,
        spec: QuantSpec | None = None,
        calib: CalibSpec | None = None,
        *,
        name: str = "",
        channels: int | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec if spec is not None else QuantSpec()
        self.name = name
        self._channels = self._check_channels(channels)
        if calib is None:
            calib = CalibSpec() if self.spec.axis is None else CalibSpec.weights()
        self.calib = calib
        self.calibrator = make_calibrator(self._stats_spec(), calib)
        self.mode = QuantMode.QUANTIZE
        self.export_opset = 13
        #: a weight that ``forward`` computes from parameters (set by ``qdq.prepare``): the export
        #: reads the value torch computed
        self.computed_weight = False
        #: how the current amax was obtained: a calibration method ("max", "entropy", "mse",
        #: "percentile"), "set" when given directly, ``None`` before any amax
        self.amax_method: str | None = None
        #: the percentile behind the current amax when ``amax_method == "percentile"``
        self.amax_percentile: float | None = None
        self.register_buffer("amax", torch.empty(0))
        #: (weight, amax) tensor identities and versions the learned state was last checked for
        self._learned_key: tuple[Any, ...] | None = None
        #: ``"lsq"``/``"pact"`` when amax is a trained ``nn.Parameter`` (:meth:`learn_amax`)
        self._amax_grad: str | None = None
        #: ``(key, output)`` of the last fake-quantized fixed weight (:meth:`_weight_key`)
        self._weight_cache: tuple[tuple[Any, ...], torch.Tensor] | None = None
        if calib.fixed_amax is not None:  # data-independent: held from the start
            if self.spec.axis is not None:
                raise ValueError(
                    f"quantizer {name!r}: CalibSpec.fixed_amax is one amax per tensor; the spec "
                    f"is per channel (axis={self.spec.axis})"
                )
            self._set_fixed_amax()

    # ------------------------------------------------------------------ state
    def _stats_spec(self) -> QuantSpec:
        """The spec the calibrator collects statistics for (a block format's are per tensor)."""
        return self.spec

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

    @property
    def channels(self) -> int | None:
        """Channels along ``spec.axis`` (per-channel), 1 (per-tensor), or ``None`` if not yet seen."""
        return 1 if self.spec.axis is None else self._channels

    def _check_channels(self, channels: int | None) -> int | None:
        if channels is None:
            return None
        if isinstance(channels, bool) or not isinstance(channels, int):
            raise TypeError(f"quantizer {self.name!r}: channels must be an int, got {channels!r}")
        if channels < 1 or (self.spec.axis is None and channels != 1):
            raise ValueError(
                f"quantizer {self.name!r}: channels must be >= 1 (1 for a per-tensor quantizer), "
                f"got {channels}"
            )
        return channels

    def check_amax_shape(self, amax: torch.Tensor, *, source: str = "") -> torch.Tensor:
        """Return ``amax`` reshaped for this quantizer (0-d per tensor, 1-d per channel).

        Raises:
            ValueError: the number of values does not match the quantizer's axis and channel
                count (naming the quantizer and, when given, ``source``).
        """
        where = f"{source}: " if source else ""
        n = amax.numel()
        if self.spec.axis is None:
            if n != 1:
                raise ValueError(
                    f"{where}quantizer {self.name!r} is per-tensor but got amax of shape "
                    f"{tuple(amax.shape)} ({n} values)"
                )
            return amax.reshape(())
        if sum(1 for d in amax.shape if d != 1) > 1:
            raise ValueError(
                f"{where}quantizer {self.name!r} is per-channel (axis {self.spec.axis}) but got "
                f"amax of shape {tuple(amax.shape)}; pass one value per channel"
            )
        if self._channels is not None and n != self._channels:
            raise ValueError(
                f"{where}quantizer {self.name!r} is per-channel (axis {self.spec.axis}, "
                f"{self._channels} channels) but got {n} amax values"
            )
        return amax.reshape(-1)

    def set_amax(self, amax: torch.Tensor | float) -> None:
        """Set amax directly (validated: finite, non-negative, the right number of channels).

        A per-channel quantizer that does not know its channel count yet records it here.

        Raises:
            ValueError: non-finite or negative values, or a shape that does not match the
                quantizer's axis and channel count (the message names the quantizer).
        """
        t = torch.as_tensor(amax, dtype=torch.float32).detach()
        check_amax_values(t, what=f"quantizer {self.name!r} amax")
        t = self.check_amax_shape(t)
        if self.spec.axis is not None and self._channels is None:
            self._channels = t.numel()
        self._assign_amax(t.to(self.amax.device))
        self.amax_method, self.amax_percentile = "set", None
        self._learned_key = None

    @property
    def fixed_amax(self) -> bool:
        """Whether amax is data-independent (``CalibSpec.fixed_amax``): calibration, the method
        choice and QAT leave it as it is."""
        return self.calib.fixed_amax is not None

    def _set_fixed_amax(self) -> None:
        assert self.calib.fixed_amax is not None
        self.set_amax(float(self.calib.fixed_amax))
        self.amax_method = "fixed"

    def _assign_amax(self, value: torch.Tensor) -> None:
        """Store ``value`` as amax: the buffer, or the data of the learned parameter (whose
        identity an optimizer holds)."""
        param = self._parameters.get("amax")
        if param is not None:
            param.data = value.detach().to(torch.float32)
        else:
            self.amax = value

    # ------------------------------------------------------------- learned amax (qdq.qat)
    @property
    def amax_grad(self) -> str | None:
        """``"lsq"`` or ``"pact"`` when amax is trained (an ``nn.Parameter``), else ``None``."""
        return self._amax_grad

    def learn_amax(self, how: str | None = "lsq") -> None:
        """Train amax (``how="lsq"`` or ``"pact"``) as an ``nn.Parameter``, or freeze it (``None``).

        The state-dict key stays ``amax`` either way, so checkpoints load across the two. A
        learned amax is kept at or above ``2**-24`` before each use (the exporter's floor), so
        it never turns negative. LSQ scales the gradient by ``1/sqrt(n·qmax)`` (``n`` values per
        amax entry), as its paper does; PACT passes the clip gradient unscaled.

        A fixed amax (``CalibSpec.fixed_amax``) stays a buffer: ``learn_amax`` leaves it.

        Raises:
            ValueError: an unknown ``how``, or no amax yet (calibrate first).
        """
        if how is not None and how not in AMAX_GRADS:
            raise ValueError(
                f"quantizer {self.name!r}: learn_amax how must be one of {AMAX_GRADS} or None, "
                f"got {how!r}"
            )
        if how is not None and self.fixed_amax:
            return  # data-independent: never learned (CalibSpec.fixed_amax)
        if how is not None and not self.is_calibrated:
            raise ValueError(f"quantizer {self.name!r} has no amax: calibrate before learning it")
        value = self.amax.detach().clone()
        if how is None:
            if "amax" in self._parameters:
                del self._parameters["amax"]
                self.register_buffer("amax", value)
        elif "amax" not in self._parameters:
            del self._buffers["amax"]
            self.register_parameter("amax", nn.Parameter(value))
        self._amax_grad = how
        self._learned_key = None

    def _learned_amax(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.amax.data.clamp_(min=MIN_AMAX)
        if self._amax_grad != "lsq":
            return self.amax
        _, qmax = quant_range(self.spec.num_bits, self.spec.narrow_range, self.spec.format)
        per_entry = max(1, x.numel() // max(1, self.amax.numel()))
        return grad_scale(self.amax, (per_entry * qmax) ** -0.5)

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
        if self.fixed_amax:  # statistics collected (the reports show them), never used for amax
            self._set_fixed_amax()
            return self.amax.clone()
        m = self.calib.method if method is None else method
        if m == "percentile" and percentile is None:
            percentile = self.calib.percentile
        try:
            amax = self.calibrator.compute_amax(m, percentile=percentile)
        except CalibrationError as err:
            raise CalibrationError(f"quantizer {self.name!r}: {err}") from None
        self.set_amax(amax)
        self.amax_method = m
        self.amax_percentile = float(percentile) if m == "percentile" and percentile else None
        return self.amax.clone()

    def calibrate_from(self, tensor: torch.Tensor) -> torch.Tensor:
        """Set amax by abs-max of ``tensor`` (a weight) now, leave no statistics, quantize mode."""
        with torch.no_grad():
            self.mode = QuantMode.CALIBRATE
            self(tensor.detach())
            amax = self.load_calib_amax("max")
            self.calibrator.reset()
            self.mode = QuantMode.QUANTIZE
        return amax

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the current mode to ``x``."""
        mode = self._mode
        if mode is QuantMode.BYPASS:
            return x
        self._check_float(x)
        if mode is QuantMode.QUANTIZE:
            if current_exporter() is not None:
                return self._export_qdq(x)
            if (
                not (torch.compiler.is_compiling() or torch.jit.is_tracing())
                and self._amax_grad is None
                and "learned_record" not in self._buffers
            ):
                return self._fake_quant_eager(x)
        if self.spec.axis is not None:
            self._check_tensor_channels(x, calibrating=self._mode is QuantMode.CALIBRATE)
        if self._mode is QuantMode.CALIBRATE:
            if torch.compiler.is_dynamo_compiling():
                return _collect_uncompiled(self, x)
            return self._collect(x)
        if not self.is_calibrated:
            raise self._no_amax()
        if "learned_record" in self._buffers:
            self._check_learned(x)
            if "rounding_codes" in self._buffers:
                return self._rounded_weight(x)
        if self._amax_grad is not None:
            return fake_quant_unchecked(
                x,
                self._learned_amax(x),
                num_bits=self.spec.num_bits,
                axis=self.spec.axis,
                narrow_range=self.spec.narrow_range,
                amax_grad=self._amax_grad,
                fmt=self.spec.format,
            )
        # under tracing or compiling the scale is computed (the compiler fuses it, and dynamo
        # would guard on a kept one) and no weight is kept; is_compiling first: dynamo cannot
        # trace is_inference()
        traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
        key = None if traced else self._weight_key(x, self.amax)
        cached = self._cached_weight(key)
        if cached is not None:
            return cached
        out = fake_quant_unchecked(
            x,
            self.amax,
            num_bits=self.spec.num_bits,
            axis=self.spec.axis,
            narrow_range=self.spec.narrow_range,
            fmt=self.spec.format,
            scale=None if traced else self._kept_scale,
        )
        if not torch.compiler.is_compiling():  # dynamo would guard on the kept copy
            self._keep_weight(key, out)
        return out

    def _check_float(self, x: torch.Tensor) -> None:
        """Refuse a tensor that is not floating point (a mask or an index reaching a quantizer)."""
        if not x.is_floating_point():
            # ValueError, not TypeError: inside Tensor.__mul__ and the like, torch turns a
            # TypeError into "unsupported operand type(s)", which hides this message
            raise ValueError(
                f"quantizer {self.name!r}: only floating-point tensors are quantized, got "
                f"dtype {x.dtype} (a mask or an index?); exclude this point or set its mode "
                "to 'bypass'"
            )

    def _fake_quant_eager(self, x: torch.Tensor) -> torch.Tensor:
        """``QUANTIZE`` with a fixed amax outside ``torch.compile`` and tracing: the forward's
        checks in its order, each asked once per call (issue 48: host time per call), then
        :func:`~qdq.quant.primitives.fake_quant_eager` with the range and the kept scale."""
        amax = self.amax
        key = self._weight_key(x, amax)
        cached = self._cached_weight(key)
        if cached is not None:
            return cached  # the same weight and amax as when the checks below passed
        spec = self.spec
        ax = None
        if spec.axis is not None:
            self._check_tensor_channels(x, calibrating=False)
            ax = normalize_axis(spec.axis, x.dim())
        if amax.numel() == 0:
            raise self._no_amax()
        # an amax of the shape the ops need is used as it is (a reshape is one more op per call)
        if (amax.dim() != 0) if ax is None else (amax.dim() != 1 or amax.shape[0] != x.shape[ax]):
            amax = _as_amax_tensor(x, amax, ax)  # reshaped, or the error of a wrong count
        qmin, qmax, fp8 = self._range(spec)
        out = fake_quant_eager(x, amax, ax, qmin, qmax, fp8, self._kept)
        self._keep_weight(key, out)
        return out

    def _no_amax(self) -> RuntimeError:
        return RuntimeError(
            f"quantizer {self.name!r} has no amax: calibrate it first "
            "(qdq.calibrate / load_calib_amax / set_amax) or set mode='bypass'"
        )

    def _collect(self, x: torch.Tensor) -> torch.Tensor:
        try:
            self.calibrator.collect(x)
        except CalibrationError as err:
            raise CalibrationError(f"quantizer {self.name!r}: {err}") from None
        return x

    def _check_tensor_channels(self, x: torch.Tensor, *, calibrating: bool) -> None:
        """Record (first call) or check the channel count of a per-channel input tensor."""
        if not isinstance(x, torch.Tensor) or self.spec.axis is None:
            return
        ax = normalize_axis(self.spec.axis, x.dim())
        if ax is None:
            return
        n = int(x.shape[ax])
        if self._channels is None:
            self._channels = n
        elif n != self._channels:
            error = CalibrationError if calibrating else ValueError
            raise error(
                f"quantizer {self.name!r} is per-channel (axis {self.spec.axis}, "
                f"{self._channels} channels) but got a tensor of shape {tuple(x.shape)}"
            )
        if not calibrating and self.is_calibrated and self.amax.numel() != n:
            raise ValueError(
                f"quantizer {self.name!r} has {self.amax.numel()} amax values but its tensor has "
                f"{n} channels along axis {self.spec.axis} (shape {tuple(x.shape)})"
            )

    def __getstate__(self) -> dict[str, Any]:
        """Pickles and deep copies leave the cached weight behind (the copy's weight is another
        tensor: the cache would only cost memory)."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_weight_cache": None, "_scale_cache": None, "_bound_cache": None}

    def _export_qdq(self, x: torch.Tensor) -> torch.Tensor:
        scale = getattr(self, "export_scale", None)
        zero_point = getattr(self, "export_zero_point", None)
        if not isinstance(scale, torch.Tensor) or not isinstance(zero_point, torch.Tensor):
            raise RuntimeError(
                f"quantizer {self.name!r} has no export scale; export with qdq.export_onnx"
            )
        if not torch.jit.is_tracing():  # TorchScript: checked by the eager forward before export
            self._check_export_scale(x, scale)
        rounded = self._buffers.get("export_weight")
        if isinstance(rounded, torch.Tensor):  # AdaRound: Q reads scale·code, a constant
            out = emit_qdq(rounded, scale, zero_point, self.spec.axis, int(self.export_opset))
            return out if out.dtype == x.dtype else out.to(x.dtype)
        return emit_qdq(x, scale, zero_point, self.spec.axis, int(self.export_opset))

    def _check_export_scale(self, x: torch.Tensor, scale: torch.Tensor) -> None:
        expected = 1 if self.spec.axis is None else int(x.shape[self.spec.axis])
        if scale.numel() != expected or (self.spec.axis is None and scale.dim() != 0):
            raise ScaleShapeError(
                f"quantizer {self.name!r}: scale of shape {tuple(scale.shape)} does not match the "
                f"tensor it quantizes (shape {tuple(x.shape)}, axis {self.spec.axis}: "
                f"{'one value' if self.spec.axis is None else f'{expected} values'} expected); "
                "refusing to export a Q/DQ whose scale does not fit its tensor"
            )

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
        saved = state_dict.get(key)
        if isinstance(saved, torch.Tensor):  # adopt the saved shape once it fits the quantizer
            if saved.numel() > 0:
                src = f"state_dict[{key!r}]"
                shaped = self.check_amax_shape(saved.detach().to(torch.float32), source=src)
                if saved.shape != shaped.shape:
                    state_dict = {**state_dict, key: saved.reshape(shaped.shape)}
                if self.spec.axis is not None and self._channels is None:
                    self._channels = shaped.numel()
            self._assign_amax(torch.empty_like(state_dict[key], device=self.amax.device))
            for name in learned_state.LEARNED_BUFFERS:  # the learned state travels with its amax
                value = state_dict.get(prefix + name)
                if isinstance(value, torch.Tensor):
                    self.register_buffer(name, torch.empty_like(value, device=self.amax.device))
                else:
                    self._buffers.pop(name, None)
            self._learned_key = None
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        parts = [f"name={self.name!r}"] if self.name else []
        parts.append(f"mode={self._mode.value}")
        parts.append("fp8" if self.spec.format == "fp8" else f"bits={self.spec.num_bits}")
        if self.spec.axis is not None:
            parts.append(f"axis={self.spec.axis}")
            if self._channels is not None:
                parts.append(f"channels={self._channels}")
        if self.spec.narrow_range:
            parts.append("narrow")
        if not self.is_calibrated:
            parts.append("amax=None")
        elif self.amax.dim() == 0:
            parts.append(f"amax={float(self.amax.detach()):.6g}")
        else:
            lo, hi = float(self.amax.detach().min()), float(self.amax.detach().max())
            parts.append(f"amax=[{self.amax.numel()}] {lo:.4g}..{hi:.4g}")
        parts.append(
            "calib=fixed"
            if self.fixed_amax
            else f"calib={self.calib.calibrator}/{self.calib.method}"
        )
        if self._amax_grad is not None:
            parts.append(f"amax_grad={self._amax_grad}")
        parts.extend(
            label
            for label, present in (("rounding=learned", self.has_rounding),
                                   ("bias_corrected", self.has_bias_delta))
            if present
        )  # fmt: skip
        return ", ".join(parts)


@torch.compiler.disable  # no reason=: that argument is newer than the torch 2.3 qdq supports
def _collect_uncompiled(quantizer: Quantizer, x: torch.Tensor) -> torch.Tensor:
    """A ``CALIBRATE`` forward reached by ``torch.compile``: run outside the compiled graph.

    Calibration statistics (histograms, running max) are host-side work: ``qdq.calibrate`` runs
    the model uncompiled; calibrate before ``torch.compile``, or compile without ``fullgraph``.
    """
    return quantizer._collect(x)


def quantizers_of(prepared: nn.Module) -> dict[str, Quantizer]:
    """All quantizers of a prepared model by module path."""
    return {name: m for name, m in prepared.named_modules() if isinstance(m, Quantizer)}


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
