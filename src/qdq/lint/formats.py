"""The quantized formats the linter predicts, as data: INT8 and FP8 (E4M3FN).

A Q/DQ pair is FP8 when its quantized tensor is ``FLOAT8E4M3FN``: the QuantizeLinear's zero point
(its third input) has that type, or a DequantizeLinear reads an FP8 initializer (ModelOpt's
``dq_only`` weights, an ``FLOAT8E4M3FN`` tensor with only a DequantizeLinear and no zero point).
Everything else is read as INT8, as the linter always has (a zero point of another type is a
validity finding, V02). Each rule that differs between the formats reads its row of
:data:`FORMATS` instead of testing the format by name.

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
    "FORMATS",
    "FP8",
    "INT8",
    "QUANTIZED",
    "QuantFormat",
    "dtype_format",
    "is_quantized",
    "qdq_format",
]

INT8, FP8 = "int8", "fp8"


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
    """

    name: str
    label: str
    min_opset: int
    compute_capability: tuple[int, int] | None
    build_flag: str
    plain_layers: bool
    per_channel_conv: bool
    source: str


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
}  # fmt: skip
QUANTIZED = frozenset(FORMATS)

#: numpy dtype names of quantized tensors (as ``onnx.numpy_helper`` returns them) -> format
_DTYPE_FORMATS = {"int8": INT8, "float8_e4m3fn": FP8}


def dtype_format(dtype_name: str) -> str:
    """The format of a quantized tensor of numpy dtype ``dtype_name`` (INT8 unless FP8 E4M3FN)."""
    return _DTYPE_FORMATS.get(dtype_name, INT8)


def is_quantized(precision: str | None) -> bool:
    """Whether a precision (predicted or read from an engine report) is a quantized format."""
    return precision in QUANTIZED


def qdq_format(node: Any, const: Mapping[str, np.ndarray], producer: Mapping[str, Any]) -> str:
    """The format of a QuantizeLinear's output or of the tensor a DequantizeLinear reads.

    The zero point's type decides (``FLOAT8E4M3FN`` is FP8); a DequantizeLinear without one takes
    the type of what it reads: a pre-quantized initializer, or the output of the QuantizeLinear
    before it (ModelOpt writes FP8 DequantizeLinear nodes without a zero point).
    """
    seen = 0
    while node is not None and seen < 8:
        seen += 1
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        if zp in const:
            return dtype_format(const[zp].dtype.name)
        if node.op_type != "DequantizeLinear":
            return INT8
        src = node.input[0]
        if src in const:
            return dtype_format(const[src].dtype.name)
        node = producer.get(src)
        if node is not None and node.op_type != "QuantizeLinear":
            return INT8
    return INT8
