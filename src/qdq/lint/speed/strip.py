"""The same ONNX model without its Quantize/Dequantize nodes: what the user would build FP16.

Each QuantizeLinear -> DequantizeLinear pair is bypassed (its readers read the float tensor the
Quantize read); a DequantizeLinear of a stored quantized constant (pre-quantized weights) becomes a
float initializer of its output's name holding the dequantized values. The linter's predictor on
the result with ``float_dtype="fp16"`` is the FP16 build of the same structure.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    for n in g.nodes:
        if n.op_type != "DequantizeLinear" or not n.input or not n.output[0]:
            continue
        q = g.producer.get(n.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input:
            rename[n.output[0]] = q.input[0]
            dropped.add(id(n))
        elif n.input[0] in g.const:
            value = _dequantize(g, n)
            if value is not None:
                new_inits.append(numpy_helper.from_array(value, n.output[0]))
                dropped.add(id(n))
    for n in g.nodes:  # a Quantize read only by dropped Dequantize nodes goes too
        if n.op_type == "QuantizeLinear" and n.output and n.output[0] not in g.outputs:
            readers = g.consumers.get(n.output[0], [])
            if readers and all(id(r) in dropped for r in readers):
                dropped.add(id(n))

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


def _dequantize(g: LintGraph, dq: Any) -> np.ndarray | None:
    """The float values of a DequantizeLinear of a constant, or ``None`` when they cannot be
    computed (a missing scale)."""
    x = np.asarray(g.const[dq.input[0]])
    scale = g.const.get(dq.input[1]) if len(dq.input) > 1 else None
    if scale is None:
        return None
    zero = g.const.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    scale = np.asarray(scale)
    axis = next((int(a.i) for a in dq.attribute if a.name == "axis"), 1)
    values = x.astype(np.float32)
    zp = np.zeros_like(scale, np.float32) if zero is None else np.asarray(zero).astype(np.float32)
    try:  # a blocked scale (opset 21 block_size) or a mismatched axis is left in place
        if scale.ndim == 1 and scale.size > 1 and values.ndim:
            shape = [1] * values.ndim
            shape[axis % values.ndim] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return ((values - zp) * scale.astype(np.float32)).astype(scale.dtype)
    except ValueError:
        return None
