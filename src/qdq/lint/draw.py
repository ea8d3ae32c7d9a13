"""Draw a Q/DQ ONNX model as its predicted TensorRT engine: one box per predicted layer, coloured by
the precision it is predicted to run in, with Graphviz.

:func:`layer_graph` turns the ONNX graph and the linter's :class:`~qdq.lint.PredictedLayer` list
into plain data (nodes and data edges between predicted layers; ONNX nodes that belong to no layer —
fused Q/DQ, reshapes, shape arithmetic — are looked through). :func:`to_dot` writes Graphviz DOT:

* a box per layer, filled by its compute precision (INT8 green, FP8 sky blue, FP16 amber, FP32
  red), labelled with its fused ops, its module path and ``in → out`` precision when they differ;
  a standalone Quantize/Dequantize (a reformat) is a small violet ellipse; INT8 edges are drawn
  green, FP8 edges blue;
* layers are boxed by their top-level module; a graph with more than ``max_nodes`` layers is
  collapsed into one box per module scope — the deepest and largest scopes first, until it fits —
  striped by the share of each precision.

:func:`render_svg` runs ``dot -Tsvg`` (Debian package ``graphviz``) and raises :class:`DrawError`
when it is missing or fails; :func:`draw_svg` does all three.

Example:
    >>> import qdq
    >>> report = qdq.lint.lint("model.qdq.onnx")  # doctest: +SKIP
    >>> svg = draw_svg("model.qdq.onnx", report.layers)  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qdq.lint.graph import LintGraph
from qdq.lint.load import load_model
from qdq.lint.predict import PredictedLayer
from qdq.lint.text import visible

__all__ = [
    "MARK_COLOR",
    "PRECISION_COLORS",
    "DrawError",
    "DrawNode",
    "LayerGraph",
    "dot_available",
    "draw_svg",
    "layer_graph",
    "mark_nodes",
    "module_scope",
    "predicted_layer",
    "render_svg",
    "to_dot",
]

#: ``precision: (fill, border)``; ``qdq`` is a standalone Quantize/Dequantize layer
PRECISION_COLORS: dict[str, tuple[str, str]] = {
    "int8": ("#c9ecd5", "#2a9158"),
    "fp8": ("#cfeaf8", "#2386b8"),  # sky blue, as trex draws FP8
    "fp16": ("#fde2ae", "#c98410"),
    "bf16": ("#fde2ae", "#c98410"),
    "fp32": ("#f6c4bd", "#c2412f"),
    "qdq": ("#e6defa", "#7654b8"),
    "io": ("#eceff3", "#6b7684"),
    "reformat": ("#dbe8fb", "#2f62c4"),
}
#: edge colours of tensors in a quantized format
_QUANTIZED_EDGES = {p: PRECISION_COLORS[p][1] for p in ("int8", "fp8")}
#: border of a node marked as a disagreement (:attr:`DrawNode.mark`)
MARK_COLOR = "#d6246e"
_OTHER = ("#e5e7eb", "#6b7280")
_SHORT_OPS = {
    "BatchNormalization": "BN",
    "GlobalAveragePool": "GAP",
    "QuantizeLinear": "Q",
    "DequantizeLinear": "DQ",
    "ReduceMean": "Mean",
}


class DrawError(RuntimeError):
    """Graphviz is missing or failed."""


@dataclass(frozen=True)
class DrawNode:
    """One box: a predicted layer, a collapsed module scope, or a graph input/output.

    Attributes:
        id: DOT node id.
        label: text inside the box (lines joined with ``"\\n"``).
        tooltip: shown on hover (the full layer name and the reason it is float).
        kind: ``"layer"``, ``"qdq"``, ``"reformat"`` (a builder-inserted reformat of a real
            engine), ``"group"``, ``"input"`` or ``"output"``.
        precisions: compute precision → number of layers (one entry for a single layer).
        scope: module path components of the layer (of the scope for a group).
        share: fraction of the engine's latency spent in this layer (or group), if profiled.
        mark: a disagreement to flag (a thick magenta border and a last ``≠ mark`` label line).
    """

    id: str
    label: str
    tooltip: str
    kind: str
    precisions: tuple[tuple[str, int], ...]
    scope: tuple[str, ...] = ()
    share: float | None = None
    mark: str = ""


@dataclass(frozen=True)
class LayerGraph:
    """Layers and the data edges between them (``(src, dst, precision)``).

    ``edge_labels`` maps ``(src, dst)`` to the text drawn on that edge (a real engine's tensor
    shape, precision and format); edges into or out of a collapsed group are drawn unlabelled.
    """

    nodes: tuple[DrawNode, ...]
    edges: tuple[tuple[str, str, str], ...]
    edge_labels: dict[tuple[str, str], str] = field(default_factory=dict, compare=False)


def mark_nodes(graph: LayerGraph, marks: Mapping[str, str]) -> LayerGraph:
    """``graph`` with :attr:`DrawNode.mark` set on the nodes whose id is in ``marks``."""
    nodes = tuple(replace(n, mark=marks[n.id]) if n.id in marks else n for n in graph.nodes)
    return LayerGraph(nodes, graph.edges, graph.edge_labels)


def dot_available() -> bool:
    """Whether Graphviz ``dot`` is on ``PATH``."""
    return shutil.which("dot") is not None


def draw_svg(
    model: str | Path | Any,
    layers: Sequence[PredictedLayer | Mapping[str, Any]],
    *,
    max_nodes: int = 150,
    timeout: float = 120.0,
) -> str:
    """The model's predicted engine as an inline SVG string (see the module docstring).

    Raises:
        DrawError: ``dot`` is missing, fails or times out.
        qdq.lint.LintInputError: the model cannot be read.
    """
    return render_svg(to_dot(layer_graph(model, layers), max_nodes=max_nodes), timeout=timeout)


def render_svg(dot_source: str, *, timeout: float = 120.0) -> str:
    """Run ``dot -Tsvg``; return the ``<svg>`` element (no XML prolog, ready to inline in HTML).

    Raises:
        DrawError: ``dot`` is not installed, exits non-zero or runs past ``timeout`` seconds.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise DrawError(
            "Graphviz 'dot' is not installed (Debian: apt-get install graphviz; pip cannot "
            "install it)"
        )
    try:
        proc = subprocess.run(
            [exe, "-Tsvg"],
            input=dot_source.encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DrawError(f"Graphviz 'dot' ran past {timeout:.0f} s") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()
        raise DrawError(f"Graphviz 'dot' failed: {why[-1] if why else proc.returncode}")
    svg = proc.stdout.decode()
    start = svg.find("<svg")
    if start < 0:
        raise DrawError("Graphviz 'dot' wrote no <svg> element")
    return svg[start:].strip()


def layer_graph(
    model: str | Path | Any, layers: Sequence[PredictedLayer | Mapping[str, Any]]
) -> LayerGraph:
    """Nodes (one per predicted layer, plus graph inputs and outputs) and data edges.

    Args:
        model: the Q/DQ ONNX (path or ``onnx.ModelProto``) the layers were predicted for.
        layers: :attr:`qdq.lint.LintReport.layers`, or their ``to_dict()`` (``report.json``).
    """
    proto, _ = load_model(model)
    g = LintGraph(proto)
    preds = [ly if isinstance(ly, PredictedLayer) else predicted_layer(ly) for ly in layers]
    ops = {g.name(n): n.op_type for n in g.nodes}
    layer_of = {name: i for i, ly in enumerate(preds) for name in ly.nodes}
    nodes: list[DrawNode] = []
    for i, ly in enumerate(preds):
        nodes.append(_layer_node(f"L{i}", ly, ops))
    edges: set[tuple[str, str, str]] = set()
    members = {g.name(n): n for n in g.nodes}
    for i, ly in enumerate(preds):
        outs = [o for name in ly.nodes if name in members for o in members[name].output]
        for target in _reached(g, outs, layer_of, i):
            edges.add((f"L{i}", target, ly.output_precision))
    io_names = {i.name: i for i in proto.graph.input}
    for k, name in enumerate(sorted(g.inputs)):
        nodes.insert(k, DrawNode(f"in{k}", name, f"input {name}", "input", (("io", 1),)))
        precision = _io_precision(io_names[name]) if name in io_names else "fp32"
        for target in _reached(g, [name], layer_of, -1):
            edges.add((f"in{k}", target, precision))
    for k, name in enumerate(sorted(g.outputs)):
        nodes.append(DrawNode(f"out{k}", name, f"output {name}", "output", (("io", 1),)))
    return LayerGraph(tuple(nodes), tuple(sorted(edges, key=_edge_order)))


def _edge_order(edge: tuple[str, str, str]) -> tuple[str, str]:
    return edge[0], edge[1]


def predicted_layer(d: Mapping[str, Any]) -> PredictedLayer:
    """A :class:`PredictedLayer` from its ``to_dict()`` (an entry of ``report.json``)."""
    return PredictedLayer(
        name=str(d["name"]),
        nodes=tuple(d["nodes"]),
        kind=str(d["kind"]),
        input_precision=str(d["input_precision"]),
        output_precision=str(d["output_precision"]),
        reason=str(d.get("reason", "")),
    )


def _io_precision(value_info: Any) -> str:
    return {1: "fp32", 10: "fp16", 16: "bf16"}.get(value_info.type.tensor_type.elem_type, "fp32")


def _reached(g: LintGraph, tensors: list[str], layer_of: dict[str, int], own: int) -> list[str]:
    """Node ids the tensors flow into, looking through nodes that belong to no layer."""
    found: list[str] = []
    seen: set[str] = set()
    stack = list(tensors)
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in g.outputs:
            found.append(f"out{sorted(g.outputs).index(t)}")
        for c in g.consumers.get(t, []):
            j = layer_of.get(g.name(c))
            if j is None:
                stack.extend(c.output)
            elif j != own:
                found.append(f"L{j}")
    return found


def module_scope(node_name: str) -> tuple[str, ...]:
    """Module path components of an exported node name.

    ``"layer1.conv1/Conv"`` (dynamo) and ``"/layer1/layer1.0/conv1/Conv"`` (TorchScript) give
    ``("layer1", "conv1")`` and ``("layer1", "0", "conv1")``.
    """
    parts = [p for p in node_name.split("/")[:-1] if p]
    path: list[str] = []
    for p in parts:
        dotted = ".".join(path)
        path = p.split(".") if dotted and p.startswith(dotted + ".") else [*path, *p.split(".")]
    return tuple(path)


def _layer_node(node_id: str, ly: PredictedLayer, ops: dict[str, str]) -> DrawNode:
    chain = " + ".join(_SHORT_OPS.get(ops.get(n, "?"), ops.get(n, "?")) for n in ly.nodes)
    scope = module_scope(ly.nodes[0]) if ly.nodes else ()
    where = ".".join(scope)
    if ly.kind == "qdq":
        label = chain if not where else f"{chain}\n{where}"
        return DrawNode(node_id, label, _tooltip(ly), "qdq", (("qdq", 1),), scope)
    precision = ly.input_precision
    lines = [chain]
    if where:
        lines.append(where)
    lines.append(
        precision.upper()
        if ly.output_precision == precision
        else f"{precision.upper()} → {ly.output_precision.upper()}"
    )
    return DrawNode(node_id, "\n".join(lines), _tooltip(ly), "layer", ((precision, 1),), scope)


def _tooltip(ly: PredictedLayer) -> str:
    text = f"{ly.name}: {ly.input_precision} → {ly.output_precision}"
    return f"{text} ({ly.reason})" if ly.reason else text


# --------------------------------------------------------------------------------- DOT
def to_dot(graph: LayerGraph, *, max_nodes: int = 150, title: str = "") -> str:
    """Graphviz DOT for ``graph``; more than ``max_nodes`` layers are collapsed by module scope.

    Example:
        >>> n = DrawNode("L0", "Conv\\nINT8", "conv", "layer", (("int8", 1),), ("conv1",))
        >>> print(to_dot(LayerGraph((n,), ())).splitlines()[0])
        digraph engine {
    """
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 2:
        raise ValueError(f"max_nodes must be an int >= 2, got {max_nodes!r}")
    layers = [n for n in graph.nodes if n.kind in _LAYER_KINDS]
    nodes, edges = list(graph.nodes), list(graph.edges)
    labels = graph.edge_labels
    if len(layers) > max_nodes:
        nodes, edges = _collapse(graph, _collapse_keys(layers, max_nodes))
    lines = [
        "digraph engine {",
        '  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, fontname="Helvetica", fontsize=11,'
        ' bgcolor="transparent"' + (f', label="{_esc(title)}", labelloc=t' if title else "") + "];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10,'
        ' margin="0.12,0.05", penwidth=1.2];',
        '  edge [color="#9aa3ad", arrowsize=0.6, fontname="Helvetica", fontsize=8,'
        ' fontcolor="#5b6573"];',
    ]
    depth = _cluster_depth([n.scope for n in nodes if n.kind in (*_LAYER_KINDS, "group")])
    clusters: dict[tuple[str, ...], list[DrawNode]] = {}
    loose: list[DrawNode] = []
    for n in nodes:
        key = n.scope[:depth] if depth and len(n.scope) >= depth else ()
        (clusters.setdefault(key, []) if key else loose).append(n)
    for k, (key, members) in enumerate(clusters.items()):
        if len(members) < 2:
            loose.extend(members)
            continue
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(
            f'    label="{_esc(".".join(key))}"; labeljust=l; style="rounded,dashed";'
            ' color="#b8c0ca"; fontcolor="#5b6573";'
        )
        lines.extend("    " + _node_line(n) for n in members)
        lines.append("  }")
    lines.extend("  " + _node_line(n) for n in loose)
    for src, dst, precision in edges:
        edge = _QUANTIZED_EDGES.get(precision)
        attrs = [f'color="{edge}"', "penwidth=1.6"] if edge else []
        if (src, dst) in labels:
            attrs.append(f'label="{_esc(labels[src, dst])}"')
        lines.append(f"  {src} -> {dst}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"


_LAYER_KINDS = ("layer", "qdq", "reformat")


def _node_line(n: DrawNode) -> str:
    attrs = {
        "label": f"{n.label}\n≠ {n.mark}" if n.mark else n.label,
        "tooltip": f"{n.mark}: {n.tooltip}" if n.mark else n.tooltip,
    }
    if n.kind in ("input", "output"):
        fill, border = PRECISION_COLORS["io"]
        extra = f'shape=oval, style=filled, fillcolor="{fill}", color="{border}"'
    elif n.kind in ("qdq", "reformat"):
        fill, border = PRECISION_COLORS[n.kind]
        shape = "ellipse" if n.kind == "qdq" else "hexagon"
        extra = (
            f'shape={shape}, style="filled,dashed", fillcolor="{fill}", color="{border}",'
            " fontsize=8, height=0.3, penwidth=1.6"
        )
    else:
        total = sum(c for _, c in n.precisions)
        colors = [(PRECISION_COLORS.get(p, _OTHER), c) for p, c in n.precisions]
        border = max(colors, key=lambda pc: pc[1])[0][1]
        if len(colors) == 1:
            extra = f'fillcolor="{colors[0][0][0]}", color="{border}"'
        else:
            stripes = ":".join(f"{fill};{c / total:.3f}" for (fill, _), c in colors)
            extra = f'style="rounded,filled,striped", fillcolor="{stripes}", color="{border}"'
        if n.kind == "group":
            extra += ", penwidth=2"
    if n.mark:
        extra += f', color="{MARK_COLOR}", penwidth=3.5'
    label = ", ".join(f'{k}="{_esc(v)}"' for k, v in attrs.items())
    return f"{n.id} [{label}, {extra}];"


def _esc(text: str) -> str:
    # control characters made visible (a raw one makes the SVG ill-formed XML); "&" as "&amp;"
    # (dot passes "&#x1b;" through as a raw character)
    text = visible(text, keep="\n").replace("&", "&amp;")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _cluster_depth(scopes: list[tuple[str, ...]]) -> int:
    """The first depth at which the scopes differ (so ``model.0``, ``model.1`` cluster apart), or
    deeper while one scope still holds most layers (``features`` of a torchvision MobileNet beside
    its ``classifier``: cluster ``features.0``, ``features.1``, ... instead)."""
    longest = max((len(s) for s in scopes), default=0)
    for d in range(1, longest + 1):
        groups = Counter(s[:d] for s in scopes if len(s) >= d)
        if len(groups) > 1 and (
            max(groups.values()) <= len(scopes) // 2
            or d == longest
            or len(Counter(s[: d + 1] for s in scopes if len(s) > d)) <= len(groups)
        ):
            return d
    return 0


def _collapse_keys(layers: list[DrawNode], max_nodes: int) -> dict[str, tuple[str, ...]]:
    """Which module scope each collapsed layer joins: the deepest scopes first, the largest first at
    each depth, until at most ``max_nodes`` boxes remain (a layer not in the result stays single)."""
    keys: dict[str, tuple[str, ...]] = {}

    def boxes() -> int:
        return len({keys.get(n.id, (n.id,)) for n in layers})

    longest = max((len(n.scope) for n in layers), default=0)
    for depth in range(longest, 0, -1):
        groups: dict[tuple[str, ...], list[DrawNode]] = {}
        for n in layers:
            if len(n.scope) >= depth:
                groups.setdefault(n.scope[:depth], []).append(n)
        for prefix, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            if boxes() <= max_nodes:
                return keys
            if len(members) > 1:
                keys.update((m.id, prefix) for m in members)
    return keys


def _collapse(
    graph: LayerGraph, keys: dict[str, tuple[str, ...]]
) -> tuple[list[DrawNode], list[tuple[str, str, str]]]:
    """One node per collapsed module scope (``keys``: layer id → scope); the rest unchanged."""
    members: dict[tuple[str, ...], list[DrawNode]] = {}
    for n in graph.nodes:
        if n.id in keys:
            members.setdefault(keys[n.id], []).append(n)
    ids = {key: f"G{k}" for k, key in enumerate(members)}
    group_of = {node_id: ids[key] for node_id, key in keys.items()}
    nodes: list[DrawNode] = []
    emitted: set[str] = set()
    for n in graph.nodes:
        if n.id not in keys:
            nodes.append(n)
        elif group_of[n.id] not in emitted:
            emitted.add(group_of[n.id])
            nodes.append(_group_node(group_of[n.id], keys[n.id], members[keys[n.id]]))
    edges: set[tuple[str, str, str]] = set()
    for src, dst, precision in graph.edges:
        a, b = group_of.get(src, src), group_of.get(dst, dst)
        if a != b:
            edges.add((a, b, precision))
    return nodes, sorted(edges, key=_edge_order)


def _group_node(gid: str, key: tuple[str, ...], members: list[DrawNode]) -> DrawNode:
    counts: Counter[str] = Counter()
    for m in members:
        if m.kind not in ("qdq", "reformat"):
            counts.update({p: c for p, c in m.precisions})
    reformats = sum(1 for m in members if m.kind == "qdq")
    builder = sum(1 for m in members if m.kind == "reformat")
    order = [p for p in PRECISION_COLORS if p in counts] + sorted(
        set(counts) - set(PRECISION_COLORS)
    )
    mix = " · ".join(f"{counts[p]} {p.upper()}" for p in order)
    extra = (f" · {reformats} Q/DQ" if reformats else "") + (
        f" · {builder} reformat{'' if builder == 1 else 's'}" if builder else ""
    )
    name = ".".join(key)
    total = sum(counts.values())
    label = f"{name}\n{total} layer{'' if total == 1 else 's'}: {mix}{extra}"
    shares = [m.share for m in members if m.share is not None]
    share = sum(shares) if shares else None
    if share is not None:
        label += f"\n{100 * share:.1f} % of the time"
    tooltip = f"{name}: " + "; ".join(m.tooltip for m in members[:12])
    precisions = tuple((p, counts[p]) for p in order) or (("qdq", reformats + builder),)
    marks = [m.mark for m in members if m.mark]
    mark = (marks[0] if len(marks) == 1 else f"{len(marks)} layers differ") if marks else ""
    return DrawNode(gid, label, tooltip, "group", precisions, key, share, mark)
