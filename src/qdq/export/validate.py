"""Validation of an exported Q/DQ graph: checker, strict shape inference, planned Q/DQ present."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from qdq.graph.plan import QuantPlan
from qdq.lint.formats import is_dequantize

__all__ = ["validate_export"]

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
#: ops a DequantizeLinear may pass through before reaching its consumer (data movement)
PASS_OPS = frozenset(
    {
        "Pad",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "MaxPool",
        "Slice",
        "Cast",
    }
)


def validate_export(model: Any, plan: QuantPlan, path: Path | None = None) -> tuple[int, int]:
    """Raise :class:`~qdq.export.ExportError` unless ``model`` is valid; return (#Q, #DQ).

    #DQ counts TensorRT's ``TRT_MXFP8DequantizeLinear`` (MXFP8 in ``block_form="trt"``) with
    ONNX's ``DequantizeLinear`` (:func:`qdq.lint.formats.is_dequantize`, the linter's own
    predicate): both forms of a model count alike.

    ``path``: ``model`` as written with external data (:mod:`qdq.export.external`); the checker
    reads it from there (protobuf cannot serialize the model in memory past 2 GB).
    """
    import onnx

    from qdq.export.errors import ExportError

    try:  # full_check runs strict, type-checked shape inference (a second pass found nothing more)
        onnx.checker.check_model(model if path is None else str(path), full_check=True)
    except onnx.shape_inference.InferenceError as err:
        raise ExportError(f"ONNX shape inference failed on the exported model: {err}") from err
    except onnx.checker.ValidationError as err:
        raise ExportError(f"onnx.checker rejected the exported model: {err}") from err
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            consumers[i].append(n)
    _check_zero_points(graph, "" if path is None else str(path.parent))
    problems = []
    for group in plan.groups:
        leader = plan.point(group.leader)
        if leader.kind != "weight" or not group.quantizer:
            continue
        weight_only = leader.spec is not None and leader.spec.format == "int4"
        dqs = [
            n for n in graph.node if is_dequantize(n) and n.name.startswith(group.quantizer + "/")
        ]
        ops = [
            c for dq in dqs for c in _through(consumers, dq.output[0]) if c.op_type in WEIGHTED_OPS
        ]
        if not ops:
            problems.append(
                f"{leader.owner}: weight DequantizeLinear does not feed a Conv/Gemm/MatMul"
            )
            continue
        for op in ops if not weight_only else ():  # INT4 weight-only: a float activation
            data = _source(producers, op.input[0])
            if data is None or not is_dequantize(data):
                problems.append(
                    f"{leader.owner}: {op.name} reads a float activation (no DequantizeLinear)"
                )
    if problems:
        raise ExportError("planned Q/DQ missing in the exported graph:\n  " + "\n  ".join(problems))
    n_q = sum(1 for n in graph.node if n.op_type == "QuantizeLinear")
    n_dq = sum(1 for n in graph.node if is_dequantize(n))
    return n_q, n_dq


def _through(consumers: dict[str, list[Any]], tensor: str) -> list[Any]:
    out, stack = [], [tensor]
    while stack:
        for c in consumers.get(stack.pop(), []):
            if c.op_type in PASS_OPS:
                stack.extend(c.output)
            else:
                out.append(c)
    return out


def _source(producers: dict[str, Any], tensor: str) -> Any:
    node = producers.get(tensor)
    while node is not None and node.op_type in PASS_OPS:
        node = producers.get(node.input[0])
    return node


def _check_zero_points(graph: Any, base_dir: str) -> None:
    """``base_dir``: where a model written with external data keeps its data file."""
    from onnx import TensorProto, numpy_helper

    from qdq.export.errors import ExportError

    inits = {i.name: i for i in graph.initializer}
    block = _block_nodes(graph, inits)
    for n in graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.name in block:
            continue
        if len(n.input) < 3 or n.input[2] not in inits:
            raise ExportError(
                f"{n.name}: zero point is not an initializer (TensorRT needs a constant 0)"
            )
        zp = inits[n.input[2]]
        if zp.data_type not in (TensorProto.INT8, TensorProto.FLOAT8E4M3FN) or (
            numpy_helper.to_array(zp, base_dir).astype("float32").any()
        ):
            raise ExportError(f"{n.name}: zero point must be int8 or float8e4m3fn zeros")
        scale = numpy_helper.to_array(inits[n.input[1]], base_dir) if n.input[1] in inits else None
        if scale is None or not (scale > 0).all():
            raise ExportError(f"{n.name}: scale must be a positive constant initializer")


def _block_nodes(graph: Any, inits: dict[str, Any]) -> set[str]:
    """The Q/DQ nodes of block formats (:mod:`qdq.export.blocks_onnx`), which carry no zero
    point: a blocked ``DequantizeLinear`` (``block_size``), one of 4-bit or E4M3-with-E8M0 data,
    one reading the output of TensorRT's dynamic block quantize (domain ``trt``), and NVFP4's
    scale ``DequantizeLinear`` (E4M3 block scales times the per-tensor scale) that another
    ``DequantizeLinear`` reads as its scale."""
    from onnx import TensorProto

    four_bit = (TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1)
    producers = {o: n for n in graph.node for o in n.output}
    found = set()
    for n in graph.node:
        if n.op_type != "DequantizeLinear" or not n.input:
            continue
        blocked = any(a.name == "block_size" and a.i > 0 for a in n.attribute)
        data = inits.get(n.input[0])
        src = producers.get(n.input[0])
        if (
            blocked
            or (data is not None and data.data_type in four_bit)
            or (src is not None and src.domain == "trt")
        ):
            found.add(n.name)
            scale = producers.get(n.input[1]) if len(n.input) > 1 else None
            if scale is not None and scale.op_type == "DequantizeLinear":
                found.add(scale.name)
    return found
