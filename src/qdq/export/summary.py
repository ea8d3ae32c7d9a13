"""A text summary of an exported graph (op counts + Q/DQ placement), for golden tests and reports."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["graph_summary"]


def graph_summary(model: Any) -> str:
    """Op counts, then one line per non-Q/DQ op: its name, type and which inputs arrive through DQ.

    Example line: ``layer1.conv1/Conv  Conv  in=[DQ, DQ]``.
    """
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    counts = Counter(n.op_type for n in graph.node)
    lines = ["ops: " + ", ".join(f"{op} {k}" for op, k in sorted(counts.items()))]
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "Constant", "Identity"):
            continue
        ins = []
        for name in node.input:
            src = producers.get(name)
            ins.append("DQ" if src is not None and src.op_type == "DequantizeLinear" else "-")
        lines.append(f"{node.name}  {node.op_type}  in=[{', '.join(ins)}]")
    return "\n".join(lines) + "\n"
