"""Every tensor's shape in an ONNX model at the sizes the user gives its inputs (``--shape``).

ONNX shape inference on a light copy of the model: the inputs' dims replaced by the given sizes,
the file's own value_info and output shapes dropped (they may hold the export's batch), large
initializers given as typed inputs instead of copied. A dynamic dimension of an input the graph
reads needs a size; a wrong name, rank or a non-positive dimension is refused, naming the input.
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
    graph.node.extend(proto.graph.node)
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
    for o in proto.graph.output:
        graph.output.append(
            helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
        )
    return m
