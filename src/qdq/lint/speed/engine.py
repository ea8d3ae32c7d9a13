"""A real engine report (``trtexec --exportLayerInfo``) as the time model's layers.

Each :class:`~qdq.lint.engine_report.EngineLayer` becomes one
:class:`~qdq.lint.speed.cost.CostLayer` from what the report gives: the layer's type, its
tensors' dimensions and formats, the convolution's kernel, groups and output maps, the weights'
count and type. TensorRT 8.x-11 schemas and Myelin layers (``gemm``, ``kgen``, ``shape_call``)
are read; a layer the model does not know is timed by the bytes it moves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from qdq.lint.engine_fields import EngineReportError, quote
from qdq.lint.engine_report import EngineLayer, EngineReport, EngineTensor
from qdq.lint.speed.cost import ELEMENT_BYTES, CostLayer

__all__ = ["engine_cost_layers", "engine_layer_cost", "engine_layer_op", "engine_trt_major"]

_POOL = ("pooling", "reduce")
_POINTWISE = ("elementwise", "pointwise", "activation", "scale", "unary", "pwn", "kgen")
_COPY = ("shuffle", "slice", "resize", "gather", "padding", "copy", "transpose", "reshape")


def engine_layer_op(layer: EngineLayer) -> str:
    """The model's op for an engine layer (one of :data:`~qdq.lint.speed.cost.OPS`).

    Example:
        >>> from qdq.lint.engine_report import parse_engine_report
        >>> r = parse_engine_report([{"Name": "Q", "LayerType": "Reformat", "Origin": "QDQ",
        ...                           "Inputs": [], "Outputs": []}])
        >>> engine_layer_op(r.layers[0])
        'qdq'
    """
    kind = f"{layer.layer_type} {layer.parameter_type or ''}".lower()
    if layer.layer_type == "NoOp" or "noop" in kind:
        return "noop"
    if layer.is_qdq_reformat:
        return "qdq"
    if layer.is_reformat:
        return "reformat"
    if "deconvolution" in kind:
        return "deconv"
    if "convolution" in kind or "convactpool" in kind:
        return "conv"
    if any(k in kind for k in ("gemm", "matrixmultiply", "fullyconnected", "matmul")):
        return "gemm"
    if "mha" in kind or "attention" in kind:
        return "attention"
    if "softmax" in kind:
        return "softmax"
    if "normalization" in kind or "layernorm" in kind:
        return "norm"
    if any(k in kind for k in _POOL):
        return "pool"
    if "concat" in kind:
        return "concat"
    if any(k in kind for k in _COPY):
        return "copy"
    if any(k in kind for k in _POINTWISE):
        return "pointwise"
    return "other"


def engine_trt_major(report: EngineReport) -> int:
    """The TensorRT generation that wrote ``report``: 11 for the TensorRT 11 schema, 10 when its
    layers carry ``StreamId``/``Metadata`` (TensorRT 10's layer information), else 8."""
    if report.schema == "trt11":
        return 11
    if any("StreamId" in x.raw or "Metadata" in x.raw for x in report.layers):
        return 10
    return 8


def engine_cost_layers(report: EngineReport, profile: int = 0) -> list[CostLayer]:
    """The cost layers of ``report``'s optimization profile ``profile``, in TensorRT's order."""
    return [engine_layer_cost(x) for x in report.layers if x.profile == profile]


def engine_layer_cost(layer: EngineLayer) -> CostLayer:
    """One engine layer as a :class:`CostLayer` (its precision, work and bytes).

    Raises:
        EngineReportError: the layer's dimensions give no finite work or size (a report from
            someone else: one line naming the layer).
    """
    try:
        return _layer_cost(layer)
    except (ValueError, OverflowError, ZeroDivisionError) as err:
        raise EngineReportError(
            f"layer {quote(layer.name)}: cannot be timed from its dimensions ({err})"
        ) from None


def _layer_cost(layer: EngineLayer) -> CostLayer:
    op = engine_layer_op(layer)
    inputs = list(layer.compute_inputs)
    precision = _precision(layer, op)
    if op in ("noop",):
        return CostLayer(layer.name, op, precision)
    read = sum(_bytes(t) for t in inputs)
    write = sum(_bytes(t) for t in layer.outputs)
    weights = _weight_bytes(layer) + sum(_bytes(t) for t in layer.constants)
    if op in ("conv", "deconv"):
        return _conv(layer, op, precision, read, write, weights)
    if op == "gemm":
        return _gemm(layer, precision, inputs, write, weights)
    return CostLayer(layer.name, op, precision, read_bytes=read, write_bytes=write,
                     weight_bytes=weights)  # fmt: skip


def _precision(layer: EngineLayer, op: str) -> str:
    if op in ("reformat", "qdq"):  # shown as what it writes
        return layer.output_precision or layer.input_precision or "fp32"
    p = layer.input_precision or layer.output_precision or "fp32"
    return p if p in ELEMENT_BYTES else "fp32"


def _elements(t: EngineTensor) -> float:
    """The tensor's values (a dynamic or zero dimension counts as 1), as a float: dimensions
    that multiply past a float's range give ``inf``, which the layer then refuses."""
    return math.prod(float(max(1, d)) for d in t.dims) if t.dims else 0.0


_VECTOR_WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16, "thirty-two": 32}
_VECTOR = re.compile(r"(two|four|eight|sixteen|thirty-two) wide channel vectorized", re.I)
_CHANNEL_MOD = re.compile(r"channel % (\d{1,2}) == 0")
_VECTOR_SHORT = re.compile(r"\b(?:k?CHW|k?HWC|kDHWC|kCDHW)(\d{1,2})\b")


def _bytes(t: EngineTensor) -> float:
    """The tensor's bytes in its format: a channel-vectorized format (``Thirty-two wide channel
    vectorized``, ``kCHW32``, ``kHWC8``) pads the channels to a multiple of its vector."""
    elements = _elements(t)
    width = _vector_width(t.format)
    if width > 1 and len(t.dims) >= 3 and t.dims[1] > 0:
        elements *= -(-t.dims[1] // width) * width / t.dims[1]
    return elements * ELEMENT_BYTES.get(t.dtype or "fp32", 4.0)


def _vector_width(fmt: str) -> int:
    m = _CHANNEL_MOD.search(fmt)
    if m is not None:
        return int(m.group(1))
    m = _VECTOR.search(fmt)
    if m is not None:
        return _VECTOR_WORDS[m.group(1).lower()]
    m = _VECTOR_SHORT.search(fmt)
    return int(m.group(1)) if m is not None else 1


def _weight_bytes(layer: EngineLayer) -> float:
    total = 0.0
    for key in ("Weights", "ConvWeights", "Bias"):
        w = layer.raw.get(key)
        if isinstance(w, dict):
            count = w.get("Count")
            if isinstance(count, int) and count > 0:
                from qdq.lint.engine_report import normalize_dtype

                dtype = normalize_dtype(w.get("Type") if isinstance(w.get("Type"), str) else None)
                total += count * ELEMENT_BYTES.get(dtype or "fp32", 4.0)
    return total


def _positive(value: Any, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )


def _ints(value: Any, n: int) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value):
        return tuple(value)
    if isinstance(value, int) and value > 0:
        return (value,) * n
    return None


def _conv(
    layer: EngineLayer, op: str, precision: str, read: float, write: float, weights: float
) -> CostLayer:
    inp = next((t for t in layer.compute_inputs if len(t.dims) >= 3), None)
    out = next((t for t in layer.outputs if len(t.dims) >= 3), None)
    if inp is None or out is None:
        return CostLayer(layer.name, "pointwise", precision, read_bytes=read, write_bytes=write,
                         weight_bytes=weights)  # fmt: skip
    raw = layer.raw
    spatial = len(out.dims) - 2
    kernel = _ints(raw.get("Kernel"), spatial) or (1,) * spatial
    groups = _positive(raw.get("Groups"), 1)
    c_in = max(1, inp.dims[1])
    c_out = _positive(raw.get("OutMaps"), max(1, out.dims[1]))
    batch = max(1, out.dims[0])
    if op == "deconv":  # the GEMM runs over the input's positions, kernel scattered out
        positions = math.prod(max(1, d) for d in inp.dims[2:])
        m = batch * positions
        n = c_out // groups * math.prod(kernel)
        k = c_in // groups
    else:
        positions = math.prod(max(1, d) for d in out.dims[2:])
        m = batch * positions
        n = max(1, c_out // groups)
        k = max(1, c_in // groups) * math.prod(kernel)
    macs = float(m) * n * k * groups
    if op == "conv":  # a strided convolution reads only the input positions its kernel touches
        touched = float(m) * k * groups * ELEMENT_BYTES.get(inp.dtype or "fp32", 4.0)
        read -= max(0.0, _bytes(inp) - touched)
    return CostLayer(layer.name, op, precision, macs=macs, read_bytes=read, write_bytes=write,
                     weight_bytes=weights, gemm=(m, n, k), groups=groups,
                     group_channels=max(1, c_in // groups),
                     out_precision=layer.output_precision)  # fmt: skip


def _gemm(
    layer: EngineLayer,
    precision: str,
    inputs: Sequence[EngineTensor],
    write: float,
    weights: float,
) -> CostLayer:
    """A GEMM/MatMul/FullyConnected: ``A (..., M, K) x B (K, N)``; tiny operands (alpha, beta,
    bias) and a second large operand count as read bytes."""
    out = next((t for t in layer.outputs if t.dims), None)
    mats = [t for t in inputs if len(t.dims) >= 2]
    read = sum(_bytes(t) for t in inputs)
    if out is None or not mats:
        return CostLayer(layer.name, "pointwise", precision, read_bytes=read, write_bytes=write,
                         weight_bytes=weights)  # fmt: skip
    a = mats[0]
    k = max(1, a.dims[-1])
    n = max(1, out.dims[-1])
    m = max(1, int(_elements(out) // n))
    if layer.raw.get("ParameterType") == "FullyConnected" and len(a.dims) >= 2:
        k = max(1, int(_elements(a) // max(1, a.dims[0])))
        m = max(1, a.dims[0])
    return CostLayer(layer.name, "gemm", precision, macs=float(m) * n * k, read_bytes=read,
                     write_bytes=write, weight_bytes=weights, gemm=(m, n, k),
                     out_precision=layer.output_precision)  # fmt: skip
