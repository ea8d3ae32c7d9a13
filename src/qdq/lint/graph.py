"""A read-only index of a Q/DQ ONNX graph for the linter: who produces and consumes each tensor,
which inputs arrive through DequantizeLinear (with what scale, in which format: INT8 or FP8), which
ops are weighted."""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from qdq.lint.formats import FORMATS, INT8, dequantize_scale, is_dequantize, qdq_format

__all__ = ["EPILOGUE_OPS", "WEIGHTED_OPS", "LintGraph", "QInput", "topological_order"]

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
EPILOGUE_OPS = frozenset(
    {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Mul", "HardSwish", "Add"}
)
COPY_OPS = frozenset(
    {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast"}
)
_CONST_THROUGH = COPY_OPS | {"QuantizeLinear"}  # and every DequantizeLinear (is_dequantize)
# data movement a DequantizeLinear propagates forward across (rule P10, TensorRT's
# VanillaSwapWithFollowingQ): a Slice/Split of a Q/DQ'd tensor is an INT8 operand of its reader,
# e.g. the upstream QuantLSTM's ``[x | h]`` and ``[w_ih | w_hh]``, quantized once and split in two
_DQ_FORWARD = frozenset({"Slice", "Split"})
_QINPUT_THROUGH = COPY_OPS | {"Pad"} | _DQ_FORWARD
# ops whose inputs after the first are shapes, axes, pads or sizes, not data
_SHAPE_OPERANDS = frozenset(
    {"Reshape", "Squeeze", "Unsqueeze", "Slice", "Resize", "Upsample", "Expand", "Tile", "Pad",
     "Split", "TopK"}
)  # fmt: skip


@dataclass(frozen=True)
class QInput:
    """An input that arrives through Q → DQ: the float tensor quantized, its scale and format
    (``"int8"`` or ``"fp8"``, :mod:`qdq.lint.formats`)."""

    source: str  # the float tensor entering QuantizeLinear
    scale: tuple[float, ...]
    q: Any
    dq: Any
    fmt: str = INT8


class LintGraph:
    """Index over ``model.graph`` (no copies of tensors beyond constants)."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.model = model
        self.graph = model.graph
        self.nodes = list(model.graph.node)
        self.const: dict[str, np.ndarray] = {
            i.name: numpy_helper.to_array(i) for i in model.graph.initializer
        }
        for n in self.nodes:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.const[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        #: nodes on a cycle, or reading one (empty for a valid graph: the rules assume a DAG)
        self.cyclic: list[Any] = []
        ordered, self.cyclic = topological_order(self.nodes, self.producer)
        if not self.cyclic:  # ONNX requires graph order to be topological; TensorRT sorts it
            self.nodes = ordered
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for n in self.nodes:  # data reads only: a Reshape's shape operand is not a use
            for k, i in enumerate(n.input):
                if i and not (k > 0 and n.op_type in _SHAPE_OPERANDS):
                    self.consumers[i].append(n)
        self.inputs = {i.name for i in model.graph.input} - set(self.const)
        self.outputs = {o.name for o in model.graph.output}
        #: analyses that modules above this one derive from the graph, each made once per graph
        #: and kept here by its module (``"attention"``: :func:`qdq.lint.attention.attention_cores`)
        self.derived: dict[str, Any] = {}
        # memos of the per-tensor and per-node questions every rule asks (the graph is read-only):
        # answering them again for each reader made a node of N inputs cost N^2
        self._float_uses: dict[str, list[Any]] = {}
        self._quantized_uses: dict[str, list[tuple[Any, Any, tuple[float, ...]]]] = {}
        self._shape_only: dict[int, bool] = {}
        self._is_const: dict[str, bool] = {}
        self._qinput: dict[str, QInput | None] = {}
        self._qdq_format: dict[int, str] = {}
        self._weighted_format: dict[int, str | None] = {}

    def name(self, node: Any) -> str:
        """A node's name, or its first output when unnamed (its op type when it has neither)."""
        return str(node.name or (node.output[0] if node.output else node.op_type))

    def is_const(self, tensor: str) -> bool:
        """Whether ``tensor`` is a constant, possibly through Q/DQ/Cast/Transpose/Reshape."""
        known = self._is_const.get(tensor)
        if known is not None:
            return known
        walked = [tensor]
        node = self.producer.get(tensor)
        while (
            node is not None
            and (node.op_type in _CONST_THROUGH or is_dequantize(node))
            and node.input
        ):
            tensor = node.input[0]
            if tensor in self._is_const or len(walked) > len(self.nodes):  # (a cycle)
                break
            walked.append(tensor)
            node = self.producer.get(tensor)
        found = self._is_const.get(tensor, tensor in self.const)
        self._is_const.update(dict.fromkeys(walked, found))
        return found

    def qinput(self, tensor: str) -> QInput | None:
        """If ``tensor`` is a DequantizeLinear output (possibly through copy ops, zero Pad, Slice and
        Split, which DQ propagates forward across) fed by a QuantizeLinear, describe it."""
        if tensor in self._qinput:
            return self._qinput[tensor]
        walked = [tensor]  # every copy on the way describes the same input
        dq = self.producer.get(tensor)
        while dq is not None and dq.op_type in _QINPUT_THROUGH and dq.input:
            if dq.input[0] in self._qinput or len(walked) > len(self.nodes):  # (a cycle)
                found = self._qinput.get(dq.input[0])
                break
            walked.append(dq.input[0])
            dq = self.producer.get(dq.input[0])
        else:
            found = self._describe(dq)
        self._qinput.update(dict.fromkeys(walked, found))
        return found

    def _describe(self, dq: Any) -> QInput | None:
        if dq is None or not is_dequantize(dq) or len(dq.input) < 2:
            return None
        q = self.producer.get(dq.input[0])
        scale = self.const.get(dq.input[1])
        values = (
            tuple(float(v) for v in dequantize_scale(dq, scale).flat) if scale is not None else ()
        )
        fmt = self.qdq_format(dq)
        if q is None or q.op_type != "QuantizeLinear":
            return QInput(dq.input[0], values, None, dq, fmt)  # pre-quantized constant (DQ-only)
        return QInput(q.input[0], values, q, dq, fmt)

    def qdq_format(self, node: Any) -> str:
        """The format (``"int8"``/``"fp8"``) a QuantizeLinear writes or a DequantizeLinear reads
        (:func:`qdq.lint.formats.qdq_format`; once per node)."""
        key = id(node)
        if key not in self._qdq_format:
            self._qdq_format[key] = qdq_format(node, self.const, self.producer, self.consumers)
        return self._qdq_format[key]

    def quantized_uses(self, tensor: str) -> list[tuple[Any, Any, tuple[float, ...]]]:
        """(Q node, final consumer, scale) for every use of ``tensor`` through Q → DQ (one list
        per tensor, made once: read it, do not change it)."""
        found = self._quantized_uses.get(tensor)
        if found is not None:
            return found
        out: list[tuple[Any, Any, tuple[float, ...]]] = []
        for q in _once(self.consumers.get(tensor, [])):
            if q.op_type != "QuantizeLinear":
                continue
            for dq in _once(self.consumers.get(q.output[0], [])):
                if not is_dequantize(dq) or len(dq.input) < 2:
                    continue
                scale = tuple(
                    float(v) for v in np.asarray(self.const.get(dq.input[1], [])).flatten()
                )
                out.extend((q, c, scale) for c in self.consumers.get(dq.output[0], []))
        self._quantized_uses[tensor] = out
        return out

    def float_uses(self, tensor: str) -> list[Any]:
        """Consumers reading ``tensor`` directly in float (not Q, not Shape, not a Cast or copy op
        whose result only reaches Shape or nothing: the TorchScript tracer emits ``Cast -> Shape``
        for a traced ``x.shape`` and leaves unused Casts). One list per tensor, made once: read
        it, do not change it."""
        found = self._float_uses.get(tensor)
        if found is None:
            found = self._float_uses[tensor] = [
                c
                for c in self.consumers.get(tensor, [])
                if c.op_type not in ("QuantizeLinear", "Shape") and not self.shape_only(c)
            ]
        return found

    def shape_only(self, node: Any) -> bool:
        """A Cast/copy op whose outputs are read only by Shape (through more such ops) or by no node
        (an unused Cast, or the TorchScript exporter's ``Cast`` in front of a graph output: a
        graph output read directly is no float consumer either, as in the dynamo export)."""
        if node.op_type not in COPY_OPS:
            return False
        known = self._shape_only.get(id(node))
        if known is not None:
            return known
        # depth first without recursion (a chain of 10^5 copies): a node is decided once the copy
        # ops reading it are; on a cycle (a graph V14 rejects) an undecided reader counts as float
        memo, stack, expanded = self._shape_only, [node], set()
        while stack:
            cur = stack[-1]
            if id(cur) in memo:
                stack.pop()
                continue
            readers = [c for o in cur.output if o for c in self.consumers.get(o, [])]
            pending = [c for c in readers if c.op_type in COPY_OPS and id(c) not in memo]
            if pending and id(cur) not in expanded:
                expanded.add(id(cur))
                stack.extend(pending)
                continue
            memo[id(cur)] = all(c.op_type == "Shape" or memo.get(id(c), False) for c in readers)
            stack.pop()
        return self._shape_only[id(node)]

    def global_pool(self, node: Any) -> bool:
        """GlobalAveragePool, or a ReduceMean over every spatial axis (2 .. rank-1) of its input:
        ``torch.mean(x, (2, 3))`` and the dynamo exporter's ``adaptive_avg_pool2d(x, 1)``, with or
        without ``keepdims``. TensorRT's ONNX parser imports both as the same average Reduce layer
        over the spatial axes, which the builder runs as a pooling kernel."""
        if node.op_type == "GlobalAveragePool":
            return True
        if node.op_type != "ReduceMean" or not node.input:
            return False
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
        if axes is None and len(node.input) > 1 and node.input[1] in self.const:  # opset >= 18
            axes = [int(v) for v in np.asarray(self.const[node.input[1]]).flatten()]
        rank = self.ranks.get(node.input[0])
        if not axes or rank is None or rank < 3:
            return False
        return sorted(a % rank for a in axes) == list(range(2, rank))

    @cached_property
    def ranks(self) -> dict[str, int]:
        """The rank of every tensor whose shape ONNX shape inference (or the file) knows."""
        import onnx

        try:
            model = onnx.shape_inference.infer_shapes(self.model)
        except Exception:  # best effort: what the file declares
            model = self.model
        g = model.graph
        return {
            vi.name: len(vi.type.tensor_type.shape.dim)
            for vi in [*g.value_info, *g.input, *g.output]
            if vi.type.tensor_type.HasField("shape")
        } | {name: value.ndim for name, value in self.const.items()}

    @cached_property
    def folded(self) -> frozenset[str]:
        """Tensors TensorRT knows at build time: constants, ``Shape`` outputs (the linter assumes
        static input shapes, as it does for shape computations) and every output of a node all of
        whose inputs are such tensors. A layer computing one is evaluated once by the builder's
        constant folding (or by ``polygraphy surgeon sanitize --fold-constants`` before parsing):
        no engine layer runs it, e.g. Swin-V2's position-bias MLP on its fixed coordinate table."""
        known = set(self.const)
        for n in self.nodes:  # graph order is topological
            ins = [i for i in n.input if i]
            if n.op_type == "Shape" or (ins and all(i in known for i in ins)):
                known.update(o for o in n.output if o)
        return frozenset(known)

    def folded_node(self, node: Any) -> bool:
        """Whether ``node`` computes only build-time tensors (:attr:`folded`) from a tensor input:
        a Shape, or an op reading nothing but constants and shapes. Constants themselves and
        ``Constant`` nodes are not counted."""
        ins = [i for i in node.input if i]
        return bool(ins) and (node.op_type == "Shape" or all(i in self.folded for i in ins))

    def gemm_kn(self, node: Any) -> tuple[int, int] | None:
        """``(K, N)`` of a weighted MatMul/Gemm from its constant weight, or ``None``."""
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            return None
        tensor = node.input[1]
        w = self.qinput(tensor)
        weight = self.const.get(w.source if w is not None else tensor)
        src = self.producer.get(tensor)
        while weight is None and src is not None and src.op_type in COPY_OPS:
            tensor = src.input[0]
            weight = self.const.get(tensor)
            src = self.producer.get(tensor)
        if weight is None or weight.ndim < 2:
            return None
        k, n = int(weight.shape[-2]), int(weight.shape[-1])
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return (n, k) if node.op_type == "Gemm" and trans_b else (k, n)

    def weighted(self, node: Any) -> bool:
        """Conv/ConvTranspose/Gemm, or MatMul with a constant second operand."""
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            return False
        return node.op_type != "MatMul" or self.is_const(node.input[1])

    def weighted_format(self, node: Any) -> str | None:
        """The format a weighted op computes in: its activation and its weight both arrive through
        DequantizeLinear in that format, or its weight in a weight-only format (INT4) and its
        activation in float. ``None`` when either is float or the two formats differ (an FP8
        activation with INT8 weights has no kernel: rule F05). Computed once per node."""
        key = id(node)
        if key not in self._weighted_format:
            self._weighted_format[key] = self._weighted_format_of(node)
        return self._weighted_format[key]

    def _weighted_format_of(self, node: Any) -> str | None:
        if not self.weighted(node):
            return None
        act = self.qinput(node.input[0])
        weight = self.weight_dq(node.input[1])
        if weight is None:
            return None
        fmt = self.qdq_format(weight)
        if FORMATS[fmt].weight_only:  # INT4 weights with a float activation
            return fmt if act is None else None
        if act is None:
            return None
        return fmt if fmt == act.fmt else None

    def quantized_weighted(self, node: Any) -> bool:
        """A weighted op that runs quantized (INT8 or FP8: :meth:`weighted_format`)."""
        return self.weighted_format(node) is not None

    def int8_weighted(self, node: Any) -> bool:
        """A weighted op whose activation and weight both arrive through INT8 DequantizeLinear."""
        return self.weighted_format(node) == INT8

    def dq_weight(self, tensor: str) -> bool:
        """Whether a weight operand arrives through DequantizeLinear (possibly through copies)."""
        return self.weight_dq(tensor) is not None

    def split_back(self, concat: Any) -> bool:
        """Whether a Concat's output is read only through Q -> DQ -> Slice/Split by weighted ops
        (Shape reads aside): it exists to give several GEMM operands one scale, as the upstream
        QuantLSTM's ``[x | h]``, and TensorRT moves its Quantize onto each input."""
        readers = [c for c in self.consumers.get(concat.output[0], []) if c.op_type != "Shape"]
        if not readers:
            return False
        for q in readers:
            dqs = self.consumers.get(q.output[0], []) if q.op_type == "QuantizeLinear" else []
            if not dqs or any(not is_dequantize(dq) for dq in dqs):
                return False
            for dq in dqs:
                cuts = self.consumers.get(dq.output[0], [])
                if not cuts or any(c.op_type not in _DQ_FORWARD for c in cuts):
                    return False
                users = [u for c in cuts for o in c.output for u in self.consumers.get(o, [])]
                if not users or not all(self.weighted(u) for u in users):
                    return False
        return True

    def weight_dq(self, tensor: str) -> Any:
        """The DequantizeLinear a weight operand arrives through (looking through copies, Slice and
        Split), or ``None``."""
        node = self.producer.get(tensor)
        while node is not None and (node.op_type in COPY_OPS or node.op_type in _DQ_FORWARD):
            node = self.producer.get(node.input[0])
        return node if node is not None and is_dequantize(node) else None

    def backbone(self, tensor: str) -> Any:
        """The weighted op whose epilogue chain ends in ``tensor`` (each step read only by the
        next; Q readers and Shape ignored), or ``None``. Follows BN, Relu/Clip/LeakyRelu, bias
        Add, copies and SiLU (x * sigmoid(x))."""
        cur = tensor
        while True:
            node = self.producer.get(cur)
            if node is None:
                return None
            if self.weighted(node):
                return node
            nxt = self._epilogue_input(node)
            if nxt is None:
                return None
            readers = [
                c
                for c in self.consumers.get(nxt, [])
                if c.op_type not in ("Shape", "QuantizeLinear")
            ]
            if len(readers) > (2 if node.op_type == "Mul" else 1):
                return None
            cur = nxt

    def reorder_source(self, concat: Any) -> str | None:
        """The one tensor a Concat reorders, or ``None``: every data input is a Slice or Split of
        that tensor, or another such Concat of it. A cyclic shift (``torch.roll``, which both
        exporters write as two Slices and a Concat per rolled axis: Swin's shifted windows) is
        one. It is data movement: TensorRT splits a Quantize after the Concat into its inputs
        (SplitQAcrossPrecedingFanIn), swaps each with its Slice (VanillaSwapWithFollowingQ) and
        merges the copies on the source (HorizontalMergeQNodes): one Quantize on the source."""
        sources: set[str] = set()
        for i in concat.input:
            if not i or self.is_const(i):
                continue
            node = self.producer.get(i)
            if node is None:
                return None
            if node.op_type in ("Slice", "Split") and node.input:
                sources.add(node.input[0])
            elif node.op_type == "Concat" and node is not concat:
                inner = self.reorder_source(node)
                if inner is None:
                    return None
                sources.add(inner)
            else:
                return None
        return next(iter(sources)) if len(sources) == 1 else None

    def _epilogue_input(self, node: Any) -> str | None:
        op = node.op_type
        if op in ("BatchNormalization", "Relu", "Clip", "LeakyRelu", "HardSwish") or op in COPY_OPS:
            return str(node.input[0])
        if op in ("Add", "Mul") and len(node.input) == 2:  # a bias, or a scale (LayerScale)
            consts = [self.is_const(i) for i in node.input]
            if consts.count(True) == 1:
                return str(node.input[consts.index(False)])
        if op == "Mul" and len(node.input) == 2:  # SiLU: x * sigmoid(x)
            for a, b in (node.input, node.input[::-1]):
                sig = self.producer.get(b)
                if sig is not None and sig.op_type == "Sigmoid" and sig.input[0] == a:
                    return str(a)
        return None


def _once(nodes: list[Any]) -> list[Any]:
    """``nodes`` without repeats (a node reading a tensor twice is one reader), in order."""
    return list({id(n): n for n in nodes}.values())


def topological_order(nodes: list[Any], producer: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """``nodes`` in an order where every node comes after the producers of its inputs (graph
    order where it allows), and the nodes that have no such place: those on a cycle (a self-loop
    included) or reading one. Kahn's algorithm, linear in the graph's size.

    Example:
        >>> from onnx import helper
        >>> a = helper.make_node("Relu", ["b"], ["a"], name="A")
        >>> b = helper.make_node("Relu", ["a"], ["b"], name="B")
        >>> order, cyclic = topological_order([a, b], {"a": a, "b": b})
        >>> order, [n.name for n in cyclic]
        ([], ['A', 'B'])
    """
    index = {id(n): k for k, n in enumerate(nodes)}
    waiting = [0] * len(nodes)  # producers each node still waits for
    readers: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(nodes):
        deps = {index[id(p)] for i in n.input if i and (p := producer.get(i)) is not None}
        waiting[k] = len(deps)
        for d in deps:
            readers[d].append(k)
    ready = [k for k in range(len(nodes)) if not waiting[k]]
    heapq.heapify(ready)  # the lowest graph position first: graph order when it is topological
    order: list[Any] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for r in readers.get(k, []):
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, r)
    cyclic = [n for k, n in enumerate(nodes) if waiting[k]]
    return order, cyclic
