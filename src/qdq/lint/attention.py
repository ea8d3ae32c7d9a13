"""Attention in a Q/DQ ONNX graph: ``MatMul → [scale, mask, layout] → Softmax → Q/DQ → MatMul``.

TensorRT fuses the two batched products and the softmax between them into one MHA kernel. With
Q/DQ on both operands of both products (the scaled query and the key, the probabilities and the
value; rule P16) the kernel runs INT8 and the Quantize/Dequantize on the probabilities are
internal to it; anything less leaves the MatMuls in FP16 (rule P14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qdq.lint.graph import COPY_OPS, LintGraph

__all__ = ["Attention", "find_attention"]

#: ops between the first product and the softmax (attention scale, additive or boolean mask)
_BETWEEN = COPY_OPS | {"Mul", "Div", "Add", "Where"}


@dataclass(frozen=True)
class Attention:
    """One fully quantized attention core.

    Attributes:
        scores: the first MatMul (``q @ kᵀ``).
        context: the second MatMul (``probs @ v``).
        members: every node of the fused kernel, in graph order of discovery: ``scores``, the ops
            up to the softmax, the softmax, the probabilities' Quantize and Dequantize, ``context``.
    """

    scores: Any
    context: Any
    members: tuple[Any, ...]


def find_attention(g: LintGraph) -> list[Attention]:
    """Every attention core whose two products read both operands through Q/DQ."""
    out = []
    for node in g.nodes:
        if node.op_type == "MatMul" and not g.weighted(node) and _int8_operands(g, node):
            found = _from_scores(g, node)
            if found is not None:
                out.append(found)
    return out


def _int8_operands(g: LintGraph, node: Any) -> bool:
    return len(node.input) == 2 and all(g.qinput(i) is not None for i in node.input)


def _from_scores(g: LintGraph, scores: Any) -> Attention | None:
    members = [scores]
    tensor = scores.output[0]
    while True:
        readers = [c for c in g.float_uses(tensor) if c.op_type != "Shape"]
        if len(readers) != 1:
            return None
        (node,) = readers
        members.append(node)
        if node.op_type == "Softmax":
            break
        if node.op_type not in _BETWEEN:
            return None
        tensor = node.output[0]
    probs = members[-1].output[0]
    quantizers = [c for c in g.consumers.get(probs, []) if c.op_type == "QuantizeLinear"]
    if len(quantizers) != 1 or g.float_uses(probs):
        return None
    (q,) = quantizers
    dqs = [c for c in g.consumers.get(q.output[0], []) if c.op_type == "DequantizeLinear"]
    if len(dqs) != 1:
        return None
    (dq,) = dqs
    context = [c for c in g.consumers.get(dq.output[0], []) if c.op_type == "MatMul"]
    if len(context) != 1 or context[0].input[0] != dq.output[0]:
        return None
    if not _int8_operands(g, context[0]):
        return None
    return Attention(scores, context[0], (*members, q, dq, context[0]))
