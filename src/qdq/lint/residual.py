"""Residual-Add rules (P03a/b/c, P15): which operand of an Add TensorRT fuses into a conv epilogue,
and whether the other one arrives through Q/DQ (rule spec §1.2 P03; split from
:mod:`qdq.lint.placement`)."""

from __future__ import annotations

from typing import Any

from qdq.lint.findings import INFO, WARN, Finding
from qdq.lint.formats import FORMATS
from qdq.lint.graph import COPY_OPS, LintGraph

__all__ = ["both_conv_branches", "fusible", "is_residual", "residual_add"]

_SRC = "reference/tensorrt-qdq-rules.md §1.2-1.4"


def residual_add(g: LintGraph, node: Any) -> list[Finding]:
    """P03: exactly one operand should be read in float and be fusible into its conv (the conv
    branch); the other (the skip) should arrive through Q/DQ.

    An Add none of whose operands can be that conv branch (each is read by other layers too, as
    PP-OCR's ``x + x * se(x)``) is a PointWise layer, not a conv epilogue: no P03 finding (its
    precision is P05's and P04's business; qdq places it by rule P17)."""
    name = g.name(node)
    if not any(_conv_branch(g, i, node) for i in node.input):
        return []
    ops = []
    for i in node.input:
        qi = g.qinput(i)
        ops.append(
            (qi is not None, g.backbone(qi.source if qi is not None else i), fusible(g, i, node))
        )
    if not any(bb is not None and g.quantized_weighted(bb) for _, bb, _ in ops):
        return []
    fix = "quantize only the skip (non-conv) operand, sharing the scale of its other quantized uses"
    n_quantized = sum(q for q, _, _ in ops)
    if n_quantized == 2:
        return [
            Finding(
                "P03b",
                WARN,
                (name,),
                f"{name}: both inputs quantized",
                "conv fused alone; Add(+Relu) runs as a separate INT8 PointWise layer",
                fix,
                _SRC,
            )
        ]
    if n_quantized == 0 and _norm_reader(g, node) is not None:
        reader = _norm_reader(g, node)
        return [
            Finding(
                "P15",
                INFO,
                (name,),
                f"{name}: residual stream read in float by {g.name(reader)} ({reader.op_type}): "
                "the Add stays in the GEMM's float epilogue",
                "GEMM INT8 in, Add fused in FP16; the normalization reads it without a Dequantize",
                "none needed (pre-norm transformer block)",
                "qdq rule P15",
            )
        ]
    fmts = {g.weighted_format(bb) for _, bb, _ in ops if bb is not None}
    plain = all(FORMATS[f].plain_layers for f in fmts if f is not None)
    if n_quantized == 0 and not _output_int8(g, node, plain):
        return []  # the fused output stays float: a float skip is what TensorRT reads (P03d)
    if n_quantized == 0:
        return [
            Finding(
                "P03a",
                WARN,
                (name,),
                f"{name}: the skip input is not quantized",
                "conv+Add fused with FP16/FP32 output; the next Quantize runs standalone",
                fix,
                _SRC,
            )
        ]
    (float_fusible,) = [fusible for q, _, fusible in ops if not q]
    if not float_fusible:
        return [
            Finding(
                "P03c",
                WARN,
                (name,),
                f"{name}: the conv-branch input is quantized and the skip is float",
                "Add runs standalone in float with an unfused DQ",
                fix,
                _SRC,
            )
        ]
    return []


_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish"})


def _output_int8(g: LintGraph, add: Any, plain: bool = True) -> bool:
    """Whether the Add's fused output -- after its activation and copy ops, as TensorRT fuses
    them -- is, or could be, INT8: read through a QuantizeLinear, or only by readers that could
    run INT8 (:func:`~qdq.lint.versioned.can_read_int8`: a quantized GEMM behind a pool counts).
    When it cannot, the conv+Add fusion writes float and reads its residual in float too, so a
    float skip is right and P03a does not apply (its fix would cost a P03d reformat). For a
    layer in a format without pooling, pointwise or data-movement layers (FP8: ``plain`` false)
    only GEMM/convolution readers can read its output quantized."""
    from qdq.lint.versioned import can_read_int8, final_readers

    todo, seen = [add.output[0]], set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if plain and g.quantized_uses(tensor):
            return True
        readers, returned = final_readers(g, tensor)
        fused = [c for c in readers if c.op_type in _ACTIVATIONS]
        if fused:
            todo.extend(o for c in fused for o in c.output)
            continue
        if plain:
            if readers and not returned and all(can_read_int8(g, r) for r in readers):
                return True
        elif (  # FP8: every reader quantized, or a GEMM that could be
            not returned
            and (readers or g.quantized_uses(tensor))
            and all(g.weighted(r) for r in readers)
        ):
            return True
    return False


_NORMS = frozenset({"LayerNormalization", "GroupNormalization", "InstanceNormalization"})


def _norm_reader(g: LintGraph, add: Any) -> Any:
    """A normalization reading the Add's output or one of its operands, or a copy of them
    (through copy ops either way: the TorchScript exporter cancels ``permute(permute(y))``, so
    a channels-last LayerNorm may read the tensor the operand is a transpose of)."""
    stack, seen = [add.output[0], *add.input], set()
    for t in list(stack[1:]):
        node = g.producer.get(t)
        while node is not None and node.op_type in COPY_OPS and node.input:
            stack.append(node.input[0])
            node = g.producer.get(node.input[0])
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in g.consumers.get(t, []):
            if c.op_type in _NORMS or _norm_statistic(g, c, t):
                return c
            if c.op_type in COPY_OPS:
                stack.append(c.output[0])
    return None


def _norm_statistic(g: LintGraph, node: Any, tensor: str) -> bool:
    """Whether ``node`` starts a normalization written as arithmetic on ``tensor`` (what the
    exporters write for T5's and LLaMA's RMSNorm, ConvNeXt's channels-first LayerNorm): a
    ``Pow(tensor, 2)`` that a ``ReduceMean`` reads, or a ``ReduceMean(tensor)`` subtracted from
    ``tensor``. TensorRT runs it in float, as a LayerNormalization."""
    readers = g.consumers.get(node.output[0], []) if node.output else []
    if node.op_type == "Pow" and node.input[0] == tensor and len(node.input) > 1:
        exponent = g.const.get(node.input[1])
        squared = exponent is not None and exponent.size == 1 and float(exponent.ravel()[0]) == 2
        return squared and any(r.op_type == "ReduceMean" for r in readers)
    if node.op_type == "ReduceMean":
        return any(
            r.op_type == "Sub" and list(r.input) == [tensor, node.output[0]] for r in readers
        )
    return False


def _conv_branch(g: LintGraph, tensor: str, add: Any) -> bool:
    """``tensor`` (or the tensor it quantizes) ends an INT8 conv's epilogue and is read by
    nothing but ``add``, in float or through Q/DQ: TensorRT could fuse ``add`` into that conv."""
    source = q.source if (q := g.qinput(tensor)) is not None else tensor
    bb = g.backbone(source)
    if bb is None or not g.quantized_weighted(bb):
        return False
    readers = [*g.float_uses(source), *(c for _, c, _ in g.quantized_uses(source))]
    return all(c is add for c in readers)


def both_conv_branches(g: LintGraph, add: Any) -> bool:
    """Both operands of a residual Add are conv branches read by nothing else (a downsample
    block), rather than a conv branch and an identity skip."""
    sources = [(q.source if (q := g.qinput(i)) is not None else i) for i in add.input]
    return all(
        g.backbone(t) is not None
        and all(c is add for c in [*g.float_uses(t), *(c for _, c, _ in g.quantized_uses(t))])
        for t in sources
    )


def fusible(g: LintGraph, tensor: str, add: Any) -> bool:
    """``tensor`` can be the conv branch TensorRT fuses ``add`` into: it comes out of a conv
    epilogue and nothing but ``add`` reads it."""
    if g.backbone(tensor) is None:
        return False
    return [c for c in g.consumers.get(tensor, []) if c.op_type != "Shape"] == [add]


def is_residual(g: LintGraph, node: Any) -> bool:
    return len(node.input) == 2 and not any(g.is_const(i) for i in node.input)
