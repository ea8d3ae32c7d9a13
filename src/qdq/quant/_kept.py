"""What a :class:`~qdq.quant.Quantizer` with a fixed amax keeps between its eager calls (issue 48:
host time per call): the code range of its spec, the scale of its amax and the clipping bound the
straight-through backward compares ``|x|`` with, and the fake-quantized copy of a fixed weight.
Each is kept with what it was made from and made again when that changes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qdq._validate import normalize_axis
from qdq.config import QuantSpec
from qdq.quant.primitives import _broadcast_shape, quant_range, scale_from_amax

__all__ = ["KeptState"]


class KeptState(nn.Module):
    """Kept-value methods of :class:`~qdq.quant.Quantizer` (one of its base classes)."""

    amax: torch.Tensor
    spec: QuantSpec
    #: ``(key, output)`` of the last fake-quantized fixed weight (:meth:`_weight_key`)
    _weight_cache: tuple[tuple[Any, ...], torch.Tensor] | None

    def _range(self, spec: QuantSpec) -> tuple[int, int, bool]:
        """``(qmin, qmax, fp8)`` of ``spec``, kept with the spec it was made for."""
        kept = self.__dict__.get("_range_of")
        if kept is None or kept[0] is not spec:
            qmin, qmax = quant_range(spec.num_bits, spec.narrow_range, spec.format)
            kept = self._range_of = (spec, (qmin, qmax, spec.format == "fp8"))
        return kept[1]

    def _kept(self, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept scale (:meth:`_kept_scale`) shaped to broadcast against a tensor of ``ndim``
        dims along the spec's axis, and its clipping bound ``scale·qmax`` (what the STE's
        backward compares ``|x|`` with), made with it."""
        scale = self._kept_scale()
        kept = self.__dict__.get("_bound_cache")
        if kept is not None and kept[0] is scale and kept[1] == ndim:
            return kept[2]
        base, axis = scale, self.spec.axis
        if axis is not None:
            ax = normalize_axis(axis, ndim)
            scale = scale.reshape(_broadcast_shape(ndim, ax, scale.numel()))
        pair = (scale, scale * self._range(self.spec)[1])
        self._bound_cache = (base, ndim, pair)
        return pair

    def _kept_scale(self) -> torch.Tensor:
        """The scale of the fixed amax (``amax / qmax``, floored: :func:`scale_from_amax`), made
        once per amax value in eager mode (two kernels less per call: issue 48) and kept with
        the amax's storage and version counter, which every write changes (``set_amax``,
        ``load_state_dict``, ``.to()``); asked for only where the torch path needs it."""
        amax = self.amax
        # an inference-mode tensor cannot be saved for backward: kept apart from a training one
        key = (amax.data_ptr(), amax._version, amax.device, amax.shape, self.spec,
               torch.is_inference_mode_enabled())  # fmt: skip
        kept = self.__dict__.get("_scale_cache")
        if kept is not None and kept[0] == key:
            return kept[1]
        scale = scale_from_amax(amax.detach(), self.spec.num_bits, self.spec.format)
        self._scale_cache = (key, scale)
        return scale

    def _weight_key(self, x: torch.Tensor, amax: torch.Tensor) -> tuple[Any, ...] | None:
        """What the fake-quantized copy of a weight depends on, when it may be kept between
        forwards: ``x`` a parameter that builds no graph (``no_grad``, ``inference_mode`` or a
        frozen weight); asked outside tracing and compiling only. Its storage and version
        counter (every in-place write: optimizers, ``load_state_dict``, ``copy_``, ``.to()``
        makes a new tensor), the amax's, and the spec. A fixed weight is then quantized once,
        not at every forward (a ResNet-50 at 32x32: 144 ms → 16 ms per forward on one CPU
        thread, against 14 ms in FP32). Like the learned-state check (:mod:`qdq.quant.learned`),
        writes through ``.data`` bypass the version counter and are not seen.
        """
        if (
            not isinstance(x, nn.Parameter)
            or (x.requires_grad and torch.is_grad_enabled())
            or x.is_inference()
        ):
            return None
        return (x.data_ptr(), x._version, x.dtype, x.device, x.shape, amax.data_ptr(),
                amax._version, amax.device, self.spec)  # fmt: skip

    def _cached_weight(self, key: tuple[Any, ...] | None) -> torch.Tensor | None:
        """The fake-quantized weight kept under ``key`` (:meth:`_weight_key`), if it is kept."""
        if key is None:
            return None
        cached = self.__dict__.get("_weight_cache")  # absent on quantizers pickled before
        return cached[1] if cached is not None and cached[0] == key else None

    def _keep_weight(self, key: tuple[Any, ...] | None, out: torch.Tensor) -> None:
        """Keep ``out`` under ``key``; with no key (training), drop the kept copy."""
        if key is not None:
            self._weight_cache = (key, out)
        elif self.__dict__.get("_weight_cache") is not None:
            self._weight_cache = None
