"""Placement and scale-sharing rules (P, S, H): where TensorRT will not fuse, will re-quantize, or
will fall back to float — predicted from the ONNX graph alone (rule spec §1.2–1.4, §1.6)."""

from __future__ import annotations

from typing import Any

from qdq.lint.attention import attention_cores
from qdq.lint.findings import INFO, WARN, Finding
from qdq.lint.formats import FORMATS, is_dequantize
from qdq.lint.graph import COPY_OPS, EPILOGUE_OPS, LintGraph
from qdq.lint.guard import Guard
from qdq.lint.residual import both_conv_branches, fusible, is_residual, residual_add

__all__ = ["check_placement"]

_SRC = "reference/tensorrt-qdq-rules.md §1.2-1.4"
_NO_INT8 = frozenset({"Softmax", "LayerNormalization", "Sigmoid", "Resize", "Gelu", "Erf", "Tanh"})
_POOLS = frozenset({"GlobalAveragePool", "AveragePool", "ReduceMean"})


def check_placement(g: LintGraph, guard: Guard | None = None) -> list[Finding]:
    """Run the P/S/H rules; findings are ordered by graph position.

    Args:
        g: the indexed graph.
        guard: records a rule that fails on a node or tensor as an ``L00`` finding (in
            ``guard.findings``) and goes on; without one the exception propagates.
    """
    guard = guard or Guard(strict=True)
    out: list[Finding] = []
    for node in g.nodes:
        step = f"placement rules on {node.op_type}"
        out.extend(guard.call(step, (g.name(node),), _node_rules, g, node, default=[]))
    for t in sorted({q.input[0] for q in g.nodes if q.op_type == "QuantizeLinear" and q.input}):
        out.extend(
            guard.call("tensor rules S01/S04/P04/P07", (t,), _tensor_rules, g, t, default=[])
        )
    return out


def _in_attention(g: LintGraph, node: Any) -> bool:
    return any(node is core.scores or node is core.context for core in attention_cores(g))


def _node_rules(g: LintGraph, node: Any) -> list[Finding]:
    """The rules keyed on one node."""
    op = node.op_type
    out: list[Finding] = []
    if g.weighted(node):
        out.extend(_weighted(g, node))
    elif op == "Add" and is_residual(g, node):
        out.extend(residual_add(g, node))
    elif op == "Concat":
        out.extend(_concat(g, node))
    elif op == "MaxPool":
        out.extend(_maxpool(g, node))
    elif op in _POOLS and (op != "ReduceMean" or g.global_pool(node)):  # not a LayerNorm mean
        out.extend(_avg_pool(g, node))
    elif op == "MatMul" and len(node.input) == 2 and not _in_attention(g, node):
        out.append(
            Finding(
                "P14",
                INFO,
                (g.name(node),),
                f"{g.name(node)}: MatMul of two activations outside a fully quantized attention "
                "core (Q/DQ on both operands of Q·Kᵀ and of softmax·V)",
                "runs FP16",
                "quantize both operands of both attention products for TensorRT's INT8 MHA "
                "(rule P16) if the accuracy allows",
                _SRC,
            )
        )
    elif op == "Pad":
        out.extend(_pad(g, node))
    elif is_dequantize(node):
        out.extend(_dangling_dq(g, node))
    elif op == "QuantizeLinear" and node.input[0] in g.inputs:
        out.append(
            Finding(
                "P13",
                INFO,
                (g.name(node),),
                f"{g.name(node)}: quantizes the network input",
                "one input Quantize reformat (expected)",
                "",
                _SRC,
            )
        )
    return out


def _weighted(g: LintGraph, node: Any) -> list[Finding]:
    out: list[Finding] = []
    name = g.name(node)
    act = g.qinput(node.input[0]) is not None
    wgt = g.dq_weight(node.input[1])
    if not (act or wgt):
        return _float_weighted(g, node, name)
    if not act and g.weighted_format(node) is not None:
        return out  # weight-only (INT4 weights, float activation): a kernel of its own
    if act != wgt:
        which = "activation" if act else "weights"
        out.append(
            Finding(
                "P01",
                WARN,
                (name,),
                f"{name}: only its {which} quantized -> {node.op_type} runs in float; "
                "the remaining Q/DQ executes standalone",
                "float layer + standalone Q/DQ",
                "quantize both the activation input and the weights, or neither",
                _SRC,
            )
        )
    if not (act and wgt):
        return out
    out.extend(_epilogue_qdq(g, node))
    if node.op_type == "ConvTranspose":
        nxt = g.consumers.get(node.output[0], [])
        if any(c.op_type in ("Relu", "BatchNormalization", "LeakyRelu", "Clip") for c in nxt):
            out.append(
                Finding(
                    "P09",
                    WARN,
                    (name,),
                    f"{name}: ConvTranspose -> activation fusion is unreliable in explicit INT8",
                    "activation may run FP32",
                    "verify on the GPU, or try Q/DQ before the activation / FP16 for this layer",
                    "NVIDIA/TensorRT#4366, #1699",
                )
            )
    if node.op_type in ("Conv", "ConvTranspose") and g.int8_weighted(node):
        out.extend(_channels(g, node, name))  # INT8 layouts; FP8 convolutions: rules F02/F03
    return out


def _float_weighted(g: LintGraph, node: Any, name: str) -> list[Finding]:
    """INFO on a weighted op left float on purpose: one the builder folds (its input is computed
    from constants and shapes only: no runtime layer, P01) or a GEMM too small for INT8 tensor
    cores (K or N < 16, P14) -- what qdq's planner decides for them, under the same rules."""
    if g.folded_node(node):
        return [
            Finding(
                "P01",
                INFO,
                (name,),
                f"{name}: its input is computed from constants and shapes only (a fixed table)",
                "folded at build time: no engine layer",
                "",
                _SRC,
            )
        ]
    kn = g.gemm_kn(node)
    if kn is not None and min(kn) < 16:
        return [
            Finding(
                "P14",
                INFO,
                (name,),
                f"{name}: GEMM with K={kn[0]}, N={kn[1]} (< 16) left float",
                "runs FP16: no INT8 tensor-core kernel",
                "",
                _SRC,
            )
        ]
    return []


def _channels(g: LintGraph, node: Any, name: str) -> list[Finding]:
    w = g.qinput(node.input[1])
    weight = g.const.get(w.source) if w is not None else None
    if weight is None or weight.ndim < 2:
        return []
    shape = weight.shape
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    k, c = (shape[0], shape[1] * group) if node.op_type == "Conv" else (shape[1] * group, shape[0])
    out = []
    act = g.qinput(node.input[0])
    first = act is not None and act.source in g.inputs
    if (c % 4 or k % 4) and not first:
        out.append(
            Finding(
                "H01",
                WARN,
                (name,),
                f"{name}: {c}->{k} channels are not a multiple of 4",
                "no vectorized INT8 format: reformat layers around it",
                "pad channels to a multiple of 32 (at least 4)",
                _SRC,
            )
        )
    elif c % 32 or k % 32 or first:
        out.append(
            Finding(
                "H01",
                INFO,
                (name,),
                f"{name}: {c}->{k} channels are not a multiple of 32",
                "padded NC/32HW32 or NC/4HW4 kernels",
                "",
                _SRC,
            )
        )
    if c < 16 or k < 16:
        out.append(
            Finding(
                "H02",
                INFO,
                (name,),
                f"{name}: small conv ({c}->{k} channels)",
                "int8x4 kernels, little INT8 gain",
                "",
                _SRC,
            )
        )
    return out


#: one-input epilogue ops: walked through after a weighted op, and no epilogue of it when another
#: layer reads the same tensor (they cannot fuse into the producer then)
_UNARY_EPILOGUE = frozenset({"BatchNormalization", "Relu", "Clip", "LeakyRelu"})


def _epilogue_qdq(g: LintGraph, node: Any) -> list[Finding]:
    """P02: a Q/DQ between a weighted op and its BN/activation/residual-Add epilogue."""
    out = []
    cur, seen = node.output[0], 0
    while cur and seen < 8:
        seen += 1
        uses = g.quantized_uses(cur)
        fan_out = len(uses) + len(g.float_uses(cur)) > 1
        for q, consumer, _ in uses:
            if consumer.op_type in _UNARY_EPILOGUE and fan_out:
                # beside other readers of the same tensor (RepVGG's identity BatchNorm, RetinaNet's
                # relu(p6) beside the head conv) it cannot fuse into the producer: no epilogue
                continue
            # a residual Add may read one branch through Q/DQ (P03); that is wrong only when the
            # Add ends up unfusable (both inputs quantized, or only the conv branch)
            if consumer.op_type == "Sigmoid" and _silu_behind_one_q(g, consumer):
                continue  # T08c: P07 INFO below
            residual = consumer.op_type == "Add" and is_residual(g, consumer)
            if residual and not {f.rule for f in residual_add(g, consumer)} & {"P03b", "P03c"}:
                continue
            if residual and both_conv_branches(g, consumer):
                continue  # either branch may be the quantized one (T23); P03b says both are
            if consumer.op_type in EPILOGUE_OPS and consumer.op_type != "Mul":
                out.append(
                    Finding(
                        "P02",
                        WARN,
                        (g.name(node), g.name(q)),
                        f"{g.name(q)}: Q/DQ between {g.name(node)} and {consumer.op_type} "
                        f"{g.name(consumer)} prevents their fusion",
                        f"{consumer.op_type} runs as a separate layer",
                        "move the Q/DQ to the input of the next quantizable consumer",
                        _SRC,
                    )
                )
        readers = g.float_uses(cur)
        if len(readers) != 1 or readers[0].op_type not in _UNARY_EPILOGUE:
            break
        cur = readers[0].output[0]
    return out


def _float_layer_output(g: LintGraph, tensor: str) -> bool:
    """Whether ``tensor`` is the output (with its epilogue) of a Conv/GEMM that runs float: it
    cannot write INT8 at no cost."""
    layer = g.backbone(tensor)
    return layer is not None and not g.quantized_weighted(layer)


def _concat(g: LintGraph, node: Any) -> list[Finding]:
    name = g.name(node)
    if g.reorder_source(node) is not None:
        return []  # a cyclic shift (Slices of one tensor): the Quantize moves back to its source
    out_scales = {s for _, _, s in _uses_through(g, node.output[0])}
    if not out_scales or len(node.input) < 2:
        return []  # a one-input Concat (torch.stack of one image) copies: one Quantize either way
    ins = [g.qinput(i) for i in node.input]
    if not _plain_uses(g, _uses_through(g, node.output[0])):
        return []  # read in FP8 only: no FP8 Concat, so it runs float and its reader quantizes
    if any(q is None for q in ins):
        floats = [i for i, q in zip(node.input, ins, strict=True) if q is None]
        written = [i for i in floats if _float_layer_output(g, i)]
        if len(written) >= 2:  # a Quantize each: more than the reader's one after the Concat
            return [
                Finding(
                    "S02b",
                    INFO,
                    (name,),
                    f"{name}: {len(written)} inputs written by float Conv/GEMM layers "
                    f"({written[:3]}) stay float and the Concat runs float",
                    "its quantized reader's Quantize runs standalone (one, where quantizing "
                    "these inputs would take one each)",
                    "none needed; to run the Concat INT8, quantize the layers writing its inputs",
                    _SRC,
                )
            ]
        if g.split_back(node):
            return [
                Finding(
                    "S02b",
                    INFO,
                    (name,),
                    f"{name}: float inputs {floats[:3]} share one scale only to be split back "
                    "into GEMM operands (a quantized recurrent step: pytorch-quantization's "
                    "QuantLSTM quantizes [x | h] once)",
                    "a Quantize kernel per float input, the GEMMs run INT8",
                    "none needed (the recurrence keeps its hidden state float)",
                    _SRC,
                )
            ]
        return [
            Finding(
                "S02b",
                WARN,
                (name,),
                f"{name}: inputs {floats} not quantized while the output is",
                "Quantize kernels on the float inputs",
                "quantize every input with the output's scale",
                _SRC,
            )
        ]
    scales = {q.scale for q in ins if q is not None} | out_scales
    if len(scales) > 1:
        return [
            Finding(
                "S02",
                WARN,
                (name,),
                f"{name}: input scales "
                f"{sorted({q.scale[0] for q in ins if q is not None and q.scale})} / output "
                f"{sorted(s[0] for s in out_scales if s)} differ",
                "re-quantize ops; the Concat cannot be eliminated",
                "share one scale",
                _SRC,
            )
        ]
    return []


def _maxpool(g: LintGraph, node: Any) -> list[Finding]:
    name = g.name(node)
    after = {s for _, _, s in _uses_through(g, node.output[0])}
    if not after:
        return []
    qi = g.qinput(node.input[0])
    source = qi.source if qi is not None else node.input[0]
    before = {s for _, _, s in g.quantized_uses(source)}
    if qi is not None:
        before.add(qi.scale)
    if before and (before | after) != after:
        return [
            Finding(
                "S03",
                WARN,
                (name,),
                f"{name}: scales across MaxPool differ "
                f"({sorted(s[0] for s in before if s)} vs {sorted(s[0] for s in after if s)})",
                "re-quantize after the pool",
                "share one quantizer across the MaxPool",
                _SRC,
            )
        ]
    if qi is not None:
        return [
            Finding(
                "P10",
                INFO,
                (name,),
                f"{name}: redundant Q/DQ before MaxPool",
                "prevents a ConvActPool fusion",
                "remove it",
                _SRC,
            )
        ]
    return []


def _avg_pool(g: LintGraph, node: Any) -> list[Finding]:
    uses = _uses_through(g, node.output[0])
    if g.qinput(node.input[0]) is not None or not _plain_uses(g, uses):
        return []  # (read in FP8 only: TensorRT has no FP8 pooling, float is its best)
    producer = g.producer.get(node.input[0])
    if producer is None:
        return []
    name = g.name(node)
    return [
        Finding(
            "P06",
            WARN,
            (name,),
            f"{name}: average pool left float between INT8 layers",
            "a reformat before it and a Quantize after it",
            "quantize the pool input",
            _SRC,
        )
    ]


def _pad(g: LintGraph, node: Any) -> list[Finding]:
    return [
        Finding(
            "P08",
            WARN,
            (g.name(node), g.name(c)),
            f"{g.name(c)}: Q/DQ between Pad {g.name(node)} and the conv blocks Pad+Conv fusion",
            "separate Pad layer",
            "move the Q/DQ in front of the Pad",
            "NVIDIA/TensorRT#2592",
        )
        for _, c, _ in g.quantized_uses(node.output[0])
        if c.op_type in ("Conv", "ConvTranspose")
    ]


def _dangling_dq(g: LintGraph, node: Any) -> list[Finding]:
    if g.is_const(node.input[0]):
        return []
    readers = g.consumers.get(node.output[0], [])
    if len(readers) == 1 and readers[0].op_type == "Sigmoid" and _silu_behind_one_q(g, readers[0]):
        name = g.name(readers[0])
        return [
            Finding(
                "P07",
                INFO,
                (name,),
                f"SiLU at {name}: both branches read the same Q/DQ",
                "relies on TensorRT merging identical Q nodes",
                "prefer no Q/DQ inside x*sigmoid(x)",
                _SRC,
            )
        ]
    if readers and all(r.op_type in _NO_INT8 for r in readers):
        # a Sigmoid that is part of SiLU with a quantized conv is handled by P07
        name = g.name(node)
        return [
            Finding(
                "P12",
                WARN,
                (name,),
                f"{name}: DequantizeLinear feeds only "
                f"{sorted({r.op_type for r in readers})}, which have no "
                f"{FORMATS[g.qdq_format(node)].label} path",
                "standalone Dequantize layer",
                "remove this Q/DQ pair",
                _SRC,
            )
        ]
    return []


def _silu_behind_one_q(g: LintGraph, sigmoid: Any) -> bool:
    """Sigmoid(DQ(q)) multiplied by another DQ of the same QuantizeLinear ``q`` (SiLU, T08c)."""
    dq = g.producer.get(sigmoid.input[0])
    if dq is None or not is_dequantize(dq):
        return False
    for mul in g.consumers.get(sigmoid.output[0], []):
        if mul.op_type != "Mul":
            continue
        other = [i for i in mul.input if i != sigmoid.output[0]]
        src = g.producer.get(other[0]) if other else None
        if src is not None and is_dequantize(src) and src.input[0] == dq.input[0]:
            return True
    return False


def _uses_through(g: LintGraph, tensor: str) -> list[tuple[Any, Any, tuple[float, ...]]]:
    """Quantized uses of ``tensor``, looking through copy ops and reorders of it (a cyclic
    shift's Slices and Concat, :meth:`LintGraph.reorder_source`): TensorRT moves Q backward."""
    out = list(g.quantized_uses(tensor))
    for c in g.consumers.get(tensor, []):
        if c.op_type in COPY_OPS:
            out.extend(_uses_through(g, c.output[0]))
    for concat in _reorders_of(g, tensor):
        out.extend(_uses_through(g, concat.output[0]))
    return out


def _plain_uses(g: LintGraph, uses: list[tuple[Any, Any, tuple[float, ...]]]) -> bool:
    """Whether some of ``uses`` quantize in a format whose pooling, pointwise and data-movement
    layers TensorRT runs quantized (INT8; not FP8: :data:`qdq.lint.formats.FORMATS`), so that
    quantizing such a layer's inputs too would let it run quantized."""
    return any(FORMATS[g.qdq_format(q)].plain_layers for q, _, _ in uses)


def _reorders_of(g: LintGraph, tensor: str) -> list[Any]:
    """The Concats reordering ``tensor`` that read its Slices directly (a roll's last Concat
    reads the first one's Slices: reached from that Concat's output)."""
    found: list[Any] = []
    for c in g.consumers.get(tensor, []):
        if c.op_type not in ("Slice", "Split"):
            continue
        for o in c.output:
            for concat in g.consumers.get(o, []):
                reorder = concat.op_type == "Concat" and g.reorder_source(concat) == tensor
                if reorder and concat not in found:
                    found.append(concat)
    return found


def _tensor_rules(g: LintGraph, t: str) -> list[Finding]:
    """S01 (several scales on one quantized tensor), S04 (skip scale), P04 (quantized and float
    consumers), P07 (SiLU)."""
    out: list[Finding] = []
    if g.is_const(t):
        return out
    uses = g.quantized_uses(t)
    scales = {s for _, _, s in uses}
    skips = [c for _, c, _ in uses if c.op_type == "Add" and is_residual(g, c)]
    if len(scales) > 1 and skips:
        add = skips[0]
        out.append(
            Finding(
                "S04",
                WARN,
                (g.name(add), t),
                f"{g.name(add)}: its skip {t} is quantized with a scale different from the "
                f"other quantized uses of {t} ({sorted(s[0] for s in scales if s)})",
                f"{len(scales) - 1} standalone Quantize layer(s): {t} has one INT8 version",
                "reuse the block input's quantizer for the skip",
                _SRC,
            )
        )
    elif len(scales) > 1:
        out.append(
            Finding(
                "S01",
                WARN,
                (t,),
                f"tensor {t}: {len(scales)} different scales on its consumers",
                f"{len(scales) - 1} standalone Quantize layer(s)",
                "share one quantizer per tensor",
                _SRC,
            )
        )
    floats = [c for c in g.float_uses(t) if not fusible(g, t, c) and not _quantized_through(g, c)]
    if not uses or not floats:
        return out
    if not _plain_uses(g, uses) and not any(g.weighted(c) for c in floats):
        return out  # FP8 readers beside float plain layers, which have no FP8 version: nothing
        # quantizes those, and the producer writes float for them either way
    names = sorted({g.name(c) for c in floats})
    if any(c.op_type == "Sigmoid" for c in floats) and any(c.op_type == "Mul" for _, c, _ in uses):
        out.append(
            Finding(
                "P07",
                WARN,
                (t,),
                f"SiLU on {t}: the Mul reads it through Q/DQ but the Sigmoid in float",
                "conv output stays float; SiLU not fused",
                "no Q/DQ inside x*sigmoid(x)",
                _SRC,
            )
        )
    out.append(
        Finding(
            "P04",
            WARN,
            (t,),
            f"tensor {t} has quantized consumers and float consumers {names}",
            "its producer outputs float; the Quantize runs standalone",
            "quantize all its consumers with one quantizer, or none",
            _SRC,
        )
    )
    return out


def _quantized_through(g: LintGraph, consumer: Any) -> bool:
    """A commuting/copy consumer (MaxPool, Reshape, nearest Resize, a reorder's Slice or Concat,
    ...) whose outputs are read only through Q (TensorRT moves the Q backward across it): a
    quantized use, not a float one."""
    if consumer.op_type not in COPY_OPS | {"MaxPool", "Resize", "Split", "Slice"} and not (
        consumer.op_type == "Concat" and g.reorder_source(consumer) is not None
    ):
        return False
    readers = [
        c
        for o in consumer.output
        for c in g.consumers.get(o, [])
        if c.op_type != "Shape" and not g.shape_only(c)  # FPN's anchors read the pooled shape
    ]
    return bool(readers) and all(
        c.op_type == "QuantizeLinear" or _quantized_through(g, c) for c in readers
    )
