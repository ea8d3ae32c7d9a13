"""The linter's predicted engine as the time model's layers: shapes, work and bytes from the ONNX.

:func:`cost_layers` turns each :class:`~qdq.lint.layer.PredictedLayer` into one
:class:`~qdq.lint.speed.cost.CostLayer`: the multiply-accumulates of its convolution, GEMM or
fused attention core from the shapes ONNX shape inference gives (a dynamic input dimension needs a
size: ``shapes``, ``qdq lint --shape NAME:1x3x224x224``), the activations it reads at its input
precision and writes at its output precision (INT8/FP8 one byte, FP16 two, FP32 four), and its
weights at theirs (INT8/FP8 for a quantized weighted layer, the float precision otherwise). It
adds the reformats TensorRT's builder inserts where a tensor is written at one precision and read
at another without a standalone Quantize/Dequantize between them (the network input, FP32 in the
ONNX, read by an FP16 layer; an FP16 layer writing an FP32 network output), named as TensorRT
names them ("Reformatting CopyNode for Input Tensor 0 to ...").

:func:`strip_qdq` (:mod:`qdq.lint.speed.strip`) is the same model without its Q/DQ: the FP16 build
of the same structure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from qdq.lint.formats import DYNAMIC_QUANTIZE, INT4W, is_quantized
from qdq.lint.graph import COPY_OPS, LintGraph
from qdq.lint.layer import PLUGIN, PredictedLayer
from qdq.lint.speed.cost import ELEMENT_BYTES, CostLayer
from qdq.lint.speed.shapes import infer_shapes
from qdq.lint.speed.strip import strip_qdq

__all__ = ["EngineLayer", "cost_layers", "engine_layers", "strip_qdq"]


_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
#: nodes the predictor puts in no layer that pass a tensor on unchanged in size
_THROUGH = COPY_OPS | _QDQ
#: ops whose inputs after the first are shapes, axes, pads or sizes, not data (as the linter)
_SHAPE_OPERANDS = frozenset(
    {"Reshape", "Squeeze", "Unsqueeze", "Slice", "Resize", "Upsample", "Expand", "Tile", "Pad",
     "Split", "TopK"}
)  # fmt: skip
_COPY = frozenset(
    {"Reshape", "Transpose", "Slice", "Resize", "Upsample", "Split", "Pad", "Expand", "Tile",
     "Gather", "GatherElements", "GatherND", "ScatterND", "Flatten", "Squeeze", "Unsqueeze",
     "DepthToSpace", "SpaceToDepth", "Identity", "Cast", "Where"}
)  # fmt: skip
_NORM = frozenset(
    {"LayerNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization",
     "LpNormalization", "MeanVarianceNormalization"}
)  # fmt: skip
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64"}
_KIND_OP = {"attention": "attention", "pooling": "pool", "pointwise": "pointwise",
            "concat": "concat", "qdq": "qdq", "plugin": "other"}  # fmt: skip
_WEIGHTED_OP = {"Conv": "conv", "ConvTranspose": "deconv", "Gemm": "gemm", "MatMul": "gemm"}


@dataclass(frozen=True)
class EngineLayer:
    """One layer of the engine as the time model sees it, with where it sits.

    Attributes:
        cost: the time model's layer.
        nodes: the ONNX nodes it runs (empty for a builder reformat).
        kind: the predicted layer's kind, or ``"reformat"``.
        quantized: it computes in INT8 or FP8.
        sources: indices of the layers (in the same list) whose outputs it reads.
        sized: shape inference told every shape it needs (else its work and bytes are 0: the
            launch floor only).
        reason: why the predicted layer is float or standalone, or what a reformat converts.
    """

    cost: CostLayer
    nodes: tuple[str, ...]
    kind: str
    quantized: bool
    sources: frozenset[int] = field(default=frozenset())
    sized: bool = True
    reason: str = ""


def cost_layers(
    proto: Any,
    layers: Sequence[PredictedLayer],
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[CostLayer]:
    """One :class:`CostLayer` per predicted layer, with the builder's reformats inserted.

    Args:
        proto: the ``onnx.ModelProto`` the layers were predicted from.
        layers: :attr:`qdq.lint.LintReport.layers` or :func:`qdq.lint.predict.predict_layers`.
        shapes: sizes of graph inputs, ``{name: dims}`` (a dynamic batch set to 32); they replace
            the declared dims.

    Raises:
        ValueError: an input has a dynamic dimension and no size in ``shapes``, ``shapes`` names
            no input or has the wrong rank, or shape inference cannot tell a layer's shapes.
        TypeError: ``shapes`` is not a mapping of names to sequences of ints.
    """
    found = engine_layers(proto, layers, shapes=shapes)
    unsized = [e.cost.name for e in found if not e.sized]
    if unsized:
        raise ValueError(
            f"ONNX shape inference cannot tell the shapes of {len(unsized)} layers "
            f"(first: {unsized[0]!r}); give every input's size with --shape NAME:1x3x224x224"
        )
    return [e.cost for e in found]


def engine_layers(
    proto: Any,
    layers: Sequence[PredictedLayer],
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    graph: LintGraph | None = None,
) -> list[EngineLayer]:
    """:func:`cost_layers` with each layer's place (its sources) and whether it could be sized; a
    layer shape inference cannot size is kept at zero work and bytes (``sized=False``)."""
    g = graph if graph is not None else LintGraph(proto)
    dims, types = infer_shapes(proto, g, shapes)
    return _Builder(g, dims, types, layers).run()


# ------------------------------------------------------------------ layers
class _Builder:
    def __init__(
        self,
        g: LintGraph,
        dims: dict[str, tuple[int, ...]],
        types: dict[str, int],
        layers: Sequence[PredictedLayer],
    ) -> None:
        self.g, self.dims, self.types, self.layers = g, dims, types, list(layers)
        self.by_name = {g.name(n): n for n in g.nodes}
        floats = [p for ly in self.layers for p in (ly.input_precision, ly.output_precision)]
        self.fp = next((p for p in floats if p in _FLOAT_TYPES.values()), "fp16")
        self.owner: dict[int, int] = {}  # id(node) -> index of its predicted layer
        for k, ly in enumerate(self.layers):
            for x in ly.nodes:
                node = self.by_name.get(x)
                if node is not None:
                    self.owner.setdefault(id(node), k)
        self._cuda_core_outputs()
        self.out: list[EngineLayer] = []
        self.index: dict[int, int] = {}  # predicted layer -> index in self.out
        self.reformats: dict[tuple[str, str], int] = {}  # (tensor, to precision) -> index

    def run(self) -> list[EngineLayer]:
        for k, ly in enumerate(self.layers):
            members = [self.by_name[x] for x in ly.nodes if x in self.by_name]
            inside = {o for m in members for o in m.output if o}
            reads = self._reads(ly, members, inside)
            sources: set[int] = set()
            for tensor, precision in reads:
                src = self._source_of(ly, tensor, precision, len(sources))
                if src is not None:
                    sources.add(src)
            cost, sized = self._cost(ly, members, inside, reads)
            self.index[k] = len(self.out)
            self.out.append(
                EngineLayer(
                    cost,
                    ly.nodes,
                    ly.kind,
                    ly.quantized and ly.kind != "qdq",
                    frozenset(sources),
                    sized,
                    ly.reason,
                )
            )
        self._output_reformats()
        return self.out

    def _cuda_core_outputs(self) -> None:
        """Kernel rule K07 (docs/engine_time.md). A dense 8-bit convolution whose input channels
        do not fill the tensor cores' vectors (the 3-channel stem) runs a CUDA-core ``int8x4``
        kernel, which writes FP32 when its output is float; the float pooling and element-wise
        layers that read only that tensor then run in FP32 too, and the builder reformats after
        them (the A100 Q/DQ ResNet-18 engine: stem INT8 -> FP32, MaxPool FP32, a reformat to FP16
        before the next Quantize)."""
        fp32: set[int] = set()  # indices of layers now writing FP32
        for k, ly in enumerate(self.layers):
            members = [self.by_name[x] for x in ly.nodes if x in self.by_name]
            if (
                ly.kind == "weighted" and ly.quantized and members
                and members[0].op_type == "Conv" and not is_quantized(ly.output_precision)
                and ly.output_precision != "fp32"
            ):  # fmt: skip
                work = self._weighted(members[0])
                channels = work[3] if work is not None and work[2] == 1 else 0  # dense only
                align = int(16 / ELEMENT_BYTES.get(ly.input_precision, 1.0))
                if channels > 0 and channels % align:
                    self.layers[k] = replace(ly, output_precision="fp32")
                    fp32.add(k)
            elif ly.kind in ("pooling", "pointwise") and not ly.quantized and members:
                sources = {
                    self._origin(t)[1]
                    for m in members
                    for t in m.input
                    if t
                    and not self.g.is_const(t)
                    and t not in {o for x in members for o in x.output}
                }
                if sources and sources <= fp32:
                    self.layers[k] = replace(ly, input_precision="fp32", output_precision="fp32")
                    fp32.add(k)

    # ---------------------------------------------------------------- reads and writes
    def _reads(
        self, ly: PredictedLayer, members: list[Any], inside: set[str]
    ) -> list[tuple[str, str]]:
        """(tensor, precision it is read at) for each activation the layer reads."""
        g = self.g
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for m in members:
            for k, t in enumerate(m.input):
                if not t or t in inside or t in seen or g.is_const(t) or t in g.folded:
                    continue
                if k > 0 and (m.op_type in _SHAPE_OPERANDS or m.op_type in _QDQ):
                    continue
                seen.add(t)
                out.append((t, self._read_precision(ly, members, m, k)))
        return out

    def _read_precision(self, ly: PredictedLayer, members: list[Any], m: Any, k: int) -> str:
        if ly.input_precision == INT4W:  # weight-only: the activation is read in float
            return self.fp
        if ly.kind == "weighted" and not (m is members[0] and k == 0):
            return ly.output_precision  # a fused residual Add reads in the output's precision
        if ly.kind == "attention" and m.op_type != "MatMul":
            return ly.output_precision if not is_quantized(ly.output_precision) else self.fp
        return ly.input_precision

    def _writes(self, members: list[Any], inside: set[str]) -> list[str]:
        g = self.g
        ids = {id(m) for m in members}
        return [
            o
            for m in members
            # a dynamic block quantize's block scales are in its values' bytes per value
            for o in (m.output[:1] if m.domain == "trt" and m.op_type in DYNAMIC_QUANTIZE
                      else m.output)
            if o and (o in g.outputs or any(id(c) not in ids for c in g.consumers.get(o, [])))
        ]  # fmt: skip

    def _source_of(self, ly: PredictedLayer, tensor: str, precision: str, slot: int) -> int | None:
        """The index of the layer (or reformat) the layer reads ``tensor`` from; adds a reformat
        where the precision written differs from the one read."""
        origin, src = self._origin(tensor)
        if src is None:  # a network input
            written = _FLOAT_TYPES.get(self.types.get(origin, 0))
            writer = None
        else:
            writer = self.index.get(src)
            written = self.layers[src].output_precision
        if (
            written is None
            or ly.kind == "qdq"
            or (src is not None and self.layers[src].kind == "qdq")
            or written == precision
            or PLUGIN in (written, precision)
            or self.types.get(tensor, 1) not in _FLOAT_TYPES
        ):
            return writer
        key = (origin, precision)
        if key not in self.reformats:
            n = self._count(tensor)
            name = f"Reformatting CopyNode for Input Tensor {slot} to {ly.name}"
            cost = CostLayer(
                name, "reformat", precision,
                read_bytes=(n or 0) * _bytes(written), write_bytes=(n or 0) * _bytes(precision),
            )  # fmt: skip
            self.reformats[key] = len(self.out)
            self.out.append(
                EngineLayer(
                    cost,
                    (),
                    "reformat",
                    False,
                    frozenset() if writer is None else frozenset({writer}),
                    n is not None,
                    f"{written} -> {precision}",
                )
            )
        return self.reformats[key]

    def _origin(self, tensor: str) -> tuple[str, int | None]:
        """The tensor a layer wrote (or the network input) that ``tensor`` is, through the copy
        and fused Q/DQ nodes no layer runs, and that layer's index in the predicted list."""
        node = self.g.producer.get(tensor)
        for _ in range(len(self.g.nodes) + 1):
            if node is None:
                return tensor, None
            k = self.owner.get(id(node))
            if k is not None:
                return tensor, k
            if node.op_type not in _THROUGH or not node.input:
                return tensor, None
            tensor = node.input[0]
            node = self.g.producer.get(tensor)
        return tensor, None

    def _output_reformats(self) -> None:
        """An FP16 layer writing an FP32 network output: a reformat after it."""
        for vi in self.g.graph.output:
            want = _FLOAT_TYPES.get(vi.type.tensor_type.elem_type)
            _, src = self._origin(vi.name)
            if want is None or src is None:
                continue
            ly = self.layers[src]
            written = ly.output_precision
            if written in (want, PLUGIN) or ly.kind == "qdq":
                continue
            n = self._count(vi.name)
            name = f"Reformatting CopyNode for Output Tensor 0 to {ly.name}"
            cost = CostLayer(
                name, "reformat", want,
                read_bytes=(n or 0) * _bytes(written), write_bytes=(n or 0) * _bytes(want),
            )  # fmt: skip
            self.out.append(
                EngineLayer(
                    cost,
                    (),
                    "reformat",
                    False,
                    frozenset({self.index[src]}),
                    n is not None,
                    f"{written} -> {want}",
                )
            )

    # ---------------------------------------------------------------- work
    def _cost(
        self,
        ly: PredictedLayer,
        members: list[Any],
        inside: set[str],
        reads: list[tuple[str, str]],
    ) -> tuple[CostLayer, bool]:
        g = self.g
        sized = True
        read = 0.0
        for t, precision in reads:
            n = self._count(t)
            sized &= n is not None
            read += (n or 0) * self._tensor_bytes(t, precision)
        write = 0.0
        for t in self._writes(members, inside):
            n = self._count(t)
            sized &= n is not None
            write += (n or 0) * self._tensor_bytes(t, ly.output_precision)
        op = _op(ly, members)
        macs, gemm, groups, per_group, weights = 0.0, None, 1, 0, 0.0
        if ly.kind == "weighted" and members:
            work = self._weighted(members[0])
            sized &= work is not None
            if work is not None:
                macs, gemm, groups, per_group = work
            weights = self._weights(ly, members[0])
        elif op == "attention" or (op == "gemm" and members):
            products = [m for m in members if m.op_type == "MatMul"]
            works = [self._matmul(m) for m in products]
            sized &= all(w is not None for w in works)
            known = [w for w in works if w is not None]
            macs = sum(w[0] for w in known)
            if known:
                gemm, groups = known[0][1], known[0][2]
        else:  # constants a memory layer reads (a positional embedding, a LayerNorm's gain)
            for m in members:
                for k, t in enumerate(m.input):
                    skip = k > 0 and (m.op_type in _SHAPE_OPERANDS or m.op_type in _QDQ)
                    if t and not skip and t in g.const and t not in inside:
                        weights += g.const[t].size * _bytes(self._float(ly.input_precision))
        precision = _shown_precision(ly, self.fp)
        if not sized:
            macs, read, write, weights, gemm = 0.0, 0.0, 0.0, 0.0, None
        cost = CostLayer(
            ly.name, op, precision, macs=float(macs), read_bytes=read, write_bytes=write,
            weight_bytes=weights, gemm=gemm, groups=groups, group_channels=per_group,
            out_precision=None if ly.output_precision == PLUGIN else ly.output_precision,
        )  # fmt: skip
        return cost, sized

    def _weighted(self, node: Any) -> tuple[float, tuple[int, int, int], int, int] | None:
        """(MACs, GEMM per group, groups, input channels per group) of a weighted op."""
        if node.op_type == "MatMul":
            found = self._matmul(node)
            return None if found is None else (found[0], found[1], 1, 0)
        y = self.dims.get(node.output[0])
        x = self.dims.get(node.input[0])
        w = self.dims.get(node.input[1]) if len(node.input) > 1 else None
        if y is None or x is None or w is None:
            return None
        if node.op_type == "Gemm":
            trans_a = any(a.name == "transA" and a.i for a in node.attribute)
            k = x[0] if trans_a else x[-1]
            m, n = y[0], y[-1]
            return float(m * n * k), (m, n, k), 1, 0
        groups = next((int(a.i) for a in node.attribute if a.name == "group"), 1) or 1
        kernel = math.prod(w[2:])
        if node.op_type == "Conv":  # w: [Cout, Cin/g, k...]
            cout, per_group = y[1], w[1]
            rows = y[0] * math.prod(y[2:])
            n_per, k_per = cout // groups, per_group * kernel
        else:  # ConvTranspose, w: [Cin, Cout/g, k...]: each input pixel scatters a k-window
            per_group = x[1] // groups
            rows = x[0] * math.prod(x[2:])
            n_per, k_per = w[1] * kernel, per_group
        macs = float(rows) * n_per * k_per * groups
        return macs, (rows, max(n_per, 1), max(k_per, 1)), groups, per_group

    def _matmul(self, node: Any) -> tuple[float, tuple[int, int, int], int] | None:
        """(MACs, (M, N, K), batch count) of a (batched) MatMul."""
        a = self.dims.get(node.input[0])
        y = self.dims.get(node.output[0])
        if a is None or y is None or not a:
            return None
        k = a[-1]
        if len(y) == 1:
            return float(y[0] * k), (1, y[0], k), 1
        rows = y[-2]
        batch = math.prod(y[:-2])
        if self.g.weighted(node):  # a constant right operand: one GEMM over all rows
            rows, batch = rows * batch, 1
        return float(math.prod(y) * k), (rows, y[-1], k), batch

    def _weights(self, ly: PredictedLayer, node: Any) -> float:
        precision = ly.input_precision if ly.quantized else self._float(ly.input_precision)
        total = 0.0
        for k, t in enumerate(node.input[1:3], start=1):
            if not t or not self.g.is_const(t):
                continue
            n = self._count(t)
            if n is None:
                continue
            bias = k == 2 and node.op_type != "MatMul"
            total += n * (4.0 if bias and ly.quantized else _bytes(precision))
        return total

    def _count(self, tensor: str) -> int | None:
        d = self.dims.get(tensor)
        return None if d is None else math.prod(d)

    def _tensor_bytes(self, tensor: str, precision: str) -> float:
        """Bytes per value of ``tensor`` read or written at ``precision`` (its own dtype's when
        it is not a float tensor: indices, masks)."""
        elem = self.types.get(tensor)
        if elem is not None and elem not in _FLOAT_TYPES and not _is_q_type(elem):
            return _onnx_bytes(elem)
        return _bytes(self._float(precision))

    def _float(self, precision: str) -> str:
        return self.fp if precision == PLUGIN else precision


def _op(ly: PredictedLayer, members: list[Any]) -> str:
    if ly.kind == "weighted":
        return _WEIGHTED_OP.get(members[0].op_type, "gemm") if members else "gemm"
    if ly.kind in _KIND_OP:
        return _KIND_OP[ly.kind]
    ops = {m.op_type for m in members}
    if ops & {"MatMul", "Gemm", "Conv", "ConvTranspose"}:
        return "gemm"
    if ops & _SOFTMAX:
        return "softmax"
    if ops & _NORM:
        return "norm"
    if any(o.startswith("Reduce") for o in ops):
        return "reduce"
    if ops and ops <= _COPY:
        return "copy"
    return "other"


def _shown_precision(ly: PredictedLayer, fp: str) -> str:
    """The precision a layer is shown and timed at: a standalone Q/DQ's quantized side, a
    plugin's float precision, the input precision otherwise."""
    if ly.kind == "qdq":
        return ly.output_precision if is_quantized(ly.output_precision) else ly.input_precision
    if ly.input_precision == PLUGIN:
        return fp
    return ly.input_precision


def _bytes(precision: str) -> float:
    return ELEMENT_BYTES.get(precision, 2.0)


def _is_q_type(elem: int) -> bool:
    """INT8/UINT8/FP8/INT4/UINT4/FP4/E8M0 element types (the quantized tensors between Q and DQ,
    and block scales)."""
    return elem in (2, 3, 17, 18, 19, 20, 21, 22, 23, 24)


def _onnx_bytes(elem: int) -> float:
    from onnx import helper

    try:
        return float(np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 4.0
