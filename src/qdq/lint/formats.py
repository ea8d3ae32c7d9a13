"""The quantized formats the linter predicts, as data: INT8, FP8 (E4M3FN) and the block-scaled
formats NVFP4, MXFP8 and INT4 weight-only (issue 60).

A Q/DQ pair is FP8 when its quantized tensor is ``FLOAT8E4M3FN``: the QuantizeLinear's zero point
(its third input) has that type, or a DequantizeLinear reads an FP8 initializer (ModelOpt's
``dq_only`` weights, an ``FLOAT8E4M3FN`` tensor with only a DequantizeLinear and no zero point).
Everything else is read as INT8, as the linter always has (a zero point of another type is a
validity finding, V02). Each rule that differs between the formats reads its row of
:data:`FORMATS` instead of testing the format by name.

The block formats are read in the forms TensorRT's parser builds and TensorRT Model Optimizer
exports (``modelopt/torch/quantization/export_onnx.py``, ``modelopt/onnx/export/nvfp4_exporter.py``,
``int4_exporter.py``):

* NVFP4: a ``FLOAT4E2M1`` weight initializer read by ``DequantizeLinear(block_size=16, axis)``
  whose scale is the output of a ``DequantizeLinear`` of ``FLOAT8E4M3FN`` block scales under a
  float32 per-tensor scale; activations through ``trt::TRT_FP4DynamicQuantize`` (block 16), whose
  two outputs (E2M1 values, E4M3 block scales) are read by the same two ``DequantizeLinear``.
* MXFP8: ``DequantizeLinear(block_size=32)`` of E4M3 values with ``FLOAT8E8M0`` scales (opset
  24), activations through ``trt::TRT_MXFP8DynamicQuantize`` (block 32). ModelOpt 0.47 writes
  its MXFP8 export at opset 20 with ``trt::TRT_MXFP8DequantizeLinear`` (an operator TensorRT's
  parser builds) for weights and activations, its E8M0 scales typed ``UINT8`` (the exponent
  byte, bias 127): :func:`is_dequantize` reads it as a DequantizeLinear in MXFP8.
* INT4 weight-only: an ``INT4`` weight initializer read by ``DequantizeLinear(block_size, axis)``
  (opset 21; per channel without ``block_size``) in front of a MatMul/Gemm whose activation is
  float. ModelOpt writes it as ``trt::DequantizeLinear`` (at opset 20), which has the op type of
  ONNX's and is read the same.

Example:
    >>> FORMATS["fp8"].min_opset, FORMATS["fp8"].compute_capability
    (19, (8, 9))
    >>> dtype_format("float8_e4m3fn"), dtype_format("int8")
    ('fp8', 'int8')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BLOCK_FORMATS",
    "DYNAMIC_QUANTIZE",
    "FORMATS",
    "FP8",
    "INT4W",
    "INT8",
    "MXFP8",
    "NVFP4",
    "QUANTIZED",
    "TRT_DEQUANTIZE",
    "QuantFormat",
    "dequantize_scale",
    "dtype_format",
    "is_dequantize",
    "is_qdq",
    "is_quantized",
    "qdq_format",
]

INT8, FP8 = "int8", "fp8"
NVFP4, MXFP8, INT4W = "nvfp4", "mxfp8", "int4w"


@dataclass(frozen=True)
class QuantFormat:
    """What TensorRT does with one quantized format.

    Attributes:
        name: the precision the linter writes for it (``"int8"``, ``"fp8"``), as the engine
            reports normalise TensorRT's names (``Int8``, ``FP8``).
        label: for messages.
        min_opset: the ONNX opset whose QuantizeLinear/DequantizeLinear take the type.
        compute_capability: the least GPU compute capability with kernels for it (``None``: every
            GPU TensorRT 8-11 runs).
        build_flag: the weakly typed builder flag that enables it (trtexec ``--int8``, ``--fp8``).
        plain_layers: pooling, pointwise and data-movement layers run in it (INT8); ``False``
            where TensorRT's kernels for the format are the GEMM, convolution and MHA ones only,
            so those layers run float behind a standalone Dequantize.
        per_channel_conv: TensorRT builds per-output-channel convolution weights in it.
        source: where the row comes from.
        block: the block size of a block-scaled format (``None`` for INT8 and FP8, and the
            least TensorRT's kernels take for INT4, whose block size is free).
        min_trt: the first TensorRT release with kernels for it (``None``: every release the
            linter knows).
        weight_only: only the weights are quantized; the activation is read in float.
    """

    name: str
    label: str
    min_opset: int
    compute_capability: tuple[int, int] | None
    build_flag: str
    plain_layers: bool
    per_channel_conv: bool
    source: str
    block: int | None = None
    min_trt: tuple[int, int] | None = None
    weight_only: bool = False


FORMATS: Mapping[str, QuantFormat] = {
    INT8: QuantFormat(
        INT8, "INT8", 10, None, "int8", True, True,
        "reference/tensorrt-qdq-rules.md §1.1",
    ),
    FP8: QuantFormat(
        FP8, "FP8", 19, (8, 9), "fp8", False, False,
        "ONNX QuantizeLinear-19; NVIDIA/Model-Optimizer#70 ('Networks with FP8 Q/DQ layers require "
        "hardware with FP8 support'); TensorRT 10.x release notes, Limitations (FP8 convolutions); "
        "NVIDIA/Model-Optimizer#118 (per-channel FP8 convolution weights)",
    ),
    NVFP4: QuantFormat(
        NVFP4, "NVFP4", 23, (10, 0), "fp4", False, False,
        "TensorRT 10.8 release notes (FP4 on Blackwell); NVIDIA/Model-Optimizer "
        "modelopt/torch/quantization/export_onnx.py (export_fp4: TRT_FP4DynamicQuantize, block 16)",
        16, (10, 8),
    ),
    MXFP8: QuantFormat(
        MXFP8, "MXFP8", 24, (10, 0), "fp8", False, False,
        "TensorRT 10.12 release notes (MXFP8 on Blackwell); NVIDIA/Model-Optimizer "
        "modelopt/torch/quantization/export_onnx.py (export_mxfp8: TRT_MXFP8DynamicQuantize, "
        "block 32, E8M0 scales)",
        32, (10, 12),
    ),
    INT4W: QuantFormat(
        INT4W, "INT4 weight-only", 21, None, "int4", False, False,
        "TensorRT 10.0 release notes (INT4 weight-only quantization, block-wise DequantizeLinear); "
        "NVIDIA/Model-Optimizer modelopt/onnx/export/int4_exporter.py",
        None, (10, 0), True,
    ),
}  # fmt: skip
QUANTIZED = frozenset(FORMATS)
#: the block-scaled formats (issue 60): GEMM kernels only, on the TensorRT releases of ``min_trt``
BLOCK_FORMATS = frozenset({NVFP4, MXFP8, INT4W})
#: TensorRT's dynamic block quantize operators (domain ``trt``): activation -> (values, scales)
DYNAMIC_QUANTIZE = {"TRT_FP4DynamicQuantize": NVFP4, "TRT_MXFP8DynamicQuantize": MXFP8}
#: TensorRT's own DequantizeLinear operators (domain ``trt``, built by its parser) -> the block
#: format they read: ModelOpt's MXFP8 export (E4M3 values, E8M0 scales typed UINT8)
TRT_DEQUANTIZE = {"TRT_MXFP8DequantizeLinear": MXFP8}
_E8M0_BIAS = 127

#: numpy dtype names of quantized tensors (as ``onnx.numpy_helper`` returns them) -> format
_DTYPE_FORMATS = {"int8": INT8, "float8_e4m3fn": FP8, "int4": INT4W, "float4_e2m1fn": NVFP4}


def dtype_format(dtype_name: str) -> str:
    """The format of a quantized tensor of numpy dtype ``dtype_name`` (INT8 unless FP8 E4M3FN,
    INT4 or FP4 E2M1)."""
    return _DTYPE_FORMATS.get(dtype_name, INT8)


def is_dequantize(node: Any) -> bool:
    """Whether ``node`` is a DequantizeLinear to the linter: ONNX's, the ``trt::DequantizeLinear``
    of ModelOpt's INT4 export (the same op type) or ``trt::TRT_MXFP8DequantizeLinear``
    (:data:`TRT_DEQUANTIZE`). Every rule that follows a DequantizeLinear asks this.

    Example:
        >>> from onnx import helper
        >>> mx = helper.make_node("TRT_MXFP8DequantizeLinear", ["w", "s"], ["y"], domain="trt")
        >>> is_dequantize(mx), is_dequantize(helper.make_node("QuantizeLinear", ["x", "s"], ["q"]))
        (True, False)
    """
    return node.op_type == "DequantizeLinear" or (
        node.domain == "trt" and node.op_type in TRT_DEQUANTIZE
    )


def is_qdq(node: Any) -> bool:
    """A QuantizeLinear or a DequantizeLinear (:func:`is_dequantize`)."""
    return node.op_type == "QuantizeLinear" or is_dequantize(node)


def dequantize_scale(node: Any, scale: np.ndarray) -> np.ndarray:
    """The float32 scale a Q/DQ node multiplies by, from its constant scale input: ``scale``
    itself, or ``2**(byte - 127)`` for the ``UINT8`` E8M0 exponents of a
    ``trt::TRT_MXFP8DequantizeLinear`` (byte 255: NaN).

    Example:
        >>> from onnx import helper
        >>> mx = helper.make_node("TRT_MXFP8DequantizeLinear", ["w", "s"], ["y"], domain="trt")
        >>> dequantize_scale(mx, np.array([127, 0, 255], np.uint8)).tolist()[:2]
        [1.0, 5.877471754111438e-39]
    """
    value = np.asarray(scale)
    if node.domain == "trt" and node.op_type in TRT_DEQUANTIZE and value.dtype == np.uint8:
        exp = np.minimum(value.astype(np.int32), 254) - _E8M0_BIAS
        return np.where(value == 255, np.float32(np.nan), np.ldexp(np.float32(1.0), exp))
    return value.astype(np.float32)


def is_quantized(precision: str | None) -> bool:
    """Whether a precision (predicted or read from an engine report) is a quantized format."""
    return precision in QUANTIZED


def qdq_format(
    node: Any,
    const: Mapping[str, np.ndarray],
    producer: Mapping[str, Any],
    consumers: Mapping[str, list[Any]] | None = None,
) -> str:
    """The format of a QuantizeLinear's output or of the tensor a DequantizeLinear reads.

    The zero point's type decides (``FLOAT8E4M3FN`` is FP8); a DequantizeLinear without one takes
    the type of what it reads: a pre-quantized initializer, or the output of the QuantizeLinear
    before it (ModelOpt writes FP8 DequantizeLinear nodes without a zero point). A block format
    (:func:`block_format`) comes first; with ``consumers`` a DequantizeLinear computing another
    one's scale (NVFP4's E4M3 block scales) takes that reader's format.
    """
    block = block_format(node, const, producer, consumers)
    if block:
        return block
    seen = 0
    while node is not None and seen < 8:
        seen += 1
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        if zp in const:
            return dtype_format(const[zp].dtype.name)
        if not is_dequantize(node):
            return INT8
        src = node.input[0]
        if src in const:
            return dtype_format(const[src].dtype.name)
        node = producer.get(src)
        if node is not None and node.op_type != "QuantizeLinear":
            return INT8
    return INT8


def block_format(
    node: Any,
    const: Mapping[str, np.ndarray],
    producer: Mapping[str, Any],
    consumers: Mapping[str, list[Any]] | None = None,
) -> str:
    """The block format (:data:`BLOCK_FORMATS`) of a Q/DQ or dynamic quantize node, or ``''``.

    A dynamic quantize node and the DequantizeLinear nodes reading it are in its format; a
    DequantizeLinear of an ``FLOAT4E2M1`` or ``INT4`` initializer is NVFP4 or INT4 weight-only,
    one with ``FLOAT8E8M0`` scales MXFP8, a ``trt::TRT_MXFP8DequantizeLinear`` MXFP8; with
    ``consumers``, a DequantizeLinear whose output is only the scale of block-format
    DequantizeLinear nodes is in their format.

    Example:
        >>> from onnx import helper
        >>> dq = helper.make_node("DequantizeLinear", ["x4", "s"], ["y"], block_size=16)
        >>> dyn = helper.make_node("TRT_FP4DynamicQuantize", ["x", "g"], ["x4", "s8"], domain="trt")
        >>> block_format(dq, {}, {"x4": dyn})
        'nvfp4'
    """
    if node.domain == "trt" and node.op_type in DYNAMIC_QUANTIZE:
        return DYNAMIC_QUANTIZE[node.op_type]
    if node.domain == "trt" and node.op_type in TRT_DEQUANTIZE:
        return TRT_DEQUANTIZE[node.op_type]
    if not is_dequantize(node) or not node.input:
        return ""
    src = producer.get(node.input[0])
    if src is not None and src.domain == "trt" and src.op_type in DYNAMIC_QUANTIZE:
        return DYNAMIC_QUANTIZE[src.op_type]
    value = const.get(node.input[0])
    found = _DTYPE_FORMATS.get(value.dtype.name, "") if value is not None else ""
    if found in BLOCK_FORMATS:
        return found
    scale = const.get(node.input[1]) if len(node.input) > 1 else None
    if scale is not None and scale.dtype.name == "float8_e8m0fnu":
        return MXFP8
    readers = consumers.get(node.output[0], []) if consumers is not None and node.output else []
    if readers and all(
        is_dequantize(r) and list(r.input[1:2]) == [node.output[0]] for r in readers
    ):
        formats = {block_format(r, const, producer) for r in readers}
        if len(formats) == 1 and (fmt := formats.pop()):
            return fmt
    return ""


def block_attrs(node: Any) -> tuple[int, int]:
    """``(axis, block_size)`` of a DequantizeLinear or dynamic quantize node (``block_size`` 0:
    not blocked; ``axis`` defaults to 1 for ONNX's DequantizeLinear, -1 for TensorRT's block
    operators, as ModelOpt's exporters default it)."""
    attrs = {a.name: a.i for a in node.attribute if a.name in ("axis", "block_size")}
    default = -1 if node.op_type in DYNAMIC_QUANTIZE or node.op_type in TRT_DEQUANTIZE else 1
    return attrs.get("axis", default), attrs.get("block_size", 0)
