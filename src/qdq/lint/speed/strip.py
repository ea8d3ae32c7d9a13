"""The same ONNX model without its Quantize/Dequantize nodes: what the user would build FP16.

Each QuantizeLinear -> DequantizeLinear pair is bypassed (its readers read the float tensor the
Quantize read); a DequantizeLinear of a stored quantized constant (pre-quantized weights) becomes a
float initializer of its output's name holding the dequantized values. The linter's predictor on
the result with ``float_dtype="fp16"`` is the FP16 build of the same structure.

The block formats (issue 60) strip the same way: TensorRT's dynamic block quantize
(``trt::TRT_FP4DynamicQuantize``, ``trt::TRT_MXFP8DynamicQuantize``) is a Quantize whose values
and block scales its DequantizeLinear reads, and a blocked DequantizeLinear (``block_size``) of a
constant, its scale itself a DequantizeLinear of constants (NVFP4's two levels), dequantizes
block by block. TensorRT's own DequantizeLinear forms (:func:`qdq.lint.formats.is_dequantize`)
count as DequantizeLinear.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qdq.lint.formats import DYNAMIC_QUANTIZE, is_dequantize
from qdq.lint.graph import LintGraph

__all__ = ["strip_qdq"]


def strip_qdq(proto: Any) -> Any:
    """``proto`` without its Q/DQ: each Quantize -> Dequantize pair bypassed (its readers read
    the float tensor the Quantize read), each Dequantize of a stored quantized constant replaced
    by a float initializer of the same name holding the dequantized values. A Dequantize of a
    quantized network input and a Quantize read by other nodes than Dequantize stay.

    Example:
        >>> import onnx  # doctest: +SKIP
        >>> float_model = strip_qdq(onnx.load("model_qdq.onnx"))  # doctest: +SKIP
    """
    import onnx
    from onnx import numpy_helper

    g = LintGraph(proto)
    rename: dict[str, str] = {}
    dropped: set[int] = set()
    new_inits: list[Any] = []
    values: dict[str, np.ndarray | None] = {}
    for n in g.nodes:
        if not is_dequantize(n) or not n.input or not n.output[0]:
            continue
        q = g.producer.get(n.input[0])
        if q is not None and _is_quantize(q) and q.input:
            if n.input[0] == q.output[0]:  # the values: its readers read the float input
                rename[n.output[0]] = q.input[0]
            dropped.add(id(n))  # (a dynamic quantize's block scales: read by the values' DQ)
        elif g.is_const(n.input[0]):
            value = _value(g, n.output[0], values)
            if value is not None:
                new_inits.append(numpy_helper.from_array(value, n.output[0]))
                dropped.add(id(n))
    for _ in range(len(g.nodes)):  # quantizers and scale dequantizers read only by dropped nodes
        more = False
        for n in g.nodes:
            if id(n) in dropped or not (_is_quantize(n) or is_dequantize(n)):
                continue
            outs = [o for o in n.output if o]
            readers = [r for o in outs for r in g.consumers.get(o, [])]
            if readers and not set(outs) & g.outputs and all(id(r) in dropped for r in readers):
                dropped.add(id(n))
                more = True
        if not more:
            break

    def final(t: str) -> str:
        for _ in range(len(rename) + 1):
            if t not in rename:
                break
            t = rename[t]
        return t

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    kept = []
    for n in g.nodes:
        if id(n) in dropped:
            continue
        node = onnx.NodeProto()
        node.CopyFrom(n)
        for k, t in enumerate(node.input):
            node.input[k] = final(t)
        kept.append(node)
    for o in graph.output:  # a graph output that was a dropped Dequantize's: an Identity
        if o.name in rename:
            kept.append(onnx.helper.make_node("Identity", [final(o.name)], [o.name]))
    del graph.node[:]
    graph.node.extend(kept)
    used = {t for n in kept for t in n.input} | {o.name for o in graph.output}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    graph.initializer.extend(t for t in new_inits if t.name in used)
    names = {t.name for t in graph.initializer}
    data_inputs = [i for i in graph.input if i.name in used or i.name not in names]
    del graph.input[:]
    graph.input.extend(data_inputs)
    del graph.value_info[:]
    return out


def _is_quantize(node: Any) -> bool:
    """A QuantizeLinear, or TensorRT's dynamic block quantize (values, block scales)."""
    return node.op_type == "QuantizeLinear" or (
        node.domain == "trt" and node.op_type in DYNAMIC_QUANTIZE
    )


def _value(g: LintGraph, tensor: str, memo: dict[str, np.ndarray | None]) -> np.ndarray | None:
    """The float values of ``tensor``: a stored constant, or a DequantizeLinear of values whose
    scale (and zero point) are themselves computable; ``None`` when they are not."""
    if tensor in memo:
        return memo[tensor]
    memo[tensor] = None  # (a cycle)
    found: np.ndarray | None = None
    if tensor in g.const:
        found = np.asarray(g.const[tensor])
    else:
        dq = g.producer.get(tensor)
        if dq is not None and is_dequantize(dq) and len(dq.input) > 1 and dq.input[0] in g.const:
            scale = _value(g, dq.input[1], memo)
            zero = None
            if len(dq.input) > 2 and dq.input[2]:
                zero = _value(g, dq.input[2], memo)
                if zero is None:
                    scale = None
            if scale is not None:
                found = _dequantize(dq, np.asarray(g.const[dq.input[0]]), scale, zero)
    memo[tensor] = found
    return found


def _dequantize(
    dq: Any, x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None
) -> np.ndarray | None:
    """The float values of a DequantizeLinear of the constant ``x``: per tensor, per channel
    along ``axis``, or per block of ``block_size`` along it; ``None`` when the scale does not fit
    (a mismatched axis is left in place)."""
    attrs = {a.name: a.i for a in dq.attribute if a.name in ("axis", "block_size")}
    block = int(attrs.get("block_size", 0))
    values = x.astype(np.float32)
    out_type = scale.dtype if scale.dtype.kind == "f" and scale.dtype.itemsize >= 2 else np.float32
    scale = scale.astype(np.float32)
    zp = np.zeros_like(scale) if zero is None else zero.astype(np.float32)
    if not values.ndim:
        return ((values - zp) * scale).astype(out_type) if scale.size == 1 else None
    axis = int(attrs.get("axis", 1)) % values.ndim
    try:
        if block > 0:  # ONNX's block_size: one scale per block of ``block`` along ``axis``
            if scale.shape[axis] * block < values.shape[axis]:
                return None
            scale = np.repeat(scale, block, axis=axis).take(range(values.shape[axis]), axis=axis)
            zp = np.repeat(zp, block, axis=axis).take(range(values.shape[axis]), axis=axis)
        elif scale.ndim == 1 and scale.size > 1:
            shape = [1] * values.ndim
            shape[axis] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return ((values - zp) * scale).astype(out_type)
    except ValueError:
        return None
