"""Draw a real TensorRT engine (``trtexec --exportLayerInfo``) in the style of the predicted one.

:func:`engine_graph` turns an :class:`~qdq.lint.engine_report.EngineReport` into the plain
:class:`~qdq.lint.draw.LayerGraph` that :func:`qdq.lint.draw.to_dot` lays out with Graphviz, so
real and predicted engines share colours, shapes and the collapse of large graphs:

* a box per engine layer, filled by the precision it computes in (its first non-constant input;
  INT8 green, FP16/BF16 amber, FP32 red), labelled with its fused ONNX nodes, its type (with the
  kernel, stride and output channels of a convolution), ``input → output`` precision and memory
  format and, with a profile, its median time and share of the engine's latency;
* an unfused Quantize/Dequantize (a reformat of origin QDQ) is a violet ellipse and a
  builder-inserted reformat a blue hexagon, so both stand out;
* edges are the tensors, labelled with shape, precision and format (INT8 edges green);
* layers are boxed, and past ``max_nodes`` collapsed, by the module scope found in their ONNX node
  names (``/model.2/cv1/conv/Conv``, ``features.3.conv.0.weight``); an engine whose names carry no
  scope (``Conv_12``) is collapsed into runs of consecutive layers instead.

Example:
    >>> from qdq.lint.engine_report import parse_engine_report
    >>> r = parse_engine_report([{"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution",
    ...     "ParameterType": "Convolution", "Kernel": [3, 3], "OutMaps": 64,
    ...     "Inputs": [{"Name": "x", "Dimensions": [1, 3, 8, 8],
    ...                 "Format/Datatype": "Row major linear FP32"}],
    ...     "Outputs": [{"Name": "y", "Dimensions": [1, 64, 8, 8],
    ...                  "Format/Datatype": "Row major linear FP32"}]}])
    >>> g = engine_graph(r)
    >>> g.nodes[0].label
    'Conv_0 + Relu_1\\nConvolution 3×3 → 64\\nFP32 linear'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from qdq.lint.draw import DrawNode, LayerGraph, module_scope, render_svg, to_dot
from qdq.lint.engine_report import EngineLayer, EngineReport, EngineTensor

__all__ = ["draw_engine_svg", "engine_graph", "short_format", "short_name"]

_VECTOR_WIDTHS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16, "thirty-two": 32}
_ENUM_FORMAT = re.compile(r"\(?k(LINEAR|CHW\d+|HWC\d*|DHWC\d*|CDHW\d+|DLA_\w+)\)?")
_PARAM_FILES = (".weight", ".bias")
_WRAP = 34
_SCOPE_DEPTH = 24  # module scope components kept from a layer name
_READERS = 64  # readers of a tensor looked at for the scope of a standalone Q/DQ or copy
_NO_COMPUTE = ("NoOp", "Shuffle", "Constant", "shape_call", "signal", "wait")
_COPY = re.compile(r"Reformatting CopyNode for (?:Input|Output) Tensor \d+ to (.+?)(?: \+ |$)")
_INTERNAL = re.compile(r"\(Unnamed Layer\* \d+\)|^(?:copied_)?u?n?squeeze_(?:node_)?after_")


def short_format(text: str) -> str:
    """TensorRT's memory-format text as its short name (``linear``, ``CHW32``, ``HWC8``, ...).

    Example:
        >>> short_format("Thirty-two wide channel vectorized row major Int8 format")
        'CHW32'
        >>> short_format("Channel major FP16 format where channel % 8 == 0")
        'HWC8'
        >>> short_format("Row major linear FP32 format (kLINEAR)"), short_format("")
        ('linear', '')
    """
    enum = _ENUM_FORMAT.search(text)
    if enum:
        return "linear" if enum.group(1) == "LINEAR" else enum.group(1)
    low = text.lower()
    vec = re.match(r"([a-z-]+) wide channel vectorized", low)
    if vec and vec.group(1) in _VECTOR_WIDTHS:
        return f"CHW{_VECTOR_WIDTHS[vec.group(1)]}"
    if low.startswith("channel major"):
        every = re.search(r"channel % (\d+) == 0", low)
        return f"HWC{every.group(1)}" if every and every.group(1) != "1" else "HWC"
    if "row major linear" in low or low.startswith("linear"):
        return "linear"
    return text.split()[0] if text.split() and text.split()[0].isalnum() else ""


def draw_engine_svg(
    report: EngineReport,
    *,
    max_nodes: int = 150,
    title: str = "",
    marks: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> str:
    """The engine drawn as an inline SVG string (see the module docstring).

    Args:
        report: the parsed engine report (with a profile for the latency shares).
        max_nodes: above this many layers, collapse by module scope.
        title: drawn above the graph.
        marks: engine layer name → a disagreement to flag on that layer.
        timeout: seconds ``dot`` may run.

    Raises:
        qdq.lint.draw.DrawError: ``dot`` is missing, fails or times out.
    """
    graph = engine_graph(report, max_nodes=max_nodes, marks=marks)
    return render_svg(to_dot(graph, max_nodes=max_nodes, title=title), timeout=timeout)


def engine_graph(
    report: EngineReport,
    *,
    profile: int = 0,
    max_nodes: int = 150,
    marks: Mapping[str, str] | None = None,
) -> LayerGraph:
    """Nodes (one per engine layer of optimization profile ``profile``, plus the engine inputs and
    outputs, ids ``E<i>``, ``in<k>``, ``out<k>``) and the tensors between them as labelled edges.

    Args:
        report: the parsed engine report.
        profile: which optimization profile's layers to draw.
        max_nodes: the ``to_dot`` limit, past which scope-less engines get runs as scopes.
        marks: engine layer name → a disagreement to flag on that layer.
    """
    layers = [x for x in report.layers if x.profile == profile]
    total = report.total_median_ms() if report.has_timings else 0.0
    scopes = _scopes(layers, max_nodes)
    marks = marks or {}
    nodes = [
        _layer_node(f"E{i}", x, scopes[i], total, marks.get(x.name, ""))
        for i, x in enumerate(layers)
    ]
    producer = {t.name: f"E{i}" for i, x in enumerate(layers) for t in x.outputs}
    edges: dict[tuple[str, str], str] = {}
    labels: dict[tuple[str, str], list[str]] = {}
    sources = [io for io in report.io_tensors if io.mode != "output" and io.name not in producer]
    inputs = {io.name: f"in{k}" for k, io in enumerate(sources)}
    for k, io in enumerate(sources):
        text = f"{io.name}\n{_dims(io.dims)}" if io.dims else io.name
        nodes.insert(k, DrawNode(f"in{k}", text, f"input {io.name}", "input", (("io", 1),)))
    for i, x in enumerate(layers):
        for t in x.compute_inputs:
            src = producer.get(t.name) or inputs.get(t.name)
            if src is None or src == f"E{i}":
                continue
            edges[src, f"E{i}"] = t.dtype or "?"
            labels.setdefault((src, f"E{i}"), []).append(_tensor_label(t))
    for k, io in enumerate(x for x in report.io_tensors if x.mode == "output"):
        nodes.append(DrawNode(f"out{k}", io.name, f"output {io.name}", "output", (("io", 1),)))
        if io.name in producer:
            edges[producer[io.name], f"out{k}"] = io.dtype or "?"
    return LayerGraph(
        tuple(nodes),
        tuple((a, b, p) for (a, b), p in edges.items()),
        {k: "\n".join(dict.fromkeys(v)) for k, v in labels.items()},
    )


def _dims(dims: tuple[int, ...]) -> str:
    return "×".join(str(d) for d in dims)


def _tensor_label(t: EngineTensor) -> str:
    kind = " ".join(p for p in ((t.dtype or "").upper(), short_format(t.format)) if p)
    return "\n".join(p for p in (_dims(t.dims), kind) if p)


def _io_text(t: EngineTensor | None) -> str:
    if t is None:
        return "?"
    return " ".join(p for p in ((t.dtype or "?").upper(), short_format(t.format)) if p)


def _layer_node(
    node_id: str, x: EngineLayer, scope: tuple[str, ...], total: float, mark: str
) -> DrawNode:
    first_in = next(iter(x.compute_inputs), None)
    first_out = next(iter(x.outputs), None)
    src, dst = _io_text(first_in), _io_text(first_out)
    io = src if src == dst else f"{src} → {dst}"
    share = x.median_ms / total if x.median_ms is not None and total > 0 else None
    time = f"{x.median_ms:.3f} ms · {100 * share:.1f} %" if share is not None else ""
    tooltip = "\n".join(
        p for p in (x.name, x.layer_type, x.tactic or "", time and f"median {time}") if p
    )
    if x.is_qdq_reformat or x.is_reformat:
        kind = "qdq" if x.is_qdq_reformat else "reformat"
        head = _wrap(short_name(x)) if kind == "qdq" else "Reformat"
        lines = [head, io, time]
        precision = "qdq"
    else:
        kind = "layer"
        lines = [_wrap(short_name(x)), _type_text(x), io, time]
        compute = x.layer_type not in _NO_COMPUTE
        weights = x.weights_dtype
        quantized = weights if weights in ("int8", "fp8") else None
        precision = (quantized or x.input_precision or "other") if compute else "other"
    label = "\n".join(p for p in lines if p)
    return DrawNode(node_id, label, tooltip, kind, ((precision, 1),), scope, share, mark)


def short_name(x: EngineLayer) -> str:
    """The fused ONNX nodes, short: the last path component; weights, biases and TensorRT's own
    nodes (``(Unnamed Layer* 306) [Shuffle]``, ``copied_squeeze_after_...``) left out. A copy the
    builder inserted names the layer it feeds: ``copy → Conv_5 + Add_6``."""
    copy = _COPY.match(x.name)
    names = list(x.onnx_nodes)
    if copy:
        names = [copy.group(1), *names[1:]]
    kept = [n for n in names if not (n.endswith(_PARAM_FILES) or _INTERNAL.search(n))]
    short = [n.rstrip("/").rsplit("/", 1)[-1] if "/" in n else n for n in kept or names]
    text = " + ".join(dict.fromkeys(short)) or x.name
    return f"copy → {text}" if copy else text


def _wrap(text: str) -> str:
    lines: list[str] = []
    for part in text.split(" + "):
        if lines and len(lines[-1]) + len(part) + 3 <= _WRAP:
            lines[-1] += f" + {part}"
        else:
            lines.append(part if len(part) <= 2 * _WRAP else part[: 2 * _WRAP - 1] + "…")
    if len(lines) > 3:
        lines = [*lines[:2], lines[2] + " + …"]
    return "\n".join(lines)


def _type_text(x: EngineLayer) -> str:
    kind = x.parameter_type or x.layer_type or "?"
    raw = x.raw
    kernel = raw.get("Kernel")
    if isinstance(kernel, list) and 0 < len(kernel) <= 3 and all(type(k) is int for k in kernel):
        kind += " " + "×".join(map(str, kernel))
        stride = raw.get("Stride")
        if isinstance(stride, list) and any(type(s) is int and s > 1 for s in stride[:3]):
            kind += f" /{max(s for s in stride[:3] if type(s) is int)}"
    out = raw.get("OutMaps")
    if type(out) is int and abs(out) < 2**63:
        groups = raw.get("Groups")
        kind += f" → {out}" + (f" g{groups}" if type(groups) is int and 1 < groups < 2**63 else "")
    return kind


def _scopes(layers: list[EngineLayer], max_nodes: int) -> list[tuple[str, ...]]:
    """Module scope per layer from its ONNX node names; runs of consecutive layers when the names
    carry none and the engine is past ``max_nodes``."""
    out = [_layer_scope(x) for x in layers]
    readers: dict[str, list[int]] = {}
    for i, x in enumerate(layers):
        for t in x.inputs:
            readers.setdefault(t.name, []).append(i)
    for i, x in enumerate(layers):  # a standalone Q/DQ or copy joins the layer it feeds
        if not out[i]:  # (the first readers of each output: linear for a tensor read 10^5 times)
            nxt = (j for t in x.outputs for j in readers.get(t.name, [])[:_READERS] if out[j])
            j = next(nxt, None)
            out[i] = out[j] if j is not None else ()
    if len(layers) > max_nodes and sum(1 for s in out if not s) > max_nodes // 2:
        run = max(2, math.ceil(len(layers) / max(1, max_nodes // 2)))
        out = [
            s or (f"layers {i // run * run}–{min(len(layers), (i // run + 1) * run) - 1}",)
            for i, s in enumerate(out)
        ]
    return out


def _layer_scope(x: EngineLayer) -> tuple[str, ...]:
    """At most :data:`_SCOPE_DEPTH` components (a name of 10^5 ``/`` draws as fast as any)."""
    for name in x.onnx_nodes:
        if "/" in name:
            head = "/".join(name.split("/", _SCOPE_DEPTH + 1)[: _SCOPE_DEPTH + 1])
            return module_scope(head)[:_SCOPE_DEPTH]
    for name in x.onnx_nodes:
        if name.endswith(_PARAM_FILES):
            return tuple(name.rsplit(".", 1)[0].split(".", _SCOPE_DEPTH)[:_SCOPE_DEPTH])
    return ()
