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
"""

from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from typing import Any

__all__ = ["float32_io", "node_scope", "postprocess"]


def postprocess(model: Any, quantizer_order: list[str] | None = None) -> Any:
    """Apply the three passes to ``model`` (an ``onnx.ModelProto``) in place and return it.

    ``quantizer_order``: the module paths of the quantizers in the order they ran while the
    TorchScript exporter traced; the i-th QuantizeLinear of the graph belongs to the i-th entry.
    (The dynamo exporter records each node's module path in metadata instead.)
    """
    _drop_constant_identities(model)
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
