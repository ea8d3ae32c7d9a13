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
4. A ``ReduceMean`` over every spatial axis (the dynamo exporter's ``adaptive_avg_pool2d(x, 1)``,
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

__all__ = ["float32_io", "global_average_pools", "node_scope", "postprocess"]


def postprocess(model: Any, quantizer_order: list[str] | None = None) -> Any:
    """Apply the four passes to ``model`` (an ``onnx.ModelProto``) in place and return it.

    ``quantizer_order``: the module paths of the quantizers in the order they ran while the
    TorchScript exporter traced; the i-th QuantizeLinear of the graph belongs to the i-th entry.
    (The dynamo exporter records each node's module path in metadata instead.)
    """
    _drop_constant_identities(model)
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
    nodes, dropped, count = [], set(), 0
    for node in graph.node:
        rank = ranks.get(node.input[0]) if node.op_type == "ReduceMean" and node.input else None
        axes = _reduce_axes(node, consts) if rank is not None else None
        if rank is None or axes is None or not 3 <= rank <= 5:
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
    quantize = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
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
