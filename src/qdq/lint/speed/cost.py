"""The engine-time model: one TensorRT layer's time from its work, its bytes and the GPU.

A layer is plain data (:class:`CostLayer`): what it computes (``op``), at which precision, how
many multiply-accumulates and how many bytes it reads and writes. Its time on a GPU is

    compute = 2 · MACs · padding / (peak(precision) · efficiency · wave use)
    memory  = bytes / (bandwidth · memory efficiency)
    time    = (compute^p + memory^p)^(1/p) + launch floor

``padding`` rounds the GEMM's reduction and output-channel sizes up to the 16-byte vectors tensor
cores read (8 FP16, 16 INT8/FP8, 4 TF32 values); ``wave use`` is the share of the GPU's SMs the
output tiles keep busy in their last wave. Depthwise/grouped convolutions with few channels per
group run on CUDA cores at the FP32 rate (times 2 for FP16, 4 for INT8). Element-wise, pooling,
reformats, standalone Q/DQ, copies and Myelin regions without a GEMM are memory only. The free
parameters (:class:`CostParams`) are fitted on the real engine profiles by
``scripts/fit_engine_time.py`` and stored with the fit's residuals in ``params.json``; they are
the same for every model and GPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from qdq.lint.speed.gpus import GPU

__all__ = [
    "COMPUTE_OPS",
    "OPS",
    "CostLayer",
    "CostParams",
    "LayerTime",
    "PrecisionUnsupported",
    "layer_time",
    "load_params",
    "math_precision",
]

#: what a layer does; the first group has a GEMM (compute and memory), the rest move memory only
COMPUTE_OPS = ("conv", "deconv", "gemm", "attention")
OPS = (*COMPUTE_OPS, "pointwise", "pool", "reduce", "softmax", "norm", "reformat", "qdq",
       "concat", "copy", "noop", "other")  # fmt: skip
#: bytes per value of each precision
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "fp8": 1.0,
                 "fp4": 0.5, "int4": 0.5, "int32": 4.0, "int64": 8.0, "bool": 1.0, "uint8": 1.0}  # fmt: skip
_SIMT_SPEEDUP = {"fp32": 1.0, "tf32": 1.0, "fp16": 2.0, "bf16": 2.0, "int8": 4.0, "fp8": 2.0}
_TILE = 128  # output tile edge for wave use


class PrecisionUnsupported(ValueError):
    """A layer asks for a precision the GPU has no kernels for (FP8 before Ada)."""


@dataclass(frozen=True)
class CostLayer:
    """One engine layer as the time model sees it.

    Attributes:
        name: the layer's name (TensorRT's, or the predicted layer's).
        op: one of :data:`OPS`.
        precision: the math precision (``"fp32"``, ``"fp16"``, ``"bf16"``, ``"int8"``, ``"fp8"``,
            ``"fp4"``); for memory-only layers the precision shown to the user.
        macs: multiply-accumulates (0 for memory-only layers).
        read_bytes: bytes of activations read.
        write_bytes: bytes written.
        weight_bytes: bytes of weights and constants read.
        gemm: ``(m, n, k)`` of the GEMM per group (rows, output channels, reduction), if any.
        groups: convolution groups (1 for a dense GEMM).
        group_channels: input channels per group (0 when unknown or not a convolution).
    """

    name: str
    op: str
    precision: str
    macs: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    weight_bytes: float = 0.0
    gemm: tuple[int, int, int] | None = None
    groups: int = 1
    group_channels: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"layer {self.name!r}: unknown op {self.op!r}; use one of {OPS}")
        for f in ("macs", "read_bytes", "write_bytes", "weight_bytes"):
            value = getattr(self, f)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"layer {self.name!r}: {f} must be finite and >= 0, got {value}")

    @property
    def bytes(self) -> float:
        """All bytes the layer moves."""
        return self.read_bytes + self.write_bytes + self.weight_bytes

    @property
    def depthwise(self) -> bool:
        """A grouped convolution with fewer than 8 channels per group (CUDA-core kernels)."""
        return self.groups > 1 and 0 < self.group_channels < 8

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


@dataclass(frozen=True)
class CostParams:
    """The fitted free parameters of the model (``params.json``).

    Attributes:
        tensor_efficiency: achieved share of a tensor-core peak on a large, aligned GEMM.
        simt_efficiency: achieved share of the CUDA-core peak (depthwise, FP32 without TF32).
        memory_efficiency: achieved share of DRAM bandwidth by streaming layers.
        blend: the ``p`` of ``(compute^p + memory^p)^(1/p)`` (1: no overlap, large: roofline max).
        floor_ms: per-layer floor (launch, plus the profiler's per-layer synchronisation).
    """

    tensor_efficiency: float = 0.8
    simt_efficiency: float = 0.6
    memory_efficiency: float = 0.7
    blend: float = 1.5
    floor_ms: float = 0.004

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"cost parameter {f.name} must be a positive number, got {value!r}")

    def to_dict(self) -> dict[str, float]:
        """A JSON-serialisable dict."""
        return asdict(self)


@dataclass(frozen=True)
class LayerTime:
    """A layer's predicted time and its two parts (all in ms)."""

    ms: float
    compute_ms: float
    memory_ms: float
    math: str  # the precision the math ran at ("tf32" for an FP32 layer on Ampere+)


def math_precision(precision: str, gpu: GPU) -> str:
    """The precision a layer's math runs at on ``gpu``: FP32 runs TF32 where the GPU has it.

    Raises:
        PrecisionUnsupported: ``gpu`` has no kernels of ``precision``.
    """
    if precision == "fp32":
        return "tf32" if gpu.peak("tf32") else "fp32"
    if gpu.peak(precision) is None:
        raise PrecisionUnsupported(
            f"{gpu.label} (compute capability {gpu.compute_capability[0]}."
            f"{gpu.compute_capability[1]}) has no {precision.upper()} kernels"
        )
    return precision


def layer_time(layer: CostLayer, gpu: GPU, params: CostParams | None = None) -> LayerTime:
    """Predict ``layer``'s time on ``gpu``.

    Raises:
        PrecisionUnsupported: a compute layer of a precision ``gpu`` lacks (the message names it).

    Example:
        >>> from qdq.lint.speed.gpus import find_gpu
        >>> conv = CostLayer("conv", "conv", "int8", macs=3.7e9, read_bytes=6.4e6,
        ...                  write_bytes=6.4e6, weight_bytes=36864, gemm=(100352, 64, 576))
        >>> a100 = find_gpu("a100")
        >>> layer_time(conv, a100).ms < layer_time(conv.__class__(**{**conv.to_dict(),
        ...     "precision": "fp16", "gemm": (100352, 64, 576)}), a100).ms
        True
    """
    p = params or load_params()
    if layer.op == "noop":
        return LayerTime(0.0, 0.0, 0.0, layer.precision)
    memory = layer.bytes / (gpu.memory_gbs * 1e9 * p.memory_efficiency) * 1e3
    compute = 0.0
    math_at = layer.precision
    if layer.op in COMPUTE_OPS and layer.macs > 0:
        try:
            math_at = math_precision(layer.precision, gpu)
        except PrecisionUnsupported as err:
            raise PrecisionUnsupported(f"layer {layer.name!r}: {err}") from None
        compute = _compute_ms(layer, gpu, math_at, p)
    blend = p.blend
    ms = (compute**blend + memory**blend) ** (1.0 / blend) + p.floor_ms
    return LayerTime(ms, compute, memory, math_at)


def _compute_ms(layer: CostLayer, gpu: GPU, math_at: str, p: CostParams) -> float:
    if layer.depthwise or math_at == "fp32":
        rate = gpu.tflops["fp32"] * _SIMT_SPEEDUP.get(math_at, 1.0) * p.simt_efficiency
        return 2.0 * layer.macs / (rate * 1e12) * 1e3
    peak = gpu.peak(math_at) or gpu.tflops["fp32"]
    pad = 1.0
    use = 1.0
    if layer.gemm is not None:
        m, n, k = layer.gemm
        align = max(1, int(16 / ELEMENT_BYTES.get(math_at, 2.0)))
        pad = (_up(n, align) / max(n, 1)) * (_up(k, align) / max(k, 1))
        tiles = math.ceil(m / _TILE) * math.ceil(n / _TILE) * max(1, layer.groups)
        use = tiles / (math.ceil(tiles / gpu.sms) * gpu.sms)
    return 2.0 * layer.macs * pad / (peak * 1e12 * p.tensor_efficiency * use) * 1e3


def _up(x: int, multiple: int) -> int:
    return -(-max(x, 1) // multiple) * multiple


@lru_cache(maxsize=1)
def load_params() -> CostParams:
    """The fitted parameters stored in ``qdq/lint/speed/params.json`` (defaults if absent)."""
    try:
        text = resources.files("qdq.lint.speed").joinpath("params.json").read_text()
    except FileNotFoundError:
        return CostParams()
    doc = json.loads(text)
    return CostParams(**doc["params"])
