"""Down-convert a dynamo export (opset 18) to opsets 13..17.

torch's dynamo exporter emits opset 18; ``onnx.version_converter`` cannot take BatchNormalization-15
below 15 and leaves ReduceMean-18's ``noop_with_empty_axes`` behind. Inference graphs of CNNs only
need these rewrites, which this pass does explicitly:

* ``Reduce{Mean,Max,Min,Prod,SumSquare,L1,L2,LogSum,LogSumExp}``: constant ``axes`` input →
  ``axes`` attribute (ReduceSum keeps its input form, which exists since 13);
* ``Split``: drop ``num_outputs`` (13..17 split equally by the number of outputs);
* ``BatchNormalization``: drop ``training_mode`` (must be 0) below 14; ``Reshape``: drop
  ``allowzero`` below 14 (same meaning unless the target shape holds a literal 0; a shape computed
  at run time is assumed to have no zero-size dimension);
* ``Resize`` / ``Pad``: drop opset-18 attributes and inputs when they hold their defaults;
* ``HardSwish`` (opset 14) → ``x * HardSigmoid(x, alpha=1/6, beta=0.5)`` below 14;
* ``Shape`` with ``start``/``end`` (opset 15) → ``Shape`` + ``Slice`` below 15.

An op that ONNX defines only from a later opset than the target (``Col2Im``, opset 18, from
``F.fold`` as in timm's VOLO) cannot be expressed: :func:`downgrade` refuses with a
:class:`NewerOpError` naming the op, its module and the opset that has it, and tells the user to
export with that opset (the opset the user chose is never raised silently).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NewerOpError", "downgrade", "ops_newer_than"]


class NewerOpError(ValueError):
    """The exported graph uses ops that the requested opset does not have.

    ``ops`` maps each such op type to the first opset that defines it.
    """

    def __init__(self, message: str, ops: dict[str, int]) -> None:
        super().__init__(message)
        self.ops = ops


_REDUCE_ATTR_AXES = {
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
}  # fmt: skip


def downgrade(model: Any, target: int) -> Any:
    """Rewrite ``model`` (opset 18) for opset ``target`` (13..17) in place and return it."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    constants = {
        n.output[0]: n.attribute[0].t
        for n in model.graph.node
        if n.op_type == "Constant" and n.attribute
    }
    _rewrite_new_ops(model, target)
    _refuse_newer_ops(model, target)
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type in _REDUCE_ATTR_AXES:
            if len(node.input) > 1 and node.input[1]:
                src = inits.get(node.input[1]) or constants.get(node.input[1])
                if src is None:
                    raise ValueError(
                        f"{node.name}: dynamic reduction axes cannot be expressed below opset 18"
                    )
                axes = [int(a) for a in numpy_helper.to_array(src).flatten()]
                del node.input[1:]
                node.attribute.append(helper.make_attribute("axes", axes))
            _drop_attr(node, attrs, "noop_with_empty_axes", default=0)
        elif node.op_type == "Split":
            _drop_attr(node, attrs, "num_outputs", default=None)
        elif node.op_type == "Reshape" and target < 14 and "allowzero" in attrs:
            shape = inits.get(node.input[1]) or constants.get(node.input[1])
            if shape is not None and 0 in numpy_helper.to_array(shape).tolist():
                raise ValueError(f"{node.name}: Reshape to a literal 0 dimension needs opset >= 14")
            node.attribute.remove(attrs["allowzero"])  # no literal 0 in the shape: same meaning
        elif node.op_type == "BatchNormalization" and target < 14:
            _drop_attr(node, attrs, "training_mode", default=0)
        elif node.op_type == "Resize":
            _drop_attr(node, attrs, "antialias", default=0)
            _drop_attr(node, attrs, "keep_aspect_ratio_policy", default="stretch")
            _drop_attr(node, attrs, "axes", default=None)
        elif node.op_type == "Pad" and len(node.input) > 3:
            if node.input[3]:
                raise ValueError(f"{node.name}: Pad with axes needs opset >= 18")
            del node.input[3:]
    used = {i.name for i in model.graph.initializer}
    referenced = {name for n in model.graph.node for name in n.input}
    for name in used - referenced - {i.name for i in model.graph.input}:
        model.graph.initializer.remove(inits[name])
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = target
    return model


def ops_newer_than(model: Any, target: int) -> dict[str, list[Any]]:
    """The default-domain ops of ``model`` that ONNX defines only after opset ``target``: op type
    → its nodes (other domains and unknown ops are left to ``onnx.checker``)."""
    from onnx import defs

    newer: dict[str, list[Any]] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or not defs.has(node.op_type):
            continue
        try:
            defs.get_schema(node.op_type, target)
        except defs.SchemaError:
            newer.setdefault(node.op_type, []).append(node)
    return newer


def _refuse_newer_ops(model: Any, target: int) -> None:
    """Raise :class:`NewerOpError` when ops newer than ``target`` remain (see the module doc)."""
    from onnx import defs

    from qdq.export.postprocess import node_scope

    newer = ops_newer_than(model, target)
    if not newer:
        return
    history = defs.get_all_schemas_with_history()
    since = {  # the first opset that has the op
        op: min(int(h.since_version) for h in history if h.name == op and h.domain == "")
        for op in newer
    }
    need = max(since.values())
    listing = "; ".join(
        f"{op} (opset {since[op]}+) at {', '.join(sorted({node_scope(n) or n.name for n in nodes})[:3])}"
        for op, nodes in newer.items()
    )
    raise NewerOpError(
        f"the model needs ONNX ops that opset {target} does not have: {listing}. torch's exporter "
        f"writes them and they have no opset-{target} form; export with opset={need} or higher "
        "(check that your TensorRT version parses that opset)",
        since,
    )


def _drop_attr(node: Any, attrs: dict[str, Any], name: str, default: object) -> None:
    from onnx import helper

    attr = attrs.get(name)
    if attr is None:
        return
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        value = value.decode()
    if default is not None and value != default:
        raise ValueError(
            f"{node.name}: {node.op_type} attribute {name}={value!r} needs opset >= 18"
        )
    node.attribute.remove(attr)


def _rewrite_new_ops(model: Any, target: int) -> None:
    """Express HardSwish (14) and Shape start/end (15) with older ops."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    nodes = []
    for k, node in enumerate(graph.node):
        if node.op_type == "HardSwish" and target < 14:
            sig = f"{node.output[0]}_hardsigmoid"
            nodes.append(helper.make_node("HardSigmoid", [node.input[0]], [sig], alpha=1.0 / 6, beta=0.5,
                                          name=f"{node.name}_hardsigmoid"))  # fmt: skip
            nodes.append(
                helper.make_node("Mul", [node.input[0], sig], list(node.output), name=node.name)
            )
            continue
        if node.op_type == "Shape" and target < 15 and node.attribute:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            full = f"{node.output[0]}_full"
            nodes.append(
                helper.make_node("Shape", [node.input[0]], [full], name=f"{node.name}_full")
            )
            names = [f"{node.output[0]}_{w}{k}" for w in ("starts", "ends", "axes")]
            end = int(attrs.get("end", np.iinfo(np.int64).max))
            for name, value in zip(names, (int(attrs.get("start", 0)), end, 0), strict=True):
                graph.initializer.append(
                    numpy_helper.from_array(np.array([value], dtype=np.int64), name)
                )
            nodes.append(
                helper.make_node("Slice", [full, *names], list(node.output), name=node.name)
            )
            continue
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
