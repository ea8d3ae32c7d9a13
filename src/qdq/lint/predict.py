"""Predict the engine's layers from a Q/DQ ONNX graph: which ONNX nodes TensorRT fuses into one
layer, each layer's input and output precision, and which Quantize/Dequantize nodes run as
standalone layers (rule spec §1.6, steps 3-5).

The model is TensorRT's explicit-quantization behaviour as documented and as observed in real engine
reports: a weighted op whose activation and weights both arrive through DequantizeLinear runs INT8
and absorbs its epilogue (BN, activation, bias, SiLU, a residual Add read in float and the Relu
after it); its output is INT8 only when every reader quantizes it (looking through MaxPool, Concat,
Slice and copy ops, which TensorRT moves a Quantize across) and a fused residual Add's other operand
is quantized ("the precision of the first input to the element-wise addition determines the
precision of the output"); conversely a fused layer whose output stays float (its reader is not
quantized) reads a quantized residual operand in float, behind a standalone DequantizeLinear, as
the real engines show (every fused Conv+Add takes its residual input in its output's precision).
An attention core whose two MatMuls read every operand through Q/DQ
is one INT8 MHA layer (:mod:`qdq.lint.attention`). Non-weighted quantizable ops run INT8 when
their inputs are INT8 and their output is quantized. Every Quantize whose producer outputs float,
every extra scale on one tensor, and every Dequantize read by a float layer is a standalone layer
(a Q/DQ-origin reformat).

FP8 is the same model with another row of :data:`qdq.lint.formats.FORMATS`: a layer computes in
the format its quantized inputs share and writes that format only when its readers quantize in
it, so a boundary between INT8, FP8 and float layers costs the same standalone Q/DQ an INT8/float
boundary does. The FP8 row differs where TensorRT does: FP8 kernels are GEMM, convolution and MHA
only (pooling, pointwise and data-movement layers with FP8 Q/DQ run float), and a convolution
TensorRT has no FP8 kernel for (:func:`qdq.lint.fp8.no_kernel`) runs float.
"""

from __future__ import annotations

from typing import Any

from qdq.lint.attention import Attention, attention_cores
from qdq.lint.formats import DYNAMIC_QUANTIZE, FORMATS, INT8, is_qdq
from qdq.lint.fp8 import no_kernel
from qdq.lint.graph import COPY_OPS, LintGraph, QInput
from qdq.lint.guard import Guard
from qdq.lint.layer import PLUGIN, PredictedLayer
from qdq.lint.structure import is_custom_op

__all__ = ["PLUGIN", "PredictedLayer", "int8_capable", "predict_layers", "quantized_skips"]
_SKIP = COPY_OPS | {"Shape", "Constant", "Cast"}  # and every Q/DQ (is_qdq)
_EPILOGUE = frozenset(
    {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "HardSwish", "HardSigmoid", "Sigmoid"}
)
#: layout ops inside an epilogue chain (ConvNeXt: Gemm on NHWC, Transpose back, LayerScale, Add)
_LAYOUT = frozenset({"Transpose", "Reshape"})
# ops a Quantize moves backward across (MaxPool commutes; Concat/Slice/Split are data movement)
_COMMUTING = COPY_OPS | {"MaxPool", "Concat", "Slice", "Split", "Resize"}
# non-weighted ops with an INT8 implementation when fed INT8 and read through Quantize
_QUANTIZABLE = frozenset(
    {"AveragePool", "GlobalAveragePool", "MaxPool", "Concat", "Slice", "Split"}
)
# elementwise ops TensorRT fuses into PointWise layers (INT8 in and out when fully quantized)
_POINTWISE = frozenset(
    {"Add", "Mul", "Sub", "Div", "Relu", "BatchNormalization", "Clip", "LeakyRelu", "Sigmoid",
     "Tanh", "HardSwish", "HardSigmoid", "Abs", "Neg", "Exp", "Sqrt", "Pow", "Max", "Min", "Elu",
     "Selu", "Softplus"}
)  # fmt: skip
_QUANTIZABLE_PW = _POINTWISE - {"Exp", "Sqrt", "Pow", "Div"}


def predict_layers(
    g: LintGraph, float_dtype: str = "fp16", guard: Guard | None = None
) -> list[PredictedLayer]:
    """Predicted engine layers in graph order (standalone Q/DQ layers where they execute).

    Args:
        g: the indexed graph.
        float_dtype: the precision of float layers (``"fp16"``, ``"fp32"``, ``"bf16"``).
        guard: records a node the predictor fails on as an ``L00`` finding (in ``guard.findings``)
            and predicts it as a float layer; without one the exception propagates.
    """
    return _Predictor(g, float_dtype, guard or Guard(strict=True)).run()


class _Predictor:
    def __init__(self, g: LintGraph, float_dtype: str, guard: Guard) -> None:
        self.g = g
        self.fp = float_dtype
        self.guard = guard
        self.order = {id(n): i for i, n in enumerate(g.nodes)}
        self.absorbed: set[int] = set()
        self.q_out: dict[str, str] = {}  # tensors a layer writes quantized -> their format
        self.float_readers: set[int] = set()  # ids of nodes that run float
        self.attention: dict[int, Attention] = {}  # first MatMul -> fused quantized MHA core
        self.internal: set[int] = set()  # Q/DQ nodes inside a fused kernel (attention probs)
        self.shape_nodes = _shape_nodes(g)
        self.tails: dict[str, Any] = {}  # epilogue end (before a residual Add) -> weighted op
        # DequantizeLinear of a quantized residual operand read by a layer that outputs float
        self.float_skips: dict[int, str] = {}
        names = {1: "fp32", 10: "fp16", 16: "bf16"}
        self.io = {
            i.name: names.get(i.type.tensor_type.elem_type, float_dtype) for i in g.graph.input
        }

    def _safe(self, step: str, nodes: list[Any], default: Any, fn: Any, *args: Any) -> Any:
        names = tuple(self.g.name(n) for n in nodes)
        return self.guard.call(f"layer prediction ({step})", names, fn, *args, default=default)

    def run(self) -> list[PredictedLayer]:
        g = self.g
        for core in self._safe("attention", [], [], lambda: attention_cores(g)):
            self.attention[id(core.scores)] = core
            self.absorbed.update(id(m) for m in core.members[1:])
            self.internal.update(id(m) for m in core.members if is_qdq(m))
        # a weighted op on build-time tensors only is folded by the builder: no engine layer
        weighted = [n for n in g.nodes if g.weighted(n) and id(n) not in self.shape_nodes]
        chains = {id(n): self._safe("epilogue", [n], ([], ""), self._chain_of, n) for n in weighted}
        # the tensor ending each weighted op's epilogue before any residual Add
        self.tails = {chains[id(n)][1]: n for n in weighted if chains[id(n)][1]}
        groups = {
            id(n): self._safe("epilogue", [n], [n], self._epilogue, n, *chains[id(n)])
            for n in weighted
        }
        for members in groups.values():
            self.absorbed.update(id(m) for m in members[1:])
        layers: list[tuple[Any, PredictedLayer]] = []  # (first node, layer)
        for n in g.nodes:
            if id(n) in self.attention:
                core = self.attention[id(n)]
                members = list(core.members)
                layer = self._safe("attention", members, None, self._attention_layer, core)
            elif id(n) in groups:
                members = groups[id(n)]
                layer = self._safe("weighted layer", members, None, self._weighted_layer, members)
            elif (
                id(n) in self.absorbed
                or n.op_type in _SKIP
                or is_qdq(n)
                or id(n) in self.shape_nodes
                or _dynamic_quantize(n)  # a standalone quantize layer (_with_standalone_qdq)
            ):
                continue
            elif n.op_type in _POINTWISE:
                members = self._safe("pointwise fusion", [n], [n], self._pointwise_region, n)
                self.absorbed.update(id(m) for m in members)
                layer = self._safe("pointwise layer", members, None, self._pointwise_layer, members)
            else:
                members = [n]
                layer = self._safe("layer", members, None, self._plain_layer, n)
            layers.append((members[0], layer or self._not_analysed(members)))
        return self._with_standalone_qdq(layers)

    def _not_analysed(self, members: list[Any]) -> PredictedLayer:
        """The float layer reported for nodes the predictor failed on (an L00 finding says why)."""
        names = tuple(self.g.name(m) for m in members)
        self.float_readers.update(id(m) for m in members)
        kind = "weighted" if self.g.weighted(members[0]) else "other"
        return PredictedLayer(" + ".join(names), names, kind, self.fp, self.fp, "not analysed")

    def _chain_of(self, node: Any) -> tuple[list[Any], str]:
        return self._chain(node.output[0])

    def _pointwise_region(self, start: Any) -> list[Any]:
        """Pointwise ops TensorRT fuses into one PointWise layer with ``start``: readers whose
        other inputs are constants, quantized, produced inside the region, or produced by a
        pointwise op read only by that reader whose own inputs are (FocalNet's gated sum
        ``a * g_a + b * g_b``: both products and the Add are one layer)."""
        g = self.g
        region, members = [start], {id(start)}
        inside = {o for o in start.output if o}
        todo = list(inside)  # tensors whose readers were not tried since the tensor joined

        def ready(i: str) -> bool:
            return i in inside or g.is_const(i) or g.qinput(i) is not None

        def feeder(i: str, reader: Any) -> Any:
            p = g.producer.get(i)
            ok = (
                p is not None
                and p.op_type in _POINTWISE
                and id(p) not in self.absorbed
                and id(p) not in members
                and all(c is reader for c in g.consumers.get(i, []))
                and i not in g.outputs
                and all(ready(j) for j in p.input if j)
            )
            return p if ok else None

        def joins(c: Any) -> list[Any] | None:
            """``c`` and the feeders it needs, or ``None`` (stopping at the first input that
            has none: a wide reader tried by many regions costs little each time)."""
            found = []
            for i in c.input:
                if i and not ready(i):
                    f = feeder(i, c)
                    if f is None:
                        return None
                    found.append(f)
            return [*found, c]

        # a worklist to the same fixed point as retrying every inside tensor until nothing joins
        # (joining only grows with ``inside``): a tensor joining retries its readers, and the
        # readers of a pointwise reader that could feed them
        while todo:
            t = todo.pop()
            tried: dict[int, Any] = {}
            for c in g.float_uses(t):
                tried[id(c)] = c
                if c.op_type in _POINTWISE and id(c) not in members:
                    for o in c.output:
                        only = g.consumers.get(o, [])
                        if only and all(r is only[0] for r in only):
                            tried[id(only[0])] = only[0]
            for c in tried.values():
                if c.op_type not in _POINTWISE or id(c) in self.absorbed or id(c) in members:
                    continue
                new = joins(c)
                for m in new or ():
                    if id(m) in members:
                        continue
                    members.add(id(m))
                    region.append(m)
                    for o in m.output:
                        if o and o not in inside:
                            inside.add(o)
                            todo.append(o)
        region.sort(key=lambda m: self.order[id(m)])
        return region

    def _pointwise_layer(self, region: list[Any]) -> PredictedLayer:
        g = self.g
        names = tuple(g.name(m) for m in region)
        ids = {id(m) for m in region}
        inside = {o for m in region for o in m.output}
        ext_in = [i for m in region for i in m.input if i and i not in inside and not g.is_const(i)]
        ext_out = [
            o
            for o in inside
            if o in g.outputs or any(id(c) not in ids for c in g.consumers.get(o, []))
        ]
        fmt = self._common_format(ext_in)
        quantizable = all(m.op_type in _QUANTIZABLE_PW for m in region)
        if (
            quantizable
            and fmt is not None
            and FORMATS[fmt].plain_layers
            and ext_out
            and all(self._quantized_as(o) == fmt for o in ext_out)
        ):
            self.q_out.update(dict.fromkeys(ext_out, fmt))
            return PredictedLayer(" + ".join(names), names, "pointwise", fmt, fmt)
        self.float_readers.update(id(m) for m in region)
        reason = self._float_reason(quantizable and bool(ext_in), ext_in, fmt)
        return PredictedLayer(" + ".join(names), names, "pointwise", self.fp, self.fp, reason)

    # ------------------------------------------------------------------ grouping
    def _chain(self, tensor: str) -> tuple[list[Any], str]:
        """The BN / activation / bias / SiLU ops TensorRT fuses after ``tensor`` (each read only
        by the next), and the tensor the chain ends in."""
        g = self.g
        members: list[Any] = []
        cur = tensor
        while True:
            readers = g.float_uses(cur)
            silu = _silu(g, cur, readers)
            if silu is not None:
                members.extend(readers)
                cur = silu
                continue
            if len(readers) != 1 or len(g.consumers.get(cur, [])) != 1:
                return members, cur
            nxt = readers[0]
            if not (nxt.op_type in _EPILOGUE or nxt.op_type in _LAYOUT or _bias(g, nxt)):
                return members, cur
            members.append(nxt)
            cur = nxt.output[0]

    def _epilogue(self, node: Any, chain: list[Any], tail: str) -> list[Any]:
        """The weighted op and the ops TensorRT fuses after it: ``Conv [BN] [act | SiLU]
        [residual Add [act]]`` -- at most one residual Add (rule spec §1.6 step 3)."""
        members = [node, *chain]
        add = self._residual_reader(tail)
        if add is not None and self._fuses_add(node, tail, add):
            after, _ = self._chain(add.output[0])
            members += [add, *after]
        return members

    def _residual_reader(self, tensor: str) -> Any:
        """The two-operand, non-bias Add that is the only reader of ``tensor``, or ``None``."""
        readers = self.g.consumers.get(tensor, [])
        if len(readers) != 1 or self.g.float_uses(tensor) != readers:
            return None
        add = readers[0]
        if add.op_type != "Add" or len(add.input) != 2 or _bias(self.g, add):
            return None
        return add

    def _fuses_add(self, node: Any, tensor: str, add: Any) -> bool:
        """The residual Add read in float on ``tensor`` (the end of ``node``'s epilogue) fuses into
        ``node``, unless its other operand also ends a weighted op's epilogue that is computed
        later (TensorRT fuses into the last producer). Both candidates decide with the same test,
        so exactly one of them takes the Add."""
        other = add.input[1] if add.input[0] == tensor else add.input[0]
        if self.g.qinput(other) is not None:
            return True
        rival = self.tails.get(other)
        if rival is None or rival is node or self._residual_reader(other) is not add:
            return True
        return self.order[id(node)] > self.order[id(rival)]

    # ------------------------------------------------------------------ layers
    def _weighted_layer(self, members: list[Any]) -> PredictedLayer:
        g = self.g
        node, last = members[0], members[-1].output[0]
        names = tuple(g.name(m) for m in members)
        fmt = g.weighted_format(node)
        missing = no_kernel(g, node, fmt) if fmt is not None else _unfused(g, node)
        if fmt is None or missing:
            self.float_readers.update(id(m) for m in members)
            return PredictedLayer(" + ".join(names), names, "weighted", self.fp, self.fp, missing)
        skip_float = any(
            m.op_type == "Add" and not _const_add(g, m) and _other_float(g, m, members)
            for m in members[1:]
        )
        written = self._quantized_as(last)
        if skip_float:
            out, reason = self.fp, "fused residual Add's other operand is float"
        elif written == fmt:
            out, reason = fmt, ""
        elif written is not None:
            out, reason = self.fp, f"its readers quantize to {FORMATS[written].label}"
        else:
            out, reason = self.fp, "output has float readers"
        if out == fmt:
            self.q_out[last] = fmt
        else:  # the fused Add reads its residual operand in the output's precision
            for _, skip in quantized_skips(g, members):
                self.float_skips[id(skip.dq)] = " + ".join(names)
        return PredictedLayer(" + ".join(names), names, "weighted", fmt, out, reason)

    def _attention_layer(self, core: Attention) -> PredictedLayer:
        """TensorRT's fused MHA: INT8 (or FP8) products, the softmax and its Q/DQ inside; the
        output is quantized only when every reader quantizes it in the core's format."""
        names = tuple(self.g.name(m) for m in core.members)
        fmt = core.fmt
        if all(self._quantized_as(o) == fmt for o in core.context.output if o):
            self.q_out.update(dict.fromkeys((o for o in core.context.output if o), fmt))
            return PredictedLayer(" + ".join(names), names, "attention", fmt, fmt)
        return PredictedLayer(" + ".join(names), names, "attention", fmt, self.fp)

    def _plain_layer(self, node: Any) -> PredictedLayer:
        g = self.g
        op = node.op_type
        if is_custom_op(node):  # no ONNX operator: TensorRT runs whatever plugin is registered
            name = g.name(node)
            self.float_readers.add(id(node))  # a Dequantize before it runs standalone
            why = f"{node.domain or 'ai.onnx'}::{op} is no ONNX operator: a TensorRT plugin"
            return PredictedLayer(name, (name,), "plugin", PLUGIN, PLUGIN, why)
        pool = "Pool" in op or g.global_pool(node)  # ReduceMean over H, W is a global pool
        kind = "pooling" if pool else "concat" if op == "Concat" else "other"
        data = [i for i in node.input if i and not g.is_const(i)]
        fmt = self._common_format(data)
        outs = self._outputs_as(node.output)
        name = g.name(node)
        commuting = op in ("MaxPool", "Slice", "Split", "Concat") or _nearest(node)
        quantizable = op in _QUANTIZABLE or pool
        plain = fmt is not None and FORMATS[fmt].plain_layers
        if quantizable and plain and fmt is not None and (outs == fmt or commuting):
            self.q_out.update(dict.fromkeys((o for o in node.output if o), fmt))
            return PredictedLayer(name, (name,), kind, fmt, fmt)
        if commuting and outs is not None and FORMATS[outs].plain_layers and op != "Concat":
            # the Quantize moves back across it
            self.q_out.update(dict.fromkeys((o for o in node.output if o), outs))
            return PredictedLayer(name, (name,), kind, outs, outs)
        self.float_readers.add(id(node))
        reason = self._float_reason(quantizable, data, fmt)
        return PredictedLayer(name, (name,), kind, self.fp, self.fp, reason)

    def _float_reason(self, quantizable: bool, inputs: list[str], fmt: str | None) -> str:
        """Why a quantizable-looking plain or pointwise layer runs float."""
        if not quantizable:
            return "no INT8 implementation"
        if fmt is None:
            seen = {f for f in map(self._tensor_format, inputs) if f is not None}
            if len(seen) > 1:
                return "inputs mix " + " and ".join(sorted(FORMATS[f].label for f in seen))
            return f"inputs not all {FORMATS[seen.pop() if seen else INT8].label}"
        if not FORMATS[fmt].plain_layers:
            return f"no {FORMATS[fmt].label} implementation"
        return "output not quantized"

    def _common_format(self, tensors: list[str]) -> str | None:
        """The format every one of ``tensors`` is read in, or ``None`` (one is float, formats
        differ, or there are none)."""
        found = {self._tensor_format(t) for t in tensors}
        return found.pop() if len(found) == 1 else None

    def _tensor_format(self, tensor: str) -> str | None:
        """The format ``tensor`` is read in: through DequantizeLinear, or as a layer wrote it."""
        q = self.g.qinput(tensor)
        return q.fmt if q is not None else self._written_format(tensor)

    def _outputs_as(self, outputs: Any) -> str | None:
        """The one format every (non-empty) output is quantized as (:meth:`_quantized_as`)."""
        found = {self._quantized_as(o) for o in outputs if o}
        return found.pop() if len(found) == 1 else None

    def _quantized_as(self, tensor: str) -> str | None:
        """The format every reader of ``tensor`` quantizes it in (looking through copy ops, and
        through ops a Quantize moves across in formats that have such layers), or ``None``: a
        reader reads it in float, it is returned, or its readers quantize in different formats."""
        g = self.g
        if tensor in g.outputs or any(  # returned, directly or through the tracer's Cast
            c.op_type == "Cast" and c.output[0] in g.outputs for c in g.consumers.get(tensor, [])
        ):
            return None
        floats = {id(c) for c in g.float_uses(tensor)}
        readers = {  # each reader once (a Concat may read the tensor 10^5 times)
            id(c): c
            for c in g.consumers.get(tensor, [])
            if c.op_type == "QuantizeLinear" or id(c) in floats
        }
        found: set[str | None] = set()
        for c in readers.values():
            if c.op_type == "QuantizeLinear":
                found.add(g.qdq_format(c))
            elif c.op_type in COPY_OPS:
                found.add(self._outputs_as(c.output))
            elif c.op_type in _COMMUTING:
                fmt = self._outputs_as(c.output)
                found.add(fmt if fmt is not None and FORMATS[fmt].plain_layers else None)
            else:
                return None
        return found.pop() if len(found) == 1 else None

    # ------------------------------------------------------------------ standalone Q/DQ
    def _with_standalone_qdq(
        self, layers: list[tuple[Any, PredictedLayer]]
    ) -> list[PredictedLayer]:
        """Insert a ``qdq`` layer after each layer for its standalone Quantize/Dequantize nodes."""
        g = self.g
        extra: dict[int, list[PredictedLayer]] = {}
        for n in g.nodes:
            if _dynamic_quantize(n):
                name, fmt = g.name(n), g.qdq_format(n)
                why = "dynamic block quantization: block scales computed at run time"
                extra.setdefault(self.order[id(n)], []).append(
                    PredictedLayer(name, (name,), "qdq", self.fp, fmt, why)
                )
                continue
            if not is_qdq(n) or (n.op_type == "QuantizeLinear" and g.is_const(n.input[0])):
                continue
            reason = self._safe("standalone Q/DQ", [n], "", self._standalone, n)
            if reason:
                name = g.name(n)
                fmt = g.qdq_format(n)
                src, dst = (self.fp, fmt) if n.op_type == "QuantizeLinear" else (fmt, self.fp)
                if n.input[0] in g.inputs:
                    src = self.io.get(n.input[0], src)
                extra.setdefault(self.order[id(n)], []).append(
                    PredictedLayer(name, (name,), "qdq", src, dst, reason)
                )
        by_first = {id(first): ly for first, ly in layers}
        out: list[PredictedLayer] = []
        for n in g.nodes:
            ly = by_first.get(id(n))
            if ly is not None:
                out.append(ly)
            out.extend(extra.get(self.order[id(n)], []))
        return out

    def _standalone(self, node: Any) -> str:
        """Why a Q or DQ node executes as its own layer ('' when it fuses)."""
        g = self.g
        if id(node) in self.internal:
            return ""
        if node.op_type == "QuantizeLinear":
            t = node.input[0]
            if t in g.inputs:
                return "quantizes the network input"
            written = self._written_format(t)
            if written is None:
                return "its producer outputs float"
            if written != g.qdq_format(node):
                label, to = FORMATS[written].label, FORMATS[g.qdq_format(node)].label
                return f"its producer writes {label}: a {label} -> {to} requantize"
            # one quantized version per tensor: each further scale is a requantize
            scales: list[tuple[str, tuple[float, ...]]] = []
            for q in g.consumers.get(t, []):
                if q.op_type != "QuantizeLinear":
                    continue
                s = (g.qdq_format(q), _scale(g, q))
                if s in scales and q is not node:
                    continue
                scales.append(s)
                if q is node:
                    return "" if len(scales) == 1 else "a second scale on the same tensor"
            return ""
        if id(node) in self.float_skips:
            return f"the residual input of {self.float_skips[id(node)]}, whose output is float"
        readers = g.consumers.get(node.output[0], [])
        if g.is_const(node.input[0]):  # weights: fused, unless only float layers read them
            floats = readers and all(id(r) in self.float_readers for r in readers)
            return "weights dequantized for a float layer" if floats else ""
        if readers and all(id(r) in self.float_readers for r in readers):
            return "its readers run float"
        return ""

    def _written_format(self, tensor: str) -> str | None:
        """The format a layer writes ``tensor`` in (possibly through copy ops), or ``None``. The
        copies may pass through the layer itself: a GEMM that absorbed a Reshape/Transpose writes
        INT8 after them, and a further view of that tensor (HaloNet's q, blocked again for its
        relative-position GEMMs) walks back past the layer's end to the GEMM."""
        g = self.g
        node = g.producer.get(tensor)
        while node is not None and node.op_type in COPY_OPS and tensor not in self.q_out:
            tensor = node.input[0]
            node = g.producer.get(tensor)
        return self.q_out.get(tensor)


def quantized_skips(g: LintGraph, members: list[Any]) -> list[tuple[Any, QInput]]:
    """(Add, its Q/DQ input) for each residual Add fused into a weighted layer (``members``: the
    weighted op and its epilogue) whose operand that is not the layer's own tensor is quantized."""
    own = {o for m in members for o in m.output}
    adds = [m for m in members[1:] if m.op_type == "Add" and not _const_add(g, m)]
    found = [(a, g.qinput(i)) for a in adds for i in a.input if i and i not in own]
    return [(a, q) for a, q in found if q is not None and q.q is not None]


def int8_capable(g: LintGraph, node: Any) -> bool:
    """An op that runs INT8 when its inputs are quantized: weighted, pooling, data movement or a
    quantizable pointwise op."""
    op = node.op_type
    return g.weighted(node) or op in _QUANTIZABLE or op in _QUANTIZABLE_PW or g.global_pool(node)


def _unfused(g: LintGraph, node: Any) -> str:
    """Why a weighted op whose inputs do not share one quantized format runs float."""
    act = g.qinput(node.input[0])
    weight = g.weight_dq(node.input[1]) if len(node.input) > 1 else None
    if act is None or weight is None:
        return "not both inputs quantized"
    a, w = FORMATS[act.fmt].label, FORMATS[g.qdq_format(weight)].label
    return f"activation {a}, weights {w}: no mixed-format kernel"


def _shape_nodes(g: LintGraph) -> set[int]:
    """Nodes that compute only build-time tensors (shapes, and anything computed from constants
    and shapes alone, :meth:`LintGraph.folded_node`): folded by the builder, not engine layers."""
    return {id(n) for n in g.nodes if g.folded_node(n)}


def _scale(g: LintGraph, q: Any) -> tuple[float, ...]:
    value = g.const.get(q.input[1]) if len(q.input) > 1 else None
    return tuple(float(v) for v in value.flatten()) if value is not None else ()


def _bias(g: LintGraph, node: Any) -> bool:
    return node.op_type in ("Add", "Mul") and _const_add(g, node)


def _const_add(g: LintGraph, node: Any) -> bool:
    return len(node.input) == 2 and sum(g.is_const(i) for i in node.input) == 1


def _other_float(g: LintGraph, add: Any, members: list[Any]) -> bool:
    """The residual Add's operand that is not the group's own tensor is read in float."""
    own = {o for m in members for o in m.output}
    other = [i for i in add.input if i not in own]
    return bool(other) and g.qinput(other[0]) is None


def _silu(g: LintGraph, tensor: str, readers: list[Any]) -> str | None:
    """If ``tensor`` feeds exactly Sigmoid(tensor) and Mul(tensor, sigmoid), the Mul output."""
    if len(readers) != 2 or {r.op_type for r in readers} != {"Sigmoid", "Mul"}:
        return None
    sig = next(r for r in readers if r.op_type == "Sigmoid")
    mul = next(r for r in readers if r.op_type == "Mul")
    return str(mul.output[0]) if set(mul.input) == {tensor, sig.output[0]} else None


def _dynamic_quantize(node: Any) -> bool:
    """TensorRT's dynamic block quantizer (``trt::TRT_FP4DynamicQuantize``, ...): a layer of its
    own that writes the block values and scales its DequantizeLinear readers read."""
    return node.domain == "trt" and node.op_type in DYNAMIC_QUANTIZE


def _nearest(node: Any) -> bool:
    """A nearest-neighbour Resize (INT8 between INT8 layers on TensorRT >= 8.6)."""
    if node.op_type != "Resize":
        return False
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
    return mode in (b"nearest", "nearest")
