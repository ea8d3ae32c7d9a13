"""Attention in a Q/DQ ONNX graph: ``MatMul → [scale, mask, layout] → Softmax → Q/DQ → [layout] →
MatMul``, the probabilities either operand of the second product.

TensorRT fuses the two batched products and the softmax between them into one MHA kernel. With
Q/DQ on both operands of both products (the scaled query and the key, the probabilities and the
value; rule P16) the kernel runs INT8 and the Quantize/Dequantize on the probabilities are
internal to it; anything less leaves the MatMuls in FP16 (rule P14). With FP8 Q/DQ on all of them
(ModelOpt quantizes the probabilities at the fixed scale 1/448) it is TensorRT's FP8 MHA; operands
in different formats do not fuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qdq.lint.formats import INT8, is_dequantize
from qdq.lint.graph import COPY_OPS, LintGraph

__all__ = ["Attention", "attention_cores", "find_attention"]

#: ops between the first product and the softmax (attention scale, additive or boolean mask)
_BETWEEN = COPY_OPS | {"Mul", "Div", "Add", "Where"}


@dataclass(frozen=True)
class Attention:
    """One fully quantized attention core.

    Attributes:
        scores: the first MatMul (``q @ kᵀ``).
        context: the second MatMul (``probs @ v``).
        members: every node of the fused kernel, in graph order of discovery: ``scores``, the ops
            up to the softmax, the softmax, the probabilities' Quantize and Dequantize, the layout
            ops after it (a transpose), ``context``.
        fmt: the format of every operand (``"int8"`` or ``"fp8"``).
    """

    scores: Any
    context: Any
    members: tuple[Any, ...]
    fmt: str = INT8


def attention_cores(g: LintGraph) -> list[Attention]:
    """:func:`find_attention` of ``g``, found once per graph (every rule that asks shares it)."""
    cores: list[Attention] | None = g.derived.get("attention")
    if cores is None:
        cores = g.derived["attention"] = find_attention(g)
    return cores


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
    # the quantized probabilities may be a transpose of the softmax output (ultralytics'
    # ``v @ probs.transpose(-2, -1)``: the Q sits on the second product's operand)
    probs, before = _through_layout(g, members[-1].output[0])
    quantizers = [c for c in g.consumers.get(probs, []) if c.op_type == "QuantizeLinear"]
    if len(quantizers) != 1 or g.float_uses(probs):
        return None
    (q,) = quantizers
    dqs = [c for c in g.consumers.get(q.output[0], []) if is_dequantize(c)]
    if len(dqs) != 1:
        return None
    (dq,) = dqs
    tensor, after = _through_layout(g, dq.output[0])
    readers = g.consumers.get(tensor, [])
    if len(readers) != 1:
        return None
    (node,) = readers
    if node.op_type != "MatMul" or g.weighted(node) or not _int8_operands(g, node):
        return None
    operands = [g.qinput(i) for m in (scores, node) for i in m.input]
    formats = {o.fmt for o in operands if o is not None} | {g.qdq_format(q)}
    if len(formats) != 1:
        return None  # operands in different formats: no fused kernel
    return Attention(scores, node, (*members, *before, q, dq, *after, node), formats.pop())


def _through_layout(g: LintGraph, tensor: str) -> tuple[str, list[Any]]:
    """Follow ``tensor`` through a chain of single-reader layout ops: the last tensor and the ops."""
    ops: list[Any] = []
    while True:
        readers = [c for c in g.consumers.get(tensor, []) if c.op_type != "Shape"]
        if len(readers) != 1 or readers[0].op_type not in COPY_OPS:
            return tensor, ops
        ops.append(readers[0])
        tensor = readers[0].output[0]
