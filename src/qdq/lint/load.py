"""Read the model to lint: an ONNX file or an ``onnx.ModelProto``, refused with one
:class:`LintInputError` naming the file and what is wrong when it cannot be linted (not ONNX, empty,
truncated, missing external data, a directory, a missing file, an undecodable initializer)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from qdq._io import proto_byte_size
from qdq.lint.external import load_external_data

__all__ = ["LintInputError", "load_model"]

logger = logging.getLogger(__name__)

#: Protobuf cannot serialize a model of this many bytes or more, so ``onnx.shape_inference`` (which
#: serializes) fails on it; :func:`load_model` then infers shapes on the graph without its weights.
PROTOBUF_LIMIT = 2**31


class LintInputError(ValueError):
    """The model given to :func:`qdq.lint.lint` cannot be read or is not a usable ONNX graph.

    The message starts with the file (or model) name and says what is wrong; ``qdq lint`` prints it
    as one line and exits with code 3.

    Example:
        >>> from qdq.lint import LintInputError, lint
        >>> try:
        ...     lint("missing.onnx")
        ... except LintInputError as err:
        ...     print(err)
        missing.onnx: no such file
    """


def load_model(model: str | Path | Any) -> tuple[Any, str]:
    """Load and sanity-check ``model``; return ``(onnx.ModelProto, label)``.

    Args:
        model: a path to an ONNX file (external data is loaded from beside it) or a ``ModelProto``.

    Raises:
        LintInputError: the file is missing, a directory, empty, not ONNX, truncated, or its graph
            or initializers cannot be read.
        TypeError: ``model`` is neither a path nor an ``onnx.ModelProto``.
    """
    import onnx

    if isinstance(model, (str, Path)):
        path = Path(model)
        proto = _read(path)
        label, where = path.name, str(path)
        if _too_large(proto):
            _infer_without_data(proto, path)
    elif isinstance(model, onnx.ModelProto):
        proto = model
        label = where = model.graph.name or "model"
    else:
        raise TypeError(
            f"lint() takes an ONNX file path or an onnx.ModelProto, got {type(model).__name__}"
        )
    problem = _structure_problem(proto)
    if problem:
        raise LintInputError(f"{where}: {problem}")
    return proto, label


def _read(path: Path) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    if path.is_dir():
        raise LintInputError(f"{path}: is a directory, not an ONNX file")
    if not path.exists():
        raise LintInputError(f"{path}: no such file")
    try:
        if path.stat().st_size == 0:
            raise LintInputError(f"{path}: empty file, not an ONNX model")
        proto = onnx.load(str(path), load_external_data=False)
    except LintInputError:
        raise
    except DecodeError as err:
        raise LintInputError(
            f"{path}: not an ONNX model, or a truncated one (protobuf: {err})"
        ) from err
    except OSError as err:
        raise LintInputError(f"{path}: cannot be read ({err.strerror or err})") from err
    except Exception as err:  # onnx reports missing external data as ValidationError
        logger.debug("onnx.load(%s) failed", path, exc_info=True)
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        missing = re.search(r"tensor name: (.+?)\) should be stored in (.+?), but", text)
        if missing:
            raise LintInputError(
                f"{path}: external data file {missing.group(2)} is missing or not a file "
                f"(tensor {missing.group(1)!r})"
            ) from err
        if "external" in text.lower():
            raise LintInputError(f"{path}: external data cannot be read ({text})") from err
        raise LintInputError(f"{path}: cannot be loaded as ONNX ({text})") from err
    try:  # checked against the shapes and confined to the model's folder before it is read
        load_external_data(proto, path)
    except ValueError as err:
        raise LintInputError(f"{path}: {err}") from err
    except OSError as err:
        raise LintInputError(f"{path}: external data cannot be read ({err})") from err
    return proto


def _too_large(proto: Any) -> bool:
    return proto_byte_size(proto) >= PROTOBUF_LIMIT


def _infer_without_data(proto: Any, path: Path) -> None:
    """Add the value_info of shape inference on ``path``'s graph read without its external data
    (past 2 GB, with the weights loaded, the linter's own shape inference cannot run; it then
    takes the shapes the file declares)."""
    import onnx

    try:
        skeleton = onnx.load(str(path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(skeleton).graph.value_info
    except Exception as err:  # best effort, as in the linter
        logger.info("%s: no shape inference without the weights (%s)", path, err)
        return
    known = {v.name for v in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output]}
    proto.graph.value_info.extend(v for v in inferred if v.name not in known)


def _structure_problem(proto: Any) -> str:
    """What makes ``proto`` unusable ('' when it can be linted)."""
    if not proto.HasField("graph") and not proto.opset_import:
        return "not an ONNX model (no graph, no opset; empty or foreign content)"
    if not proto.HasField("graph"):
        return "no graph: not an ONNX model, or a truncated one"
    if not proto.opset_import:
        return "no opset_import: not an ONNX model, or a truncated one"
    graph = proto.graph
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    for n in graph.node:
        if not any(n.output):
            return f"node {n.name or n.op_type!r} ({n.op_type}) has no output (an invalid graph)"
        missing = [i for i in n.input if i and i not in defined]
        if missing:
            name = n.name or n.output[0]
            return (
                f"node {name!r} ({n.op_type}) reads {missing[0]!r}, which no node, initializer "
                "or graph input defines (a truncated or corrupt graph)"
            )
    for t in graph.initializer:
        problem = _tensor_problem(t)
        if problem:
            return f"initializer {t.name!r}: {problem}"
    return ""


def _tensor_problem(t: Any) -> str:
    """Why an initializer's data cannot be read ('' when it can)."""
    from onnx import TensorProto, helper

    if t.data_location == TensorProto.EXTERNAL:
        where = next((e.value for e in t.external_data if e.key == "location"), "?")
        return f"its data is in the external file {where!r}, which was not loaded"
    if not t.raw_data:
        return ""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return ""  # a dtype numpy cannot name: left to the rules
    count = int(np.prod(t.dims)) if t.dims else 1
    if t.data_type == TensorProto.STRING or itemsize == 0:
        return ""
    packed = (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    bits = next((b for k, b in packed if t.data_type == getattr(TensorProto, k, None)), None)
    expected = (count * bits + 7) // 8 if bits else count * itemsize
    if len(t.raw_data) != expected:
        return (
            f"{len(t.raw_data)} bytes of data for shape {list(t.dims)} "
            f"({expected} expected): corrupt or truncated"
        )
    return ""
