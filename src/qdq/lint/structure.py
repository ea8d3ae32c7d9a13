"""Graph-structure validity rules V14-V17: what makes an ONNX file no valid graph for TensorRT's
parser, or a graph the linter cannot fully read.

* **V14** (ERROR): a cycle (a node reading its own output included), or a tensor written by two
  nodes. ONNX graphs are acyclic and in static single assignment; TensorRT's parser sorts the
  nodes topologically and fails on a cycle. The linter predicts nothing for such a graph.
* **V15** (ERROR): an IR version newer than the ``onnx`` package the linter reads it with knows,
  or older than 3 (no opset imports): fields the linter cannot see may change the graph's meaning.
* **V16** (WARN): an operator that is no ONNX operator of its domain (a custom domain, an ONNX
  Runtime contrib op, a misspelt op): TensorRT's parser imports it only as a plugin registered
  under that name, and fails without one. It is predicted as a ``plugin`` layer, not a float one.
* **V17** (WARN): a node holding subgraphs (``If``, ``Loop``, ``Scan``): the linter does not read
  inside them, so their Q/DQ and layers are not predicted.
"""

from __future__ import annotations

from typing import Any

from qdq.lint.findings import ERROR, WARN, Finding
from qdq.lint.formats import DYNAMIC_QUANTIZE, TRT_DEQUANTIZE
from qdq.lint.graph import LintGraph

__all__ = ["check_structure", "is_custom_op"]

_SRC = "ONNX IR specification (graphs, nodes, operator sets)"
_QOPERATOR_DOMAINS = frozenset({"com.microsoft"})


def check_structure(model: Any, g: LintGraph) -> list[Finding]:
    """V14-V17 on ``model`` (indexed as ``g``)."""
    import onnx

    out: list[Finding] = []
    ir = int(model.ir_version)
    if ir > onnx.IR_VERSION or ir < 3:
        out.append(
            Finding(
                "V15",
                ERROR,
                (),
                f"IR version {ir}: the linter's onnx {onnx.__version__} reads IR versions 3 to "
                f"{onnx.IR_VERSION}",
                "unknown: a newer IR may carry what neither the linter nor the parser reads",
                "re-export with a released onnx (IR version <= "
                f"{onnx.IR_VERSION}), or upgrade onnx",
                _SRC,
            )
        )
    out += _cycles(g)
    out += _custom_ops(model, g)
    out += _subgraphs(g)
    return out


def _cycles(g: LintGraph) -> list[Finding]:
    out: list[Finding] = []
    if g.cyclic:
        names = [g.name(n) for n in g.cyclic]
        loops = [g.name(n) for n in g.cyclic if set(n.input) & set(n.output)]
        what = f"node {loops[0]!r} reads its own output" if loops else "the graph has a cycle"
        out.append(
            Finding(
                "V14",
                ERROR,
                tuple(names[:10]),
                f"{what}: {len(names)} node(s) on or after a cycle "
                f"({', '.join(repr(x) for x in names[:3])}{', ...' if len(names) > 3 else ''})",
                "parse failure: TensorRT's parser cannot sort the graph topologically; "
                "nothing is predicted",
                "export an acyclic graph (ONNX graphs are DAGs)",
                _SRC,
            )
        )
    seen: dict[str, Any] = {}
    twice: list[str] = []
    for n in g.graph.node:
        for o in n.output:
            if o and o in seen and len(twice) < 10:
                twice.append(o)
            seen[o] = n
    if twice:
        out.append(
            Finding(
                "V14",
                ERROR,
                tuple(twice),
                f"tensor {twice[0]!r} is written by more than one node ({len(twice)} such "
                "tensor(s)): not a valid ONNX graph",
                "parse failure",
                "give every node output a unique name",
                _SRC,
            )
        )
    return out


#: operators of domain ``trt`` that TensorRT's ONNX parser builds itself (no plugin): the dynamic
#: block quantizers of NVFP4 and MXFP8, ``trt::TRT_MXFP8DequantizeLinear`` and the
#: ``trt::DequantizeLinear`` of ModelOpt's INT4 export (onnx-tensorrt ``onnxOpImporters.cpp``)
_TRT_OPS = frozenset({*DYNAMIC_QUANTIZE, *TRT_DEQUANTIZE, "DequantizeLinear"})


def is_custom_op(node: Any) -> bool:
    """Whether ``node`` is no operator of the ONNX standard for its domain (nor one of TensorRT's
    own ``trt`` operators its parser builds)."""
    if node.domain == "trt" and node.op_type in _TRT_OPS:
        return False
    return (node.op_type, node.domain or "") not in _known_ops()


_KNOWN: set[tuple[str, str]] = set()


def _known_ops() -> set[tuple[str, str]]:
    if not _KNOWN:
        from onnx import defs

        for schema in defs.get_all_schemas_with_history():
            domain = "" if schema.domain == "ai.onnx" else schema.domain
            _KNOWN.add((schema.name, domain))
            if not domain:
                _KNOWN.add((schema.name, "ai.onnx"))
    return _KNOWN


def _custom_ops(model: Any, g: LintGraph) -> list[Finding]:
    from qdq.lint.validity import QOPERATOR_OPS

    found = [n for n in g.graph.node if n.op_type not in QOPERATOR_OPS and is_custom_op(n)]
    if not found:
        return []
    kinds = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in found})
    names = [g.name(n) for n in found]
    return [
        Finding(
            "V16",
            WARN,
            tuple(names[:10]),
            f"{len(found)} node(s) of operator(s) {', '.join(kinds[:5])} that ONNX does not "
            f"define ({', '.join(repr(x) for x in names[:3])})",
            "TensorRT's parser imports them only through a plugin registered under that name "
            "(parse failure without one); predicted as plugin layers, precision unknown",
            "replace them with ONNX operators, or build with the plugin library "
            "(trtexec --staticPlugins / --dynamicPlugins)",
            _SRC,
        )
    ]


def _subgraphs(g: LintGraph) -> list[Finding]:
    from onnx import AttributeProto

    holders = [
        n
        for n in g.graph.node
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute)
    ]
    if not holders:
        return []
    names = [g.name(n) for n in holders]
    ops = sorted({n.op_type for n in holders})
    return [
        Finding(
            "V17",
            WARN,
            tuple(names[:10]),
            f"{len(holders)} {'/'.join(ops)} node(s) hold subgraphs the linter does not read "
            f"({', '.join(repr(x) for x in names[:3])})",
            "not predicted: the Q/DQ and layers inside them are unchecked",
            "lint each branch or body as a model of its own, or fold the control flow "
            "(onnx-simplifier / polygraphy surgeon sanitize --fold-constants)",
            _SRC,
        )
    ]
