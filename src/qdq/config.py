"""Frozen configuration dataclasses. Validation raises ``ValueError``/``TypeError`` naming the value."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

__all__ = [
    "BLOCK_FORMATS",
    "CALIBRATION_METHODS",
    "FORMATS",
    "PLAN_FORMATS",
    "CalibSpec",
    "Override",
    "QuantConfig",
    "QuantSpec",
]

CALIBRATION_METHODS = ("max", "entropy", "mse", "percentile")
#: Block-scaled formats (issue 60, :mod:`qdq.quant.blocks`): ``"nvfp4"`` (E2M1 values in blocks
#: of 16, E4M3 block scales under a float32 per-tensor scale), ``"mxfp8"`` (E4M3 values in blocks
#: of 32, E8M0 power-of-two scales) and ``"int4"`` (signed [-8, 7], ``scale = amax / 7`` per
#: block or per channel; weights only).
BLOCK_FORMATS = ("nvfp4", "mxfp8", "int4")
#: Quantization formats of one tensor: ``"int8"`` (signed integers, zero-point 0), ``"fp8"``
#: (OCP/ONNX float8 E4M3FN: 4 exponent bits, 3 mantissa bits, no infinities, largest finite
#: value 448) and the :data:`BLOCK_FORMATS`.
FORMATS = ("int8", "fp8", *BLOCK_FORMATS)
#: What a plan can ask for (``QuantConfig.format``): one format where TensorRT has its kernels
#: (``"int8"``, ``"fp8"``, ``"nvfp4"``, ``"mxfp8"``; ``"int4w"``: INT4 weights, float
#: activations), or ``"mixed"``: each layer the format TensorRT runs fastest, moved to FP8 where
#: INT8 loses accuracy (docs/placement.md, "Formats").
PLAN_FORMATS = ("int8", "fp8", "nvfp4", "mxfp8", "int4w", "mixed")
#: Bits and the one block size TensorRT runs (``None``: any, INT4) of each block format.
_BLOCK_SHAPES = {"nvfp4": (4, 16), "mxfp8": (8, 32), "int4": (4, None)}
_CALIBRATORS = ("max", "histogram")


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantized: symmetric, zero-point 0, in one of :data:`FORMATS`.

    Attributes:
        num_bits: integer width, 2..8 (TensorRT INT8 uses 8); 8 for ``format="fp8"`` and
            ``"mxfp8"``, 4 for ``"nvfp4"`` and ``"int4"``.
        axis: channel axis for per-channel scales (0 for Conv/Linear weights); ``None`` = per
            tensor. For a block format: the blocked axis (the GEMM's reduction axis, ``-1`` for a
            ``Linear`` weight ``[out, in]`` and for activations), or INT4's channel axis when
            ``block_size`` is ``None``, as ONNX ``DequantizeLinear``'s ``axis`` reads.
        narrow_range: saturate to ``[-qmax, qmax]`` (weights may use this; ONNX Q/DQ cannot express
            it, so the exporter only writes it where it cannot change a code). INT8 only.
        format: ``"int8"`` (``scale = amax / qmax``, integer codes), ``"fp8"`` (E4M3FN:
            ``scale = amax / 448``, the codes are float8 values, saturating, round to nearest
            even; exported at opset >= 19 with a ``float8e4m3fn`` zero point), or a block format
            (:data:`BLOCK_FORMATS`, :mod:`qdq.quant.blocks`).
        block_size: elements per scale along ``axis`` for a block format: 16 for NVFP4, 32 for
            MXFP8 (the sizes TensorRT runs), an even size for INT4 or ``None`` (per channel).
            ``None`` for INT8 and FP8.

    Example:
        >>> QuantSpec(axis=0)
        QuantSpec(num_bits=8, axis=0, narrow_range=False, format='int8', block_size=None)
        >>> QuantSpec(format="fp8").format
        'fp8'
        >>> QuantSpec.block("nvfp4").block_size
        16
        >>> QuantSpec.block("int4", block_size=128).num_bits
        4
    """

    num_bits: int = 8
    axis: int | None = None
    narrow_range: bool = False
    format: str = "int8"
    block_size: int | None = None

    @classmethod
    def block(
        cls,
        fmt: str,
        *,
        axis: int = -1,
        block_size: int | None = None,
        per_channel: bool = False,
    ) -> QuantSpec:
        """The spec of a block format with its bits, blocked along ``axis``; ``block_size``
        defaults to the format's (NVFP4 16, MXFP8 32, INT4 128). ``per_channel=True``: INT4 with
        one scale per channel along ``axis`` (no blocks)."""
        if fmt not in _BLOCK_SHAPES:
            raise ValueError(
                f"unknown block format {fmt!r}; choose one of {', '.join(BLOCK_FORMATS)}"
            )
        bits, size = _BLOCK_SHAPES[fmt]
        if per_channel:
            if block_size is not None:
                raise ValueError("per_channel=True takes no block_size")
            return cls(num_bits=bits, axis=axis, format=fmt, block_size=None)
        if block_size is None:
            block_size = 128 if size is None else size
        return cls(num_bits=bits, axis=axis, format=fmt, block_size=block_size)

    @property
    def is_block(self) -> bool:
        """Whether the format is block-scaled (:data:`BLOCK_FORMATS`)."""
        return self.format in _BLOCK_SHAPES

    def __post_init__(self) -> None:
        bits = _check_int("num_bits", self.num_bits)
        if not 2 <= bits <= 8:
            raise ValueError(f"num_bits must be in 2..8, got {bits}")
        if self.axis is not None:
            _check_int("axis", self.axis)
        if not isinstance(self.narrow_range, bool):
            raise TypeError(f"narrow_range must be a bool, got {type(self.narrow_range).__name__}")
        if self.format not in FORMATS:
            raise ValueError(
                f"unknown quantization format {self.format!r}; choose one of {', '.join(FORMATS)}"
            )
        if self.format == "fp8" and (bits != 8 or self.narrow_range):
            raise ValueError(
                "format='fp8' is float8 E4M3FN (8 bits, saturating to +-448): it takes neither "
                f"num_bits={bits} nor narrow_range={self.narrow_range}"
            )
        if self.format in _BLOCK_SHAPES:
            self._check_block(bits)
        elif self.block_size is not None:
            raise ValueError(
                f"format={self.format!r} has no blocks: block_size must be None, got "
                f"{self.block_size!r} (block formats: {', '.join(BLOCK_FORMATS)})"
            )

    def _check_block(self, bits: int) -> None:
        fmt, size = self.format, self.block_size
        want_bits, want_size = _BLOCK_SHAPES[fmt]
        if bits != want_bits or self.narrow_range:
            raise ValueError(
                f"format={fmt!r} is {want_bits}-bit and symmetric: num_bits must be {want_bits} "
                f"and narrow_range False (got {bits}, {self.narrow_range}); "
                f"QuantSpec.block({fmt!r}) builds it"
            )
        if self.axis is None:
            raise ValueError(
                f"format={fmt!r} needs axis: the blocked axis (the reduction axis, -1 for a "
                "Linear weight or an activation)"
            )
        if size is not None:
            _check_int("block_size", size)
        if want_size is not None and size != want_size:
            raise ValueError(
                f"format={fmt!r} runs in TensorRT with blocks of {want_size}, got "
                f"block_size={size!r}"
            )
        if size is not None and (size < 2 or size % 2):
            raise ValueError(f"block_size must be an even int >= 2 or None, got {size}")


@dataclass(frozen=True)
class CalibSpec:
    """How a quantizer's amax is calibrated.

    Attributes:
        calibrator: ``"histogram"`` (per tensor; any method) or ``"max"`` (per tensor or channel).
        method: ``"max"``, ``"entropy"``, ``"mse"`` (default) or ``"percentile"``. MSE is the
            default because TensorRT's entropy clipped the built-in Fashion-MNIST model to 76 %
            (FP32 92.2 %); see docs/numerics.md.
        percentile: used by ``method="percentile"``, in (0, 100].
        num_bins: histogram resolution (a power of two >= 256).
        fixed_amax: a data-independent amax (per tensor), or ``None``. The quantizer holds it
            from the start and keeps it through calibration (statistics are still collected,
            not used), the per-quantizer method choice and QAT (it is never learned). An FP8
            plan gives the softmax output of an FP8 attention ``fixed_amax=1.0`` (scale 1/448,
            rule F08): the probabilities lie in [0, 1] whatever the data.

    Example:
        >>> CalibSpec(method="percentile", percentile=99.999).method
        'percentile'
        >>> CalibSpec(fixed_amax=1.0).fixed_amax
        1.0
    """

    calibrator: str = "histogram"
    method: str = "mse"
    percentile: float = 99.99
    num_bins: int = 2048
    fixed_amax: float | None = None

    def __post_init__(self) -> None:
        if self.calibrator not in _CALIBRATORS:
            raise ValueError(
                f"unknown calibrator {self.calibrator!r}; choose one of {', '.join(_CALIBRATORS)}"
            )
        if self.method not in CALIBRATION_METHODS:
            raise ValueError(
                f"unknown calibration method {self.method!r}; "
                f"choose one of {', '.join(CALIBRATION_METHODS)}"
            )
        if self.calibrator == "max" and self.method != "max":
            raise ValueError(
                f"calibrator='max' only supports method='max', got method={self.method!r}; "
                "use calibrator='histogram' for entropy/mse/percentile"
            )
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)):
            raise TypeError(f"percentile must be a number, got {type(self.percentile).__name__}")
        if not 0.0 < float(self.percentile) <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        bins = _check_int("num_bins", self.num_bins)
        if bins < 256 or bins & (bins - 1):
            raise ValueError(f"num_bins must be a power of two >= 256, got {bins}")
        if self.fixed_amax is not None:
            if isinstance(self.fixed_amax, bool) or not isinstance(self.fixed_amax, (int, float)):
                raise TypeError(
                    f"fixed_amax must be a number or None, got {type(self.fixed_amax).__name__}"
                )
            if not (math.isfinite(self.fixed_amax) and self.fixed_amax > 0):
                raise ValueError(f"fixed_amax must be finite and > 0, got {self.fixed_amax}")

    @classmethod
    def weights(cls) -> CalibSpec:
        """Per-channel abs-max, the TensorRT default for weights."""
        return cls(calibrator="max", method="max")


@dataclass(frozen=True)
class Override:
    r"""A change for the quantization points that match all given selectors.

    Selectors (at least one): ``name`` — the exact module path (``"layer1.0.conv1"``; functional
    ops are named after their enclosing module and op, e.g. ``"layer1.0.add"``); ``regex`` — a
    regular expression searched in that name; ``module_type`` — the class of the module (subclasses
    match); ``op`` — the op kind (``"conv"``, ``"linear"``, ``"add"``, ``"cat"``, ``"avg_pool"`` ...).

    Actions: ``exclude`` keeps the op in float (for a weighted op: both its input and weight);
    ``calib`` replaces the calibration spec of the matching activation points; ``num_bits``
    changes their bit width; ``format`` (``"int8"`` / ``"fp8"``, or a block format ``"nvfp4"`` /
    ``"mxfp8"`` / ``"int4"``: INT4 weight-only) sets a weighted layer's format in a plan that is
    not INT8 only (``QuantConfig(format="fp8" | "mixed" | "nvfp4" | ...)``; rule ``USER``; the
    one-format-per-tensor rules F05/F14 still apply, and a layer that cannot take a block format
    keeps its plan's with the refusal in its reason: F12, F13).

    Example:
        >>> Override(regex=r"^head\.", exclude=True).matches("head.cls", torch.nn.Conv2d, "conv")
        True
    """

    name: str | None = None
    regex: str | None = None
    module_type: type | None = None
    op: str | None = None
    exclude: bool = False
    calib: CalibSpec | None = None
    num_bits: int | None = None
    format: str | None = None

    def __post_init__(self) -> None:
        if (
            self.name is None
            and self.regex is None
            and self.module_type is None
            and self.op is None
        ):
            raise ValueError("an Override needs at least one of name=, regex=, module_type=, op=")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"invalid regex {self.regex!r}: {err}") from None
        if self.module_type is not None and not isinstance(self.module_type, type):
            raise TypeError(f"module_type must be a class, got {self.module_type!r}")
        if self.num_bits is not None and not 2 <= _check_int("num_bits", self.num_bits) <= 8:
            raise ValueError(f"num_bits must be in 2..8, got {self.num_bits}")
        if self.calib is not None and not isinstance(self.calib, CalibSpec):
            raise TypeError(f"calib must be a CalibSpec, got {type(self.calib).__name__}")
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(
                f"an Override's format must be one of {', '.join(FORMATS)}, got {self.format!r}"
            )

    def matches(self, name: str, module_type: type | None, op: str) -> bool:
        """Whether a point named ``name`` (module class ``module_type``, op kind ``op``) matches."""
        if self.name is not None and name != self.name:
            return False
        if self.regex is not None and re.search(self.regex, name) is None:
            return False
        if self.module_type is not None and (
            module_type is None or not issubclass(module_type, self.module_type)
        ):
            return False
        return self.op is None or self.op == op


@dataclass(frozen=True)
class QuantConfig:
    """What to quantize and how. ``QuantConfig.tensorrt()`` is the default.

    Attributes:
        activation: spec of activation quantizers (per tensor).
        weight: spec of weight quantizers (per output channel, axis 0).
        activation_calib: how activations are calibrated (histogram + MSE).
        weight_calib: how weights are calibrated (per-channel abs-max).
        disabled: rule families switched off (see ``qdq.rules.FAMILIES``): ``"residual"``,
            ``"concat"``, ``"pooling"``, ``"activation"``, ``"pad"``, ``"performance"``,
            ``"weighted"``.
        conv_transpose_axis: ``None`` (per-tensor ConvTranspose weights, valid on every TensorRT,
            rule V12) or ``1`` (per output channel, TensorRT >= 10.2).
        overrides: applied in order; later ones win.
        format: ``"int8"`` (every quantized layer INT8), ``"fp8"`` (FP8 E4M3 where TensorRT
            has an FP8 kernel for the layer, INT8 where it has none: rules F01-F06) or
            ``"mixed"`` (convolutions INT8, GEMMs and attention FP8: F07; ``Override(format=)``
            moves single layers, as ``qdq quantize --format mixed`` does where INT8 loses
            accuracy); ``"nvfp4"`` / ``"mxfp8"`` (the FP8 plan, then GEMMs whose reduction size
            is a whole number of blocks in the block format, weights and inputs: F11-F15) or
            ``"int4w"`` (GEMMs with INT4 block-wise weights and float inputs, everything else
            float: F16, F17); docs/placement.md. The specs above are the INT8 ones, the planner
            derives the others.
        fp8_gemm_per_channel: FP8 GEMM weights (Linear, MatMul/Gemm with a weight) per output
            channel instead of per tensor (rule F06): TensorRT scales FP8 GEMMs per channel
            from 10.6 on Hopper and 10.7 on Ada (``Target.fp8_gemm_per_channel``; the job sets
            it from its target). FP8 convolution weights stay per tensor on every target.

    Example:
        >>> cfg = QuantConfig.tensorrt().exclude(regex=r"^fc$").with_calib(method="percentile")
        >>> cfg.activation_calib.method, len(cfg.overrides)
        ('percentile', 1)
    """

    activation: QuantSpec = field(default_factory=QuantSpec)
    weight: QuantSpec = field(default_factory=lambda: QuantSpec(axis=0))
    activation_calib: CalibSpec = field(default_factory=CalibSpec)
    weight_calib: CalibSpec = field(default_factory=CalibSpec.weights)
    disabled: frozenset[str] = frozenset()
    conv_transpose_axis: int | None = None
    overrides: tuple[Override, ...] = ()
    format: str = "int8"
    fp8_gemm_per_channel: bool = False

    def __post_init__(self) -> None:
        from qdq.rules import FAMILIES

        if self.format not in PLAN_FORMATS:
            raise ValueError(
                f"unknown format {self.format!r}; choose one of {', '.join(PLAN_FORMATS)}"
            )
        disabled = frozenset(self.disabled)
        unknown = disabled - FAMILIES
        if unknown:
            raise ValueError(
                f"unknown rule families {sorted(unknown)}; choose from {sorted(FAMILIES)}"
            )
        object.__setattr__(self, "disabled", disabled)
        if self.activation.axis is not None:
            raise ValueError("activations are quantized per tensor (TensorRT rule V05): axis=None")
        if self.weight.axis != 0:
            raise ValueError(
                f"weights are quantized per output channel: axis=0, got {self.weight.axis}"
            )
        if self.conv_transpose_axis not in (None, 1):
            raise ValueError(
                f"conv_transpose_axis must be None (per tensor) or 1, got {self.conv_transpose_axis}"
            )
        if not isinstance(self.fp8_gemm_per_channel, bool):
            raise TypeError(
                "fp8_gemm_per_channel must be True or False, got "
                f"{type(self.fp8_gemm_per_channel).__name__}"
            )
        for o in self.overrides:
            if not isinstance(o, Override):
                raise TypeError(f"overrides must be Override objects, got {type(o).__name__}")

    @classmethod
    def tensorrt(
        cls, *, disable: tuple[str, ...] = (), method: str = "mse", percentile: float = 99.99
    ) -> QuantConfig:
        """The TensorRT preset: every rule family on except those in ``disable``."""
        return cls(
            activation_calib=CalibSpec(method=method, percentile=percentile),
            disabled=frozenset(disable),
        )

    def exclude(
        self,
        *,
        name: str | None = None,
        regex: str | None = None,
        module_type: type | None = None,
        op: str | None = None,
    ) -> QuantConfig:
        """A copy that keeps the matching ops in float."""
        o = Override(name=name, regex=regex, module_type=module_type, op=op, exclude=True)
        return self.with_override(o)

    def with_override(self, override: Override) -> QuantConfig:
        """A copy with ``override`` appended."""
        return replace(self, overrides=(*self.overrides, override))

    def with_calib(
        self, *, method: str | None = None, percentile: float | None = None
    ) -> QuantConfig:
        """A copy whose activation calibration uses ``method`` (and ``percentile``)."""
        c = self.activation_calib
        return replace(
            self,
            activation_calib=replace(
                c,
                method=c.method if method is None else method,
                percentile=c.percentile if percentile is None else percentile,
            ),
        )

    def family_enabled(self, family: str) -> bool:
        """Whether a rule family is active."""
        return family not in self.disabled

    def resolve(
        self, name: str, module_type: type | None, op: str
    ) -> tuple[bool, CalibSpec | None, int | None]:
        """``(excluded, calib override, num_bits override)`` for a point."""
        excluded, calib, bits = False, None, None
        for o in self.overrides:
            if o.matches(name, module_type, op):
                excluded = excluded or o.exclude
                calib = o.calib if o.calib is not None else calib
                bits = o.num_bits if o.num_bits is not None else bits
        return excluded, calib, bits
