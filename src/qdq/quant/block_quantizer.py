"""The quantizer of a block-scaled format (NVFP4, MXFP8, INT4: :mod:`qdq.quant.blocks`).

A :class:`BlockQuantizer` is a :class:`~qdq.quant.Quantizer` (same modes, state_dict key
``amax``, calibration and export entry points) whose values follow the block format of its spec
(``QuantSpec.block(...)``): ``forward`` is :func:`~qdq.quant.blocks.block_fake_quant` along
``spec.axis``, bit for bit the arithmetic of the exported graph. What ``amax`` holds:

* **NVFP4**: one per-tensor amax (0-d). A weight's is its own abs max (the per-tensor scale
  ``amax / (6·448)``; the E4M3 block scales follow from the weight); an activation's is
  calibrated per tensor, by ``max`` (ModelOpt's NVFP4 recipe: the blocks are quantized at run time,
  only the per-tensor scale is static). ``percentile`` is honoured; ``entropy`` and ``mse`` would
  optimise an INT8 grid, so they calibrate by ``max`` too (``amax_method`` says so).
* **MXFP8**: nothing to calibrate: each block's E8M0 scale is its own. ``amax`` keeps the
  observed abs max for the reports; the values never read it.
* **INT4** (weights): one amax per block along ``spec.axis`` (the blocked layout of ONNX
  ``DequantizeLinear``'s scale, as :func:`~qdq.quant.blocks.block_amax` returns it), or one per
  channel when ``spec.block_size`` is ``None``.

Weights are calibrated from the weight (:meth:`BlockQuantizer.calibrate_from`, by the
``CalibSpec``'s method: ``max``, or ``mse`` on the block grid through :mod:`qdq.calib.blocks`
when that module is present). A learned amax (LSQ/PACT) and learned rounding are INT8/FP8 only.

At export the quantizer writes one ``qdq.internal::BlockQDQ`` marker
(:func:`~qdq.quant.onnx_qdq.emit_block`), which the exporter rewrites into TensorRT's form.
"""

from __future__ import annotations

from typing import Any

import torch

from qdq._validate import normalize_axis
from qdq.calib import CalibrationError
from qdq.config import CalibSpec, QuantSpec
from qdq.quant.blocks import BLOCK_FORMATS, BlockFormat, block_amax, block_fake_quant
from qdq.quant.onnx_qdq import current_exporter, emit_block
from qdq.quant.primitives import check_amax_values
from qdq.quant.quantizer import Quantizer, QuantMode, _collect_uncompiled

__all__ = ["BlockQuantizer", "make_quantizer"]

#: calibration methods a block format's per-tensor amax takes as they are (others: ``max``)
_PER_TENSOR_METHODS = ("max", "percentile")


def make_quantizer(
    spec: QuantSpec | None = None,
    calib: CalibSpec | None = None,
    *,
    name: str = "",
    channels: int | None = None,
) -> Quantizer:
    """A :class:`Quantizer` for ``spec``: a :class:`BlockQuantizer` for a block format.

    Example:
        >>> type(make_quantizer(QuantSpec.block("nvfp4"), name="fc:input")).__name__
        'BlockQuantizer'
        >>> type(make_quantizer(QuantSpec(), name="fc:input")).__name__
        'Quantizer'
    """
    if spec is not None and spec.is_block:
        return BlockQuantizer(spec, calib, name=name)
    return Quantizer(spec, calib, name=name, channels=channels)


class BlockQuantizer(Quantizer):
    """Fake-quantizes a tensor in a block format (module docstring).

    Args:
        spec: a block spec (``QuantSpec.block("nvfp4" | "mxfp8" | "int4", axis=...)``).
        calib: how amax is calibrated (default: ``max``).
        name: a human name; a name ending in ``":weight"`` makes it a weight quantizer.
        role: ``"weight"`` or ``"activation"``; default from ``name``.

    Example:
        >>> w = BlockQuantizer(QuantSpec.block("nvfp4"), name="fc:weight")
        >>> weight = torch.linspace(-3.0, 3.0, 32).reshape(2, 16)
        >>> float(w.calibrate_from(weight))
        3.0
        >>> torch.equal(w(weight), block_fake_quant(weight, w.block_format, None))
        True
        >>> BlockQuantizer(QuantSpec())
        Traceback (most recent call last):
        ...
        ValueError: BlockQuantizer '' needs a block format (nvfp4, mxfp8, int4), got format='int8'
    """

    def __init__(
        self,
        spec: QuantSpec,
        calib: CalibSpec | None = None,
        *,
        name: str = "",
        role: str | None = None,
    ) -> None:
        if not isinstance(spec, QuantSpec) or not spec.is_block:
            got = spec.format if isinstance(spec, QuantSpec) else type(spec).__name__
            raise ValueError(
                f"BlockQuantizer {name!r} needs a block format (nvfp4, mxfp8, int4), got "
                f"format={got!r}"
            )
        if role is None:
            role = "weight" if name.endswith(":weight") else "activation"
        if role not in ("weight", "activation"):
            raise ValueError(f"quantizer {name!r}: role must be 'weight' or 'activation'")
        if role == "activation" and spec.format == "int4":
            raise ValueError(
                f"quantizer {name!r}: INT4 is a weight format (TensorRT's INT4 GEMMs are "
                "weight-only); activations stay float"
            )
        if calib is not None and calib.fixed_amax is not None:
            raise ValueError(f"quantizer {name!r}: a block format takes no fixed_amax")
        self.role = role
        #: the weight the last calibration saw (weights in ``CALIBRATE`` mode)
        self._seen_weight: torch.Tensor | None = None
        super().__init__(spec, calib if calib is not None else CalibSpec.weights(), name=name)

    # ------------------------------------------------------------ the format
    def _stats_spec(self) -> QuantSpec:
        """Statistics are per tensor: NVFP4's amax is one value, MXFP8's is for the reports."""
        return QuantSpec()

    @property
    def block_format(self) -> BlockFormat:
        """The :class:`~qdq.quant.blocks.BlockFormat` of the spec, at its block size."""
        return BLOCK_FORMATS[self.spec.format].with_block_size(self.spec.block_size)

    @property
    def per_tensor_amax(self) -> bool:
        """Whether amax is one value (NVFP4, MXFP8), not per block or channel (INT4)."""
        return self.spec.format != "int4"

    @property
    def channels(self) -> int | None:
        """1 for a per-tensor amax; INT4's amax count once known."""
        return 1 if self.per_tensor_amax else self._channels

    def check_amax_shape(self, amax: torch.Tensor, *, source: str = "") -> torch.Tensor:
        """``amax`` as this quantizer holds it: 0-d (NVFP4, MXFP8), or INT4's per-block layout
        (or per channel: 1-d), which must match the layout seen before.

        Raises:
            ValueError: a count or layout that does not fit, naming the quantizer.
        """
        where = f"{source}: " if source else ""
        if self.per_tensor_amax:
            if amax.numel() != 1:
                raise ValueError(
                    f"{where}quantizer {self.name!r} ({self.spec.format}) has one per-tensor "
                    f"amax but got shape {tuple(amax.shape)}"
                )
            return amax.reshape(())
        known = self._buffers.get("amax")
        layout = tuple(known.shape) if known is not None and known.numel() else None
        if self.spec.block_size is None:
            amax = amax.reshape(-1)
        if layout is not None and tuple(amax.shape) != layout:
            raise ValueError(
                f"{where}quantizer {self.name!r} (INT4, block {self.spec.block_size}) has amax "
                f"of shape {layout} but got {tuple(amax.shape)}"
            )
        return amax

    def set_amax(self, amax: torch.Tensor | float) -> None:
        """Set amax directly (finite, non-negative, this quantizer's layout)."""
        t = torch.as_tensor(amax, dtype=torch.float32).detach()
        check_amax_values(t, what=f"quantizer {self.name!r} amax")
        t = self.check_amax_shape(t)
        if not self.per_tensor_amax:
            self._channels = t.numel()
        self._assign_amax(t.to(self.amax.device))
        self.amax_method, self.amax_percentile = "set", None

    def learn_amax(self, how: str | None = "lsq") -> None:
        """A block format's amax is not trained (QAT trains the weights through the STE).

        Raises:
            ValueError: ``how`` is not ``None``.
        """
        if how is not None:
            raise ValueError(
                f"quantizer {self.name!r}: a learned amax (lsq/pact) is INT8/FP8 only; "
                f"{self.spec.format} trains its weights through the straight-through estimator"
            )

    # -------------------------------------------------------------- calibration
    def calibrate_from(self, tensor: torch.Tensor) -> torch.Tensor:
        """Set amax from a weight now (by the ``CalibSpec``'s method), quantize mode."""
        self._seen_weight = tensor.detach()
        try:
            return self.load_calib_amax()
        finally:
            self._seen_weight = None
            self.mode = QuantMode.QUANTIZE

    def load_calib_amax(
        self, method: str | None = None, *, percentile: float | None = None
    ) -> torch.Tensor:
        """Compute amax from what calibration saw (a weight, or per-tensor statistics).

        Raises:
            CalibrationError: nothing was seen (naming this quantizer).
        """
        m = self.calib.method if method is None else method
        if self.role == "weight":
            weight = self._seen_weight
            if weight is None:
                raise CalibrationError(f"quantizer {self.name!r}: no weight was seen")
            amax = _weight_amax(weight, self.block_format, self.spec, m)
            self.set_amax(amax)
            self.amax_method = m if m in ("max", "mse") else "max"
            return self.amax.clone()
        if m not in _PER_TENSOR_METHODS:
            m = "max"  # entropy/mse would optimise the INT8 grid, not the block format's
        return super().load_calib_amax(m, percentile=percentile)

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the current mode to ``x``."""
        mode = self._mode
        if mode is QuantMode.BYPASS:
            return x
        self._check_float(x)
        if mode is QuantMode.CALIBRATE:
            if self.role == "weight":
                self._seen_weight = x.detach()
                return x
            if torch.compiler.is_dynamo_compiling():
                return _collect_uncompiled(self, x)
            return self._collect(x)
        if current_exporter() is not None:
            return self._export_qdq(x)
        amax = self._amax_arg()
        key = None if torch.compiler.is_compiling() else self._weight_key(x, self.amax)
        cached = self._cached_weight(key)
        if cached is not None:
            return cached
        # amax was checked when it was set: no host sync per call on CUDA
        out = block_fake_quant(x, self.block_format, amax, self.spec.axis or 0, check_amax=False)
        if not torch.compiler.is_compiling():
            self._keep_weight(key, out)
        return out

    def fake_quant_value(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` through this quantizer's block format whatever its mode (the per-layer error
        taps of :mod:`qdq.debug` run the FP32 model with every quantizer bypassed)."""
        return block_fake_quant(x, self.block_format, self._amax_arg(), self.spec.axis or 0)

    def _amax_arg(self) -> torch.Tensor | None:
        """The amax :func:`block_fake_quant` takes: none for MXFP8; NVFP4's per tensor; INT4's."""
        if self.spec.format == "mxfp8":
            return None
        if not self.is_calibrated:
            raise self._no_amax()
        return self.amax

    def _check_tensor_channels(self, x: torch.Tensor, *, calibrating: bool) -> None:
        """Block layouts are checked by :func:`block_fake_quant` (the blocked axis)."""

    def marker_amax(self) -> torch.Tensor | None:
        """The float32 amax constant of the export marker (``None`` for MXFP8)."""
        if self.spec.format == "mxfp8":
            return None
        return self._amax_arg().detach().to(torch.float32).clone()  # type: ignore[union-attr]

    def _export_qdq(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._buffers.get("export_weight")
        src = weight.to(x.dtype) if isinstance(weight, torch.Tensor) else x
        axis = normalize_axis(self.spec.axis, src.dim())
        assert axis is not None
        amax = self._buffers.get("export_amax")
        if amax is None and self.spec.format != "mxfp8":
            raise RuntimeError(
                f"quantizer {self.name!r} has no export amax; export with qdq.export_onnx"
            )

        # the TorchScript exporter traces on with the eager value; dynamo needs none (and would
        # trace the amax checks as data-dependent guards)
        def value() -> torch.Tensor:
            return block_fake_quant(src.detach(), self.block_format, amax, axis=axis)

        return emit_block(src, amax, self.spec.format, axis, self.spec.block_size, self.role, value)

    def extra_repr(self) -> str:
        parts = [f"name={self.name!r}"] if self.name else []
        parts.append(f"mode={self._mode.value}")
        size = self.spec.block_size
        parts.append(f"{self.spec.format}, {'per channel' if size is None else f'block={size}'}")
        parts.append(f"axis={self.spec.axis}, {self.role}")
        if not self.is_calibrated:
            parts.append("amax=None")
        elif self.amax.dim() == 0:
            parts.append(f"amax={float(self.amax.detach()):.6g}")
        else:
            lo, hi = float(self.amax.detach().min()), float(self.amax.detach().max())
            parts.append(f"amax=[{self.amax.numel()}] {lo:.4g}..{hi:.4g}")
        return ", ".join(parts)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        return {**state, "_seen_weight": None}


def _weight_amax(w: torch.Tensor, fmt: BlockFormat, spec: QuantSpec, method: str) -> torch.Tensor:
    """A weight's amax in ``fmt``: per tensor (NVFP4, MXFP8: the abs max), or INT4's per-block
    (or per-channel) amax by ``method`` (``mse``: the block-grid search of
    :mod:`qdq.calib.blocks`)."""
    axis = normalize_axis(spec.axis, w.dim())
    assert axis is not None
    if spec.format != "int4":
        return w.detach().abs().amax().to(torch.float32)
    if method == "mse":
        from qdq.calib.blocks import block_weight_amax

        return block_weight_amax(w, fmt, axis, method="mse")
    return block_amax(w, fmt, axis)
