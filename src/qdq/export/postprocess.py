"""ONNX post-processing after torch's exporters (pure graph edits with the ``onnx`` package).

1. ``Identity`` nodes on constants (the TorchScript exporter's de-duplicated initializers) are
   removed, so every Q/DQ reads its scale and zero point straight from an initializer (TensorRT
   needs build-time constants, rule V09).
2. Every ``DequantizeLinear`` feeding several consumers is duplicated, one per consumer, so each
   consumer fuses its own DQ (ORT's ``DedicatedQDQPair``; the Quantize stays shared, one scale per
   tensor, rule S01).
3. Node names become module paths: ``layer1.0.conv1/Conv``,
   ``layer1.0.conv1.input_quantizer/QuantizeLinear`` (from the dynamo exporter's ``name_scopes``
   metadata or the TorchScript exporter's ``/layer1/0/conv1/Conv`` scopes).
4. A weight computed in ``forward`` from parameters alone (timm's ``StdConv2d`` standardizes its
   weight on every call), which the TorchScript exporter writes as the ops that compute it, is
   evaluated once and read from an initializer: TensorRT quantizes per channel only build-time
   constants (rule V05). The dynamo exporter's optimizer folds it already.
5. A ``ReduceMean`` over every spatial axis (the dynamo exporter's ``adaptive_avg_pool2d(x, 1)``,
   ``x.mean((2, 3))``) becomes ``GlobalAveragePool`` -- followed by a ``Squeeze`` of those axes
   when it did not keep them -- as the TorchScript exporter writes it: the same mean, and the op
   that TensorRT tooling and the linter know as a pool.
"""

from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from typing import Any

import numpy as np

__all__ = [
    "float32_io",
    "fold_computed_weights",
    "global_average_pools",
    "node_scope",
    "postprocess",
]

#: ops whose output is not a function of their inputs: never folded
_RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
)
#: a weight operand of these ops (input 1) is a weight, whatever its Q/DQ's granularity
_WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm"})


def postprocess(model: Any, quantizer_order: list[str] | None = None) -> Any:
    """Apply the five passes to ``model`` (an ``onnx.ModelProto``) in place and return it.

    ``quantizer_order``: the module paths of the quantizers in the order they ran while the
    TorchScript exporter traced; the i-th QuantizeLinear of the graph belongs to the i-th entry.
    (The dynamo exporter records each node's module path in metadata instead.)
    """
    _drop_constant_identities(model)
    fold_computed_weights(model)
    global_average_pools(model)
    _rename_nodes(model, quantizer_order)
    _dedicate_dequantize(model)
    return model


def _drop_constant_identities(model: Any) -> None:
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias: dict[str, str] = {}
    keep = []
    for node in graph.node:
        if (
            node.op_type == "Identity"
            and node.input[0] in constants
            and node.output[0] not in outputs
        ):
            alias[node.output[0]] = node.input[0]
            continue
        keep.append(node)
    if not alias:
        return
    for node in keep:
        for i, name in enumerate(node.input):
            if name in alias:
                node.input[i] = alias[name]
    del graph.node[:]
    graph.node.extend(keep)


def fold_computed_weights(model: Any) -> int:
    """Replace the input of each weight ``QuantizeLinear`` that is computed from initializers and
    constants alone by an initializer holding its value (evaluated with ONNX's reference
    runtime); the nodes that computed it are removed once nothing else reads them. A weight
    Quantize is one with a per-channel scale or whose Dequantize feeds input 1 of a
    Conv/ConvTranspose/Gemm. Returns how many were folded."""
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    constant = _constant_tensors(graph, inits, producers)
    targets = [
        q.input[0]
        for q in graph.node
        if q.op_type == "QuantizeLinear"
        and q.input[0] not in inits
        and q.input[0] in constant
        and _is_weight_quantize(graph, q, inits)
    ]
    targets = list(dict.fromkeys(targets))
    if not targets:
        return 0
    needed: set[int] = set()
    stack = list(targets)
    while stack:
        node = producers.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack.extend(i for i in node.input if i)
    nodes = [n for n in graph.node if id(n) in needed]
    read = sorted({i for n in nodes for i in n.input if i in inits})
    if any(inits[i].data_location == onnx.TensorProto.EXTERNAL for i in read):
        return 0  # weights in a separate file: left as exported (the linter says V05)
    sub = helper.make_graph(
        nodes,
        "computed_weights",
        [],
        [helper.make_empty_tensor_value_info(t) for t in targets],
        initializer=[inits[i] for i in read],
    )
    values = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(
        targets, {}
    )
    folded = {}
    for name, value in zip(targets, values, strict=True):
        folded[name] = f"{name}_folded"
        while folded[name] in producers or folded[name] in inits:
            folded[name] += "_"
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), folded[name]))
    for q in graph.node:
        if q.op_type == "QuantizeLinear" and q.input[0] in folded:
            q.input[0] = folded[q.input[0]]
    _drop_unread(graph, needed, set(read))
    return len(targets)


def _constant_tensors(graph: Any, inits: dict[str, Any], producers: dict[str, Any]) -> set[str]:
    """Tensors computed from initializers and ``Constant`` nodes alone (graph order)."""
    constant = set(inits)
    for node in graph.node:
        if node.op_type in _RANDOM_OPS:
            continue
        if node.op_type == "Constant" or all(not i or i in constant for i in node.input):
            constant.update(node.output)
    graph_inputs = {i.name for i in graph.input}
    return constant - (graph_inputs - set(inits))


def _is_weight_quantize(graph: Any, q: Any, inits: dict[str, Any]) -> bool:
    scale = inits.get(q.input[1]) if len(q.input) > 1 else None
    if scale is not None and int(np.prod(scale.dims)) > 1:
        return True
    dqs = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]]
    outs = {d.output[0] for d in dqs}
    return any(
        n.op_type in _WEIGHTED_OPS and len(n.input) > 1 and n.input[1] in outs for n in graph.node
    )


def _drop_unread(graph: Any, candidates: set[int], inits: set[str]) -> None:
    """Remove the ``candidates`` nodes (ids) and ``inits`` initializers nothing reads any more."""
    outputs = {o.name for o in graph.output}
    nodes = list(graph.node)
    while True:
        read = {i for n in nodes for i in n.input} | outputs
        alive = [n for n in nodes if id(n) not in candidates or any(o in read for o in n.output)]
        if len(alive) == len(nodes):
            break
        nodes = alive
    if len(nodes) < len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)
    read = {i for n in graph.node for i in n.input} | outputs
    kept = [i for i in graph.initializer if i.name not in inits or i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def global_average_pools(model: Any) -> int:
    """Rewrite each ``ReduceMean`` over all spatial axes (2 .. rank-1, rank 3 to 5) of a tensor
    whose rank the graph declares into ``GlobalAveragePool`` (+ ``Squeeze`` of those axes for
    ``keepdims=0``), in place; the node keeps its metadata (module scope). Returns the count."""
    from onnx import helper, numpy_helper

    graph = model.graph
    consts = {i.name: i for i in graph.initializer}
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in [*graph.value_info, *graph.input, *graph.output]
        if v.type.tensor_type.HasField("shape")
    }
    uses = Counter(i for n in graph.node for i in n.input)
    statistics = _norm_statistics(graph)
    nodes, dropped, count = [], set(), 0
    for node in graph.node:
        rank = ranks.get(node.input[0]) if node.op_type == "ReduceMean" and node.input else None
        axes = _reduce_axes(node, consts) if rank is not None else None
        if rank is None or axes is None or not 3 <= rank <= 5 or node.output[0] in statistics:
            nodes.append(node)
            continue
        if sorted(a % rank for a in axes) != list(range(2, rank)):  # also: empty axes
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if len(node.input) > 1 and node.input[1]:
            uses[node.input[1]] -= 1
            if not uses[node.input[1]]:
                dropped.add(node.input[1])
        pool = _like(node, "GlobalAveragePool", [node.input[0]], [node.output[0]])
        nodes.append(pool)
        if not attrs.get("keepdims", 1):
            pooled = f"{node.output[0]}_pooled"
            pool.output[0] = pooled
            spatial = f"{node.output[0]}_spatial_axes"
            graph.initializer.append(
                numpy_helper.from_array(np.arange(2, rank, dtype=np.int64), spatial)
            )
            nodes.append(_like(node, "Squeeze", [pooled, spatial], [node.output[0]]))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        keep = [i for i in graph.initializer if i.name not in dropped]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return count


def _norm_statistics(graph: Any) -> set[str]:
    """The outputs of the ``ReduceMean`` nodes that take a normalization's statistic, not a
    pool: the mean of a ``Pow`` (an RMSNorm's ``x.pow(2).mean(-1)`` over a (batch, tokens,
    channels) tensor, whose last axis is "all spatial axes" of a rank-3 tensor) or a mean
    subtracted from its input (a LayerNorm's ``x - x.mean(-1)``)."""
    producers = {o: n for n in graph.node for o in n.output}
    subtracted = {(n.input[0], n.input[1]) for n in graph.node if n.op_type == "Sub"}
    found: set[str] = set()
    for n in graph.node:
        if n.op_type != "ReduceMean" or not n.input:
            continue
        source = producers.get(n.input[0])
        if (source is not None and source.op_type == "Pow") or (n.input[0], n.output[0]) in (
            subtracted
        ):
            found.add(n.output[0])
    return found


def _reduce_axes(node: Any, consts: dict[str, Any]) -> list[int] | None:
    """A ReduceMean's axes: the attribute (opset < 18) or the constant second input."""
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "axes":
            return list(a.ints)
    if len(node.input) > 1 and node.input[1] in consts:
        return [int(v) for v in numpy_helper.to_array(consts[node.input[1]]).flatten()]
    return None


def _like(node: Any, op_type: str, inputs: list[str], outputs: list[str]) -> Any:
    """A node of ``op_type`` with ``node``'s name and metadata (so it keeps the module scope)."""
    from onnx import helper

    new = helper.make_node(op_type, inputs, outputs, name=f"{node.name}/{op_type}")
    new.metadata_props.extend(node.metadata_props)
    return new


def _metadata_scope(node: Any) -> str | None:
    """The module path in the dynamo exporter's ``name_scopes`` metadata, if present."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            scope = str(scopes[-2]) if len(scopes) >= 2 else ""
            return re.sub(r"@\d+$", "", scope)  # torch.export marks repeated calls "path@1"
    return None


def node_scope(node: Any) -> str:
    """The module path a node came from ("" at top level)."""
    meta = _metadata_scope(node)
    if meta is not None:
        return meta
    name = node.name
    if name.startswith("/"):
        parts = name.strip("/").split("/")[:-1]
        return ".".join(parts)
    return ""


def _quantizer_scopes(model: Any, quantizer_order: list[str] | None) -> dict[int, str]:
    """The quantizer path of every Q and DQ node."""
    producers = {o: n for n in model.graph.node for o in n.output}
    quantize = [  # a block quantizer's marker (qdq.quant.onnx_qdq.emit_block) is its one node
        n
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" or (n.domain == "qdq.internal" and n.op_type == "BlockQDQ")
    ]
    scopes: dict[int, str] = {}
    by_order = quantizer_order is not None and len(quantizer_order) == len(quantize)
    for i, node in enumerate(quantize):
        meta = _metadata_scope(node)  # dynamo: exact even when equal scales share an initializer
        if meta is not None and meta.endswith("_quantizer"):
            scopes[id(node)] = meta
        elif by_order:
            assert quantizer_order is not None
            scopes[id(node)] = quantizer_order[i]
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            q = producers.get(node.input[0])
            if q is not None and id(q) in scopes:
                scopes[id(node)] = scopes[id(q)]
    return scopes


def _rename_nodes(model: Any, quantizer_order: list[str] | None) -> None:
    """Module-path names: Q/DQ after their quantizer, weighted ops after the quantizer of their
    weight, the rest after the exporter's scope metadata."""
    producers = {o: n for n in model.graph.node for o in n.output}
    scopes = _quantizer_scopes(model, quantizer_order)
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul") and len(node.input) > 1:
            src = producers.get(node.input[1])
            while src is not None and src.op_type in ("Transpose", "Reshape", "Identity", "Cast"):
                src = producers.get(src.input[0])
            if src is not None and src.op_type == "DequantizeLinear" and id(src) in scopes:
                scopes[id(node)] = (
                    scopes[id(src)].removesuffix(".weight_quantizer").removesuffix("_quantizer")
                )
    used: Counter[str] = Counter()
    for node in model.graph.node:
        scope = scopes.get(id(node)) or node_scope(node)
        base = f"{scope}/{node.op_type}" if scope else node.op_type
        used[base] += 1
        node.name = base if used[base] == 1 else f"{base}_{used[base] - 1}"


def _dedicate_dequantize(model: Any) -> None:
    import onnx

    graph = model.graph
    consumers: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for node in graph.node:
        for i, name in enumerate(node.input):
            consumers[name].append((node, i))
    outputs = {o.name for o in graph.output}
    taken = {n.name for n in graph.node}
    new_nodes = []
    for node in graph.node:
        new_nodes.append(node)
        if node.op_type != "DequantizeLinear":
            continue
        uses = consumers.get(node.output[0], [])
        if len(uses) <= 1 or node.output[0] in outputs:
            continue
        for k, (consumer, idx) in enumerate(uses[1:], start=1):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}.{k}"
            while copy.name in taken:
                copy.name += "_"
            taken.add(copy.name)
            copy.output[0] = f"{node.output[0]}_{k}"
            consumer.input[idx] = copy.output[0]
            new_nodes.append(copy)
    del graph.node[:]
    graph.node.extend(new_nodes)


def float32_io(model: Any) -> Any:
    """Give a float16 graph float32 inputs and outputs, with Casts at the boundary."""
    from onnx import TensorProto, helper

    graph = model.graph
    front, back = [], []
    for inp in graph.input:
        if inp.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        inner = f"{inp.name}_fp16"
        _rename_tensor(graph, inp.name, inner)
        front.append(
            helper.make_node(
                "Cast", [inp.name], [inner], to=TensorProto.FLOAT16, name=f"{inp.name}/Cast"
            )
        )
        inp.type.tensor_type.elem_type = TensorProto.FLOAT
    for out in graph.output:
        if out.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        inner = f"{out.name}_fp16"
        _rename_tensor(graph, out.name, inner)
        back.append(
            helper.make_node(
                "Cast", [inner], [out.name], to=TensorProto.FLOAT, name=f"{out.name}/Cast"
            )
        )
        out.type.tensor_type.elem_type = TensorProto.FLOAT
    nodes = [*front, *graph.node, *back]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _rename_tensor(graph: Any, old: str, new: str) -> None:
    """Point every node input and output named ``old`` at ``new``."""
    for node in graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new
