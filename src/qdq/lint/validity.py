"""Validity rules V01–V12 and L01: what the TensorRT ONNX parser rejects or silently misreads,
and a model with no Q/DQ at all.

Each check reads only the ONNX graph (no GPU). Rule texts and sources are in
``reference/tensorrt-qdq-rules.md`` §1.1.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from qdq.lint.findings import ERROR, INFO, WARN, Finding
from qdq.lint.formats import (
    DYNAMIC_QUANTIZE,
    FORMATS,
    FP8,
    INT8,
    block_attrs,
    dequantize_scale,
    dtype_format,
    is_dequantize,
    is_qdq,
    qdq_format,
)
from qdq.lint.guard import Guard
from qdq.lint.target import Target, parse_target

__all__ = ["check_validity"]

QOPERATOR_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
        "QLinearAdd",
        "QLinearConcat",
        "QLinearMul",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QGemm",
    }
)
_THROUGH_CONST = frozenset(
    {"Transpose", "Reshape", "Cast", "Identity", "QuantizeLinear", "Unsqueeze"}
)
_SRC = "reference/tensorrt-qdq-rules.md §1.1"


class _Graph:
    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.target: Target = parse_target("trt10")
        self.graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.inits = {i.name: i for i in model.graph.initializer}
        self.const: dict[str, np.ndarray] = {
            name: numpy_helper.to_array(t) for name, t in self.inits.items()
        }
        for n in model.graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.const[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producers = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for n in model.graph.node:
            for i in n.input:
                self.consumers[i].append(n)

    def rooted_at_constant(self, tensor: str) -> bool:
        node = self.producers.get(tensor)
        while node is not None and node.op_type in _THROUGH_CONST:
            tensor = node.input[0]
            node = self.producers.get(tensor)
        return tensor in self.const

    def const_dims(self, tensor: str) -> tuple[int, ...] | None:
        node = self.producers.get(tensor)
        while node is not None and node.op_type in ("Cast", "Identity", "QuantizeLinear"):
            tensor = node.input[0]
            node = self.producers.get(tensor)
        value = self.const.get(tensor)
        return None if value is None else tuple(value.shape)


def check_validity(
    model: Any, target: str | Target = "trt10", guard: Guard | None = None
) -> list[Finding]:
    """Run V01–V12 and L01 on an ``onnx.ModelProto`` for a TensorRT ``target``.

    Args:
        model: the ONNX model.
        target: the TensorRT target.
        guard: records a check that fails on a node as an ``L00`` finding (in ``guard.findings``)
            and goes on; without one the exception propagates.

    Returns:
        The findings, in graph order.
    """
    guard = guard or Guard(strict=True)
    g = _Graph(model)
    g.target = parse_target(target)
    out: list[Finding] = []
    has_qdq = qoperator = False
    for node in g.graph.node:
        if node.op_type in QOPERATOR_OPS:
            qoperator = True
            out.append(
                Finding(
                    "V08",
                    ERROR,
                    (node.name,),
                    f"{node.name}: operator-oriented quantized op {node.op_type} is not "
                    "supported by TensorRT",
                    "import error",
                    "export in QDQ format (ORT quant_format=QuantFormat.QDQ)",
                    _SRC,
                )
            )
            continue
        if is_qdq(node):
            has_qdq = True
            name = node.name or (node.output[0] if node.output else node.op_type)
            out.extend(
                guard.call("validity rules on Q/DQ", (name,), _check_qdq, g, node, default=[])
            )
    if not has_qdq and not qoperator:
        out.append(_not_quantized(g))
    out.extend(guard.call("validity rule V07 (formats)", (), _format_opsets, g, default=[]))
    if has_qdq and g.opset and g.opset < 10:
        out.append(
            Finding(
                "V07",
                ERROR,
                (),
                f"model opset {g.opset}: Q/DQ needs opset >= 10",
                "parse failure",
                "export with opset >= 13",
                _SRC,
            )
        )
    top = g.target.max_opset
    if top is not None and g.opset > top:
        out.append(
            Finding(
                "V07",
                ERROR,
                (),
                f"model opset {g.opset}: the {g.target.label} ONNX parser reads opsets <= {top}",
                "parse failure on unsupported operator versions",
                f"export with opset <= {top} (qdq.export_onnx(..., opset={min(top, 17)}))",
                _SRC,
            )
        )
    v10: list[Finding] = guard.call("validity rule V10", (), _prequantized_weights, g, default=[])
    return out + v10


def _not_quantized(g: _Graph) -> Finding:
    """L01: no QuantizeLinear/DequantizeLinear at all (and no QOperator op, which V08 reports)."""
    return Finding(
        "L01",
        ERROR,
        (),
        f"the model is not quantized: none of its {len(g.graph.node)} nodes is a "
        "QuantizeLinear or DequantizeLinear",
        "TensorRT builds it in FP32/FP16 only; no layer runs INT8",
        "lint the Q/DQ export (qdq.prepare -> qdq.calibrate -> qdq.export_onnx), not the float ONNX",
        "qdq.lint",
    )


def _format_opsets(g: _Graph) -> list[Finding]:
    """V07: Q/DQ of a format the model's opset cannot type (FP8 needs opset 19). Not the block
    formats: TensorRT's parser reads their ``block_size`` and 4-bit types at any opset, and
    ModelOpt exports NVFP4 at opset 17 (``tests/gpu/torch/quantization/test_nvfp4_onnx_export.py``)."""
    out: list[Finding] = []
    if not g.opset:
        return out
    for fmt in (FP8,):
        need = FORMATS[fmt].min_opset
        nodes = [
            n.name or n.output[0]
            for n in g.graph.node
            if is_qdq(n) and qdq_format(n, g.const, g.producers, g.consumers) == fmt
        ]
        if nodes and g.opset < need:
            label = FORMATS[fmt].label
            out.append(
                Finding(
                    "V07",
                    ERROR,
                    tuple(nodes[:10]),
                    f"model opset {g.opset}: {len(nodes)} {label} Q/DQ node(s) "
                    f"({', '.join(nodes[:3])}) need opset >= {need}",
                    f"parse failure: QuantizeLinear/DequantizeLinear take {label} from opset {need}",
                    f"export with opset >= {need} (qdq.export_onnx(..., opset={need}))",
                    f"{_SRC}; ONNX QuantizeLinear-{need}",
                )
            )
    return out


def _prequantized_weights(g: _Graph) -> list[Finding]:
    """V10: INT8 or FP8 weight initializers read by DequantizeLinear alone ("DQ-only" weights)."""
    found = [
        (n.name or n.output[0], dtype_format(g.const[n.input[0]].dtype.name))
        for n in g.graph.node
        if is_dequantize(n)
        and n.input[0] in g.const
        and g.const[n.input[0]].dtype.name in ("int8", "float8_e4m3fn")
        and qdq_format(n, g.const, g.producers, g.consumers) in (INT8, FP8)  # (not MXFP8/NVFP4)
    ]
    if not found:
        return []
    names = [name for name, _ in found]
    labels = "/".join(FORMATS[f].label for f in (INT8, FP8) if f in {fmt for _, fmt in found})
    old = not g.target.at_least(10)
    return [
        Finding(
            "V10",
            ERROR if old else INFO,
            tuple(names[:10]),
            f"{len(names)} DequantizeLinear node(s) read pre-quantized {labels} weights"
            + (f"; {g.target.label} expects FP32 weights with Q -> DQ" if old else ""),
            "parse or build failure" if old else "supported on TensorRT >= 10",
            "export FP32 weights with QuantizeLinear -> DequantizeLinear" if old else "",
            _SRC,
        )
    ]


def _check_qdq(g: _Graph, node: Any) -> list[Finding]:
    out: list[Finding] = []
    name = node.name or node.output[0]
    scale = g.const.get(node.input[1]) if len(node.input) > 1 else None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    zp = g.const.get(zp_name) if zp_name else None
    # a block format's scale may be computed: NVFP4's E4M3 block scales dequantized by a per-tensor
    # scale, or the scales a dynamic block quantizer writes (TensorRT builds both)
    made_by = g.producers.get(node.input[1]) if len(node.input) > 1 else None
    computed = made_by is not None and (
        is_dequantize(made_by) or made_by.op_type in DYNAMIC_QUANTIZE
    )
    if (scale is None and not computed) or (zp_name and zp is None):
        out.append(
            Finding(
                "V09",
                ERROR,
                (name,),
                f"{name}: scale/zero point are not constants",
                "parse failure ('Dynamic shape for scale tensor is not supported')",
                "make scale and zero point initializers",
                _SRC,
            )
        )
    if node.op_type == "QuantizeLinear" and not zp_name:
        out.append(
            Finding(
                "V02",
                ERROR,
                (name,),
                f"{name}: no zero point, so QuantizeLinear outputs UINT8",
                "rejected by the parser",
                "write an explicit int8 zero point 0",
                _SRC,
            )
        )
    if zp is not None:
        if zp.dtype.name == "float8_e5m2":
            out.append(
                Finding(
                    "V02",
                    ERROR,
                    (name,),
                    f"{name}: FP8 E5M2 quantization is not supported by TensorRT",
                    "rejected: TensorRT's FP8 type is E4M3 (FP8E4M3)",
                    "quantize to FLOAT8E4M3FN (scale = amax / 448)",
                    "TensorRT 'Working with Quantized Types' (INT8, INT4, FP8E4M3, FP4E2M1)",
                )
            )
        if zp.dtype == np.uint8:
            out.append(
                Finding(
                    "V02",
                    ERROR,
                    (name,),
                    f"{name}: UINT8 quantization is not supported by TensorRT",
                    "rejected by the parser",
                    "use INT8 symmetric quantization",
                    _SRC,
                )
            )
        if np.any(zp.astype(np.float32) != 0):
            number = int if zp.dtype.kind in "iu" else float
            vals = sorted({number(v) for v in np.unique(zp.astype(np.float64))})[:4]
            label = FORMATS[dtype_format(zp.dtype.name)].label
            out.append(
                Finding(
                    "V01",
                    ERROR,
                    (name,),
                    f"{name}: zero_point != 0 ({vals}); TensorRT supports symmetric {label} only",
                    "parse error",
                    "re-export with ActivationSymmetric=True, WeightSymmetric=True",
                    _SRC,
                )
            )
    if scale is not None:
        scale = dequantize_scale(node, scale)  # (E8M0 scales, UINT8 exponents, compare as float)
        bad = int(np.sum(~(scale > 0)))  # catches <= 0 and NaN
        if scale.size == 0 or bad:
            out.append(
                Finding(
                    "V03",
                    ERROR,
                    (name,),
                    f"{name}: scale has {bad if scale.size else 'no'} non-positive/NaN "
                    f"entries (min={float(np.nanmin(scale)) if scale.size else 'n/a'})",
                    "'Scale coefficients must all be positive'",
                    "floor scales at a positive epsilon (dead channels)",
                    _SRC,
                )
            )
    if is_dequantize(node):
        src = g.const.get(node.input[0])
        if src is not None and src.dtype == np.int32:
            out.append(
                Finding(
                    "V06",
                    ERROR,
                    (name,),
                    f"{name}: INT32 bias DequantizeLinear is not supported",
                    "import failure",
                    "keep the bias in float (QuantizeBias=False)",
                    _SRC,
                )
            )
    if scale is not None and scale.size > 1 and not block_attrs(node)[1]:
        out.extend(_check_per_channel(g, node, name, scale))  # (blocked: rules M03/M04)
    return out


def _check_per_channel(g: _Graph, node: Any, name: str, scale: np.ndarray) -> list[Finding]:
    out: list[Finding] = []
    attrs = {a.name: a.i for a in node.attribute if a.name == "axis"}
    axis = attrs.get("axis", 1)
    if g.opset and g.opset < 13:
        out.append(
            Finding(
                "V07",
                ERROR,
                (name,),
                f"{name}: per-channel Q/DQ requires opset >= 13 (model opset {g.opset})",
                "parse failure or silently per-tensor",
                "export with opset >= 13",
                _SRC,
            )
        )
    if not g.rooted_at_constant(node.input[0]):
        out.append(
            Finding(
                "V05",
                ERROR,
                (name,),
                f"{name}: per-channel Q/DQ on activation tensor {node.input[0]}; "
                "TensorRT requires per-tensor activation scales",
                "unsupported",
                "quantize activations per tensor",
                _SRC,
            )
        )
        return out
    dims = g.const_dims(node.input[0])
    if dims is not None and -len(dims) <= axis < len(dims) and dims[axis] != scale.size:
        out.append(
            Finding(
                "V04",
                ERROR,
                (name,),
                f"{name}: {scale.size} scales for {dims[axis]} channels on axis {axis}",
                "'The number of scales is not equal to the number of output channels'",
                "one scale per output channel",
                _SRC,
            )
        )
    if is_dequantize(node):
        for consumer in g.consumers.get(node.output[0], []):
            out.extend(_check_weight_axis(g, consumer, node, name, axis))
    return out


def _check_weight_axis(g: _Graph, consumer: Any, dq: Any, name: str, axis: int) -> list[Finding]:
    if len(consumer.input) < 2 or consumer.input[1] != dq.output[0]:
        return []
    attrs = {a.name: a for a in consumer.attribute}
    if consumer.op_type == "ConvTranspose":
        group = attrs["group"].i if "group" in attrs else 1
        grouped = (
            " (grouped: one axis cannot express per-output-channel scales)" if group > 1 else ""
        )
        new = g.target.at_least(10, 2)
        if new:
            why = "TensorRT >= 10.2 tooling quantizes ConvTranspose weights on axis 1"
        else:
            why = f"{g.target.label} kernels expect per-input-channel scales (axis 0)"
        dims = g.const_dims(dq.input[0])
        likely_ok = new and group == 1 and dims is not None and axis % len(dims) == 1
        return [
            Finding(
                "V12",
                INFO if likely_ok else WARN,
                (name, consumer.name),
                f"{consumer.name}: per-channel ConvTranspose weights on axis {axis}{grouped}; "
                f"{why}",
                "verify on the GPU" if likely_ok else "possibly wrong results or FP fallback",
                "verify numerics with polygraphy, or use per-tensor weights",
                "NVIDIA/TensorRT#2380, #1694; pytorch-quantization 10.2 (axis 1)",
            )
        ]
    expected = None
    if consumer.op_type == "Conv":
        expected = 0
    elif consumer.op_type == "Gemm":
        expected = 0 if ("transB" in attrs and attrs["transB"].i == 1) else 1
    elif consumer.op_type == "MatMul":
        dims = g.const_dims(dq.input[0])
        expected = (len(dims) - 1) if dims else None
    dims = g.const_dims(dq.input[0])
    if expected is None or dims is None:
        return []
    if axis % len(dims) != expected:
        return [
            Finding(
                "V04b",
                WARN,
                (name, consumer.name),
                f"{consumer.name}: weight quantized on axis {axis}, but its output-channel "
                f"axis is {expected}",
                "numerically different from the intent",
                f"quantize the weight per output channel (axis {expected})",
                _SRC,
            )
        ]
    return []
