"""The engine-time model: one TensorRT layer's time from its work, its bytes and the GPU.

A layer is plain data (:class:`CostLayer`): what it computes (``op``), at which precision, how
many multiply-accumulates and how many bytes it reads and writes. Its time on a GPU is

    compute = 2 · waves · SMs · tile_m · tile_n · k_padded / (peak(precision) · efficiency)
    memory  = bytes / (bandwidth · memory efficiency)
    time    = (compute^p + memory^p)^(1/p) + floor

The GEMM (``m`` rows, ``n`` output channels, ``k`` reduction per group) is cut into output tiles
of at most ``tile`` x ``tile`` (never larger than the GEMM), spread over the SMs in waves; with
fewer tiles than SMs the reduction is split (split-K, chunks of at least 256). ``n`` and ``k`` are
padded to the 16-byte vectors tensor cores read (8 FP16, 16 INT8/FP8, 4 TF32 values); an FP16
convolution pads its input channels. CUDA cores run what tensor cores cannot: FP32 on GPUs without
TF32, depthwise convolutions (fewer than 8 channels per group), TF32 and 8-bit convolutions whose
channels do not fill the vectors (the 3-channel stem: ``int8x4`` kernels), INT8 on a V100. FP32
layers run TF32 where the GPU has it. Element-wise, pooling, reformats (at their own, lower,
efficiency), standalone Q/DQ, copies and Myelin regions without a GEMM are memory only. The floor
is the per-layer time of the profiled engines (launch plus the profiler's synchronisation), one for
TensorRT 10 and newer, one for 8.x. The free parameters (:class:`CostParams`) are fitted on the real
engine profiles by ``scripts/fit_engine_time.py`` and stored with the fit's residuals and its
leave-one-out errors in ``params.json``; they are the same for every model and GPU
(docs/engine_time.md).
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
    "BLOCK_MATH",
    "COMPUTE_OPS",
    "OPS",
    "CostLayer",
    "CostParams",
    "LayerTime",
    "UnsupportedPrecisionError",
    "layer_time",
    "load_params",
    "math_precision",
]

#: what a layer does; the first group has a GEMM (compute and memory), the rest move memory only
COMPUTE_OPS = ("conv", "deconv", "gemm", "attention")
OPS = (*COMPUTE_OPS, "pointwise", "pool", "reduce", "softmax", "norm", "reformat", "qdq",
       "concat", "copy", "noop", "other")  # fmt: skip
#: bytes per value of each precision; the block formats of the linter (issue 60) with their
#: block scales: NVFP4 one E4M3 per 16 values, MXFP8 one E8M0 per 32, INT4 weight-only one
#: 16-bit scale per block of 128 (the largest block qdq writes; its activations are float)
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "fp8": 1.0,
                 "fp4": 0.5, "int4": 0.5, "int32": 4.0, "int64": 8.0, "bool": 1.0, "uint8": 1.0,
                 "nvfp4": 0.5 + 1 / 16, "mxfp8": 1.0 + 1 / 32, "int4w": 0.5 + 2 / 128}  # fmt: skip
#: K08: the tensor-core math of a block-scaled GEMM: NVFP4 at the FP4 rate, MXFP8 at the FP8
#: rate, INT4 weight-only at FP16 (its kernels widen the weights in the main loop)
BLOCK_MATH = {"nvfp4": "fp4", "mxfp8": "fp8", "int4w": "fp16"}
_CUDNN_TILE = 128  # the output tile of cuDNN's i8816 kernels
_SPLIT_K_MIN = 256  # the shortest reduction chunk of a split-K GEMM
_SIMT_SPEEDUP = {"fp32": 1.0, "tf32": 1.0, "fp16": 2.0, "bf16": 2.0, "int8": 4.0, "fp8": 2.0}


class UnsupportedPrecisionError(ValueError):
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
        out_precision: the precision it writes (``None``: as ``precision``).
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
    out_precision: str | None = None

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
        reformat_efficiency: the same for layout-changing copies (reformats, standalone Q/DQ).
        tile: the edge of the output tiles a GEMM's work is split into (wave quantization).
        blend: the ``p`` of ``(compute^p + memory^p)^(1/p)`` (1: no overlap, large: roofline max).
        floor_ms: per-layer floor (launch, plus the profiler's per-layer synchronisation) of
            TensorRT 10 and newer.
        floor_ms_trt8: the same for TensorRT 8.x engines, whose profiled layers carry more.
    """

    tensor_efficiency: float = 0.8
    simt_efficiency: float = 0.6
    memory_efficiency: float = 0.7
    reformat_efficiency: float = 0.5
    tile: float = 64.0
    blend: float = 1.5
    floor_ms: float = 0.005
    floor_ms_trt8: float = 0.006

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(
                    f"cost parameter {f.name} must be a positive number, got {value!r}"
                )

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
    """The precision a layer's math runs at on ``gpu``: FP32 runs TF32 where the GPU has it; a
    block format runs its :data:`BLOCK_MATH` precision.

    Raises:
        UnsupportedPrecisionError: ``gpu`` has no kernels of ``precision``.
    """
    if precision == "fp32":  # K01
        return "tf32" if gpu.peak("tf32") else "fp32"
    precision = BLOCK_MATH.get(precision, precision)  # K08
    if gpu.peak(precision) is None:
        raise UnsupportedPrecisionError(
            f"{gpu.label} (compute capability {gpu.compute_capability[0]}."
            f"{gpu.compute_capability[1]}) has no {precision.upper()} kernels"
        )
    return precision


def layer_time(
    layer: CostLayer, gpu: GPU, params: CostParams | None = None, *, trt_major: int = 10
) -> LayerTime:
    """Predict ``layer``'s time on ``gpu`` in a TensorRT ``trt_major`` engine.

    Raises:
        UnsupportedPrecisionError: a compute layer of a precision ``gpu`` lacks (the message names it).

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
    efficiency = p.reformat_efficiency if layer.op in ("reformat", "qdq") else p.memory_efficiency
    memory = layer.bytes / (gpu.memory_gbs * 1e9 * efficiency) * 1e3
    compute = 0.0
    math_at = layer.precision
    if layer.op in COMPUTE_OPS and layer.macs > 0:
        try:
            math_at = math_precision(layer.precision, gpu)
        except UnsupportedPrecisionError as err:
            raise UnsupportedPrecisionError(f"layer {layer.name!r}: {err}") from None
        compute = _compute_ms(layer, gpu, math_at, p)
    floor = p.floor_ms_trt8 if trt_major < 10 else p.floor_ms
    ms = _smooth_max(compute, memory, p.blend) + floor
    return LayerTime(ms, compute, memory, math_at)


def _compute_ms(layer: CostLayer, gpu: GPU, math_at: str, p: CostParams) -> float:
    """Wave-quantized tensor-core time, or the CUDA-core time where tensor cores do not apply."""
    align = max(1, int(16 / ELEMENT_BYTES.get(math_at, 2.0)))
    channels = layer.group_channels
    misaligned = channels > 0 and channels % align != 0
    if not gpu.tensor_cores(math_at):  # K06: INT8 on a V100, dp4a at its listed rate
        return 2.0 * layer.macs / (gpu.tflops[math_at] * 1e12 * p.simt_efficiency) * 1e3
    if layer.depthwise or (misaligned and math_at not in ("fp16", "bf16")):  # K02, K03
        # CUDA cores: FP32, depthwise, and TF32/8-bit convolutions whose channels do not fill the
        # tensor cores' 16-byte vectors (8-bit ones pad to 4 channels for dp4a)
        pad = _up(channels, 4) / channels if misaligned and ELEMENT_BYTES[math_at] == 1 else 1.0
        rate = gpu.tflops["fp32"] * _SIMT_SPEEDUP.get(math_at, 1.0) * p.simt_efficiency
        return 2.0 * layer.macs * pad / (rate * 1e12) * 1e3
    peak = gpu.peak(math_at) or gpu.tflops["fp32"]
    if layer.gemm is None:
        return 2.0 * layer.macs / (peak * 1e12 * p.tensor_efficiency) * 1e3
    m, n, k = layer.gemm
    if misaligned:  # K04: FP16 convolutions pad their input channels to the vector
        k = k // channels * _up(channels, align)
    # output tiles (at most tile x tile, no larger than the GEMM) spread over the SMs in waves;
    # each SM computes a tile over its share of the padded reduction at its share of the peak.
    # With fewer tiles than SMs the reduction is split (split-K) in chunks of at least
    # _SPLIT_K_MIN values
    k_pad = _up(k, align)
    edge = p.tile
    splits = True
    if _turing_mixed(layer, gpu, math_at):  # K05
        edge, splits = float(_CUDNN_TILE), False
    tile_m = min(edge, _up(m, 16))
    tile_n = min(edge, _up(n, align))
    tiles = math.ceil(m / tile_m) * math.ceil(_up(n, align) / tile_n) * max(1, layer.groups)
    split = max(1, min(gpu.sms // tiles, k_pad // _SPLIT_K_MIN)) if splits else 1
    waves = math.ceil(tiles * split / gpu.sms)
    work = waves * gpu.sms * tile_m * tile_n * k_pad / split
    return 2.0 * work / (peak * 1e12 * p.tensor_efficiency) * 1e3


def _turing_mixed(layer: CostLayer, gpu: GPU, math_at: str) -> bool:
    """An 8-bit GEMM writing a float output before Ampere: TensorRT 8 has no implicit-GEMM
    kernel for it there and runs cuDNN's ``i8816cudnn`` kernels, 128x128 tiles and no split-K
    (all 31 such layers of the TITAN RTX engines; the A100's run ``xmma`` kernels)."""
    out = layer.out_precision
    return (
        gpu.compute_capability < (8, 0)
        and ELEMENT_BYTES.get(math_at) == 1.0
        and out is not None
        and ELEMENT_BYTES.get(out, 1.0) > 1.0
    )


def _smooth_max(a: float, b: float, power: float) -> float:
    return (a**power + b**power) ** (1.0 / power)


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
