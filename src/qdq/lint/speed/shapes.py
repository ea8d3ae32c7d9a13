"""Every tensor's shape in an ONNX model at the sizes the user gives its inputs (``--shape``).

ONNX shape inference on a light copy of the model: the inputs' dims replaced by the given sizes,
the file's own value_info and output shapes and types dropped (they may hold the export's batch), large
initializers given as typed inputs instead of copied. A dynamic dimension of an input the graph
reads needs a size; a wrong name, rank or a non-positive dimension is refused, naming the input.

ONNX has no shape function for TensorRT's own operators (domain ``trt``), so everything after
one would stay unsized. Shape inference sees stand-ins of the same output shapes and types
instead (:func:`_stand_ins`): a dynamic block quantize (``TRT_FP4DynamicQuantize``,
``TRT_MXFP8DynamicQuantize``) as a ``Cast`` of its input to the values' type and a strided
``Slice`` along its blocked axis cast to the scales' type; TensorRT's DequantizeLinear forms
(``TRT_MXFP8DequantizeLinear``, ModelOpt's ``trt::DequantizeLinear``) as a ``Cast`` to their
float output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qdq.lint.graph import LintGraph

__all__ = ["infer_shapes"]

#: initializers larger than this many elements are given to shape inference as typed inputs
_SMALL = 4096


def infer_shapes(
    proto: Any, g: LintGraph, shapes: Mapping[str, Sequence[int]] | None
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Every tensor's static dims and ONNX element type, after ``shapes`` replace input dims."""
    import onnx

    sizes = _check_sizes(proto, g, shapes)
    skeleton = _skeleton(proto, sizes)
    inferred = skeleton
    for data_prop in (True, False):  # data_prop: Reshape targets computed from Shape
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=data_prop)
            break
        except Exception:  # best effort: what the file declares
            continue
    dims: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.dim_value > 0 for d in tt.shape.dim):
            dims[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    for t in proto.graph.initializer:
        dims[t.name], types[t.name] = tuple(int(d) for d in t.dims), t.data_type
    for name, value in g.const.items():
        dims.setdefault(name, tuple(int(d) for d in np.shape(value)))
    return dims, types


def _check_sizes(
    proto: Any, g: LintGraph, shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, ...]]:
    """``shapes`` checked against the graph inputs; every read input static after them."""
    if shapes is not None and not isinstance(shapes, Mapping):
        raise TypeError(f"shapes must map input names to dims, got {type(shapes).__name__}")
    declared = {vi.name: vi for vi in proto.graph.input if vi.name in g.inputs}
    sizes: dict[str, tuple[int, ...]] = {}
    for name, value in (shapes or {}).items():
        if name not in declared:
            known = ", ".join(repr(n) for n in declared) or "none"
            raise ValueError(f"--shape names {name!r}, which is no input of the model ({known})")
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"--shape {name}: dims must be a sequence of ints, got {value!r}")
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in value):
            raise TypeError(f"--shape {name}: dims must be ints, got {list(value)!r}")
        if not value or any(not 0 < int(d) < 2**63 for d in value):
            raise ValueError(
                f"--shape {name}: every dimension must be a positive 64-bit integer, "
                f"got {list(value)}"
            )
        tt = declared[name].type.tensor_type
        if tt.HasField("shape") and len(tt.shape.dim) != len(value):
            raise ValueError(
                f"--shape {name}: {len(value)} dims given, the input has {len(tt.shape.dim)}"
            )
        sizes[name] = tuple(int(d) for d in value)
    for name, vi in declared.items():
        if name in sizes or not g.consumers.get(name):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise ValueError(
                f"input {name!r} declares no shape: give its size with --shape {name}:1x3x224x224"
            )
        for axis, d in enumerate(tt.shape.dim):
            if d.dim_value <= 0:
                example = "x".join(
                    str(e.dim_value) if e.dim_value > 0 else "1" for e in tt.shape.dim
                )
                what = repr(d.dim_param) if d.dim_param else "of unknown size"
                raise ValueError(
                    f"input {name!r} has a dynamic dimension {what} at axis {axis}: give its "
                    f"size with --shape {name}:{example}"
                )
    return sizes


def _skeleton(proto: Any, sizes: Mapping[str, tuple[int, ...]]) -> Any:
    """The model for shape inference: input dims replaced, declared value_info and output shapes
    dropped (they may hold the export's batch), large initializers given as typed inputs."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.ir_version = max(proto.ir_version, 4)
    m.opset_import.extend(proto.opset_import)
    m.functions.extend(proto.functions)
    graph = m.graph
    graph.name = proto.graph.name
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.value_info}
    init_types = {t.name: t.data_type for t in proto.graph.initializer}
    graph.node.extend(_stand_ins(proto.graph.node, opset, declared | init_types, graph))
    names = set()
    for vi in proto.graph.input:
        names.add(vi.name)
        if vi.name in sizes:
            elem = vi.type.tensor_type.elem_type
            graph.input.append(helper.make_tensor_value_info(vi.name, elem, list(sizes[vi.name])))
        else:
            graph.input.append(vi)
    for t in proto.graph.initializer:
        count = math.prod(t.dims)
        if count <= _SMALL or t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            graph.initializer.append(t)
        elif t.name not in names:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for o in proto.graph.output:  # neither shape nor type: an output declared FP32 that the
        # graph computes in FP16 would stop inference at its producer
        graph.output.append(helper.make_tensor_value_info(o.name, 0, None))
    return m


_FLOAT, _UINT8, _FLOAT16, _BFLOAT16, _E4M3, _FP4, _E8M0 = 1, 2, 10, 16, 17, 23, 24
_FLOATS = (_FLOAT, _FLOAT16, _BFLOAT16)
_INT64_MAX = 2**63 - 1


def _stand_ins(nodes: Sequence[Any], opset: int, types: Mapping[str, int], graph: Any) -> list[Any]:
    """``nodes`` with each TensorRT operator (domain ``trt``) whose shapes qdq knows replaced by
    standard operators of the same output shapes and types (module docstring); the constants the
    stand-ins read are added to ``graph``'s initializers. Other nodes are returned as they are."""
    from onnx import helper, numpy_helper

    out: list[Any] = []
    for k, n in enumerate(nodes):
        if n.domain != "trt":
            out.append(n)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type in ("TRT_FP4DynamicQuantize", "TRT_MXFP8DynamicQuantize") and n.input:
            fp4 = n.op_type == "TRT_FP4DynamicQuantize"
            values = _FP4 if fp4 else int(attrs.get("output_dtype", _E4M3))
            # E4M3 block scales for NVFP4; E8M0 for MXFP8 where ONNX has the type, else the
            # exponent bytes of ModelOpt's opset-20 form
            scales = int(attrs.get("scale_type", _E4M3)) if fp4 else (
                _E8M0 if opset >= 24 else _UINT8)  # fmt: skip
            x, prefix = n.input[0], f"_qdq_shape_{k}"
            out.append(helper.make_node("Cast", [x], [n.output[0]], to=values))
            if len(n.output) > 1 and n.output[1]:
                consts = {"starts": 0, "ends": _INT64_MAX, "axes": int(attrs.get("axis", -1)),
                          "steps": int(attrs.get("block_size", 16 if fp4 else 32))}  # fmt: skip
                names = [f"{prefix}_{c}" for c in consts]
                graph.initializer.extend(
                    numpy_helper.from_array(np.array([v], dtype=np.int64), name)
                    for name, v in zip(names, consts.values(), strict=True)
                )
                strided = f"{prefix}_strided"
                out.append(helper.make_node("Slice", [x, *names], [strided]))
                out.append(helper.make_node("Cast", [strided], [n.output[1]], to=scales))
        elif n.op_type in ("TRT_MXFP8DequantizeLinear", "DequantizeLinear") and n.input:
            to = types.get(n.output[0])
            if to not in _FLOATS:
                to = int(attrs.get("output_dtype", 0)) or types.get(n.input[1], _FLOAT)
            to = to if to in _FLOATS else _FLOAT
            out.append(helper.make_node("Cast", [n.input[0]], [n.output[0]], to=to))
        else:
            out.append(n)
    return out
