"""``qdq.lint``: run every rule on a Q/DQ ONNX graph and predict the engine's precision facts."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qdq.lint.findings import ERROR, INFO, WARN, Finding, exit_code
from qdq.lint.graph import COPY_OPS, LintGraph
from qdq.lint.placement import check_placement
from qdq.lint.validity import check_validity

__all__ = ["TARGETS", "LintReport", "lint"]

TARGETS = ("trt10", "trt11")
_SKIP_OPS = COPY_OPS | {"QuantizeLinear", "DequantizeLinear", "Shape", "Constant", "Cast"}


@dataclass(frozen=True)
class LintReport:
    """Findings plus predicted engine facts (plain data; ``to_json`` is stable)."""

    model: str
    target: str
    findings: tuple[Finding, ...]
    summary: dict[str, int]
    int8_layers: tuple[str, ...] = field(default=())
    float_layers: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        """0 clean, 1 warnings, 2 errors."""
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        """``"PASS"``, ``"WARN"`` or ``"ERROR"``."""
        return ("PASS", "WARN", "ERROR")[self.exit_code]

    def rules(self, severity: str | None = None) -> set[str]:
        """Rule ids that fired (optionally only at one severity)."""
        return {f.rule for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict[str, Any]:
        """``{"findings": [{rule, severity, nodes, message, fix, ...}], "summary": {...}}``."""
        return {
            "model": self.model,
            "target": self.target,
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary,
            "int8_layers": list(self.int8_layers),
            "float_layers": list(self.float_layers),
        }

    def to_json(self) -> str:
        """One JSON object."""
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """Human output grouped by severity."""
        s = self.summary
        lines = [
            f"{self.model}: {self.verdict} ({self.target})",
            f"  INT8 weighted layers {s['int8_weighted_layers']}/{s['weighted_layers']} "
            f"({s['int8_flops_percent']}% of FLOPs), "
            f"unfused Q/DQ {s['unfused_qdq']}, float islands {s['float_islands']}",
        ]
        for severity in (ERROR, WARN, INFO):
            group = [f for f in self.findings if f.severity == severity]
            if group:
                lines.append(f"{severity} ({len(group)})")
                lines.extend(
                    f"  {f.rule:<5} {f.message}" + (f"\n        fix: {f.fix}" if f.fix else "")
                    for f in group
                )
        return "\n".join(lines)


def lint(model: str | Path | Any, *, target: str = "trt10") -> LintReport:
    """Lint a Q/DQ ONNX model (path or ``onnx.ModelProto``) for TensorRT.

    Args:
        model: the ONNX file or model.
        target: ``"trt10"`` (weakly typed, INT8+FP16 builds) or ``"trt11"`` (strongly typed: the
            float remainder runs at the ONNX dtype).

    Example:
        >>> report = lint("model.onnx")  # doctest: +SKIP
        >>> report.summary["int8_weighted_layers"], report.verdict  # doctest: +SKIP
    """
    import onnx

    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"no ONNX file at {path}")
        proto, label = onnx.load(str(path)), path.name
    else:
        proto, label = model, getattr(model.graph, "name", "model")
    g = LintGraph(proto)
    findings = check_validity(proto) + check_placement(g)
    int8, floats = _predict(g)
    if target == "trt11":
        findings += _strong_typing(g, floats)
    flops = _weighted_flops(proto, g)
    total_flops = sum(flops.values())
    int8_ids = {id(n) for n in g.nodes if g.int8_weighted(n)}
    int8_flops = sum(f for n, f in flops.items() if n in int8_ids)
    summary = {
        "weighted_layers": sum(1 for n in g.nodes if g.weighted(n)),
        "int8_weighted_layers": sum(1 for n in g.nodes if g.int8_weighted(n)),
        "int8_flops_percent": round(100 * int8_flops / total_flops) if total_flops else 0,
        "unfused_qdq": _unfused(g, findings),
        "float_islands": _islands(g, floats),
    }
    return LintReport(
        label,
        target,
        tuple(findings),
        summary,
        tuple(g.name(n) for n in int8),
        tuple(g.name(n) for n in floats),
    )


def _weighted_flops(proto: Any, g: LintGraph) -> dict[int, int]:
    """Multiply-accumulate counts (x2) of the weighted ops whose shapes shape inference can tell."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # shape inference is best effort here
        return {}
    dims: dict[str, list[int]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
        dims[vi.name] = shape
    out: dict[int, int] = {}  # id(node) -> FLOPs
    for n in g.nodes:
        if not g.weighted(n):
            continue
        w = g.qinput(n.input[1])
        weight = g.const.get(w.source if w is not None else n.input[1])
        y = dims.get(n.output[0])
        if weight is None or not y:
            continue
        if n.op_type in ("Conv", "ConvTranspose"):
            spatial = int(np.prod(y[2:])) if len(y) > 2 else 1
            out[id(n)] = 2 * int(np.prod(weight.shape)) * spatial * y[0]
        else:
            rows = int(np.prod(y[:-1])) if len(y) > 1 else 1
            out[id(n)] = 2 * int(np.prod(weight.shape)) * rows
    return out


def _predict(g: LintGraph) -> tuple[list[Any], list[Any]]:
    """Compute layers predicted INT8 (weighted ops with DQ inputs and their fused epilogues, pools
    and Concats with DQ inputs) vs float."""
    int8: list[Any] = []
    fused: set[int] = set()
    for n in g.nodes:
        if g.int8_weighted(n):
            int8.append(n)
            cur = n.output[0]
            while True:
                readers = g.float_uses(cur)
                silu = _silu(g, cur, readers)
                if silu is not None:
                    fused.update(id(r) for r in readers)
                    cur = silu
                    continue
                if len(readers) != 1 or readers[0].op_type not in (
                    "BatchNormalization",
                    "Relu",
                    "Clip",
                    "LeakyRelu",
                    "Add",
                    "Sigmoid",
                    "Mul",
                ):
                    break
                fused.add(id(readers[0]))
                cur = readers[0].output[0]
        elif n.op_type in ("MaxPool", "GlobalAveragePool", "AveragePool", "Concat") and all(
            g.qinput(i) is not None or _from_int8(g, i) for i in n.input if i
        ):
            int8.append(n)
    floats = [
        n for n in g.nodes if n.op_type not in _SKIP_OPS and id(n) not in fused and n not in int8
    ]
    return int8, floats


def _silu(g: LintGraph, tensor: str, readers: list[Any]) -> str | None:
    """If ``tensor`` feeds exactly Sigmoid(tensor) and Mul(tensor, sigmoid), return the Mul output."""
    if len(readers) != 2 or {r.op_type for r in readers} != {"Sigmoid", "Mul"}:
        return None
    sig = next(r for r in readers if r.op_type == "Sigmoid")
    mul = next(r for r in readers if r.op_type == "Mul")
    return str(mul.output[0]) if set(mul.input) == {tensor, sig.output[0]} else None


def _from_int8(g: LintGraph, tensor: str) -> bool:
    node = g.producer.get(tensor)
    return (
        node is not None
        and node.op_type in ("Relu", "BatchNormalization")
        and g.backbone(tensor) is not None
        and g.int8_weighted(g.backbone(tensor))
    )


def _unfused(g: LintGraph, findings: list[Finding]) -> int:
    """Predicted standalone Quantize/Dequantize layers (Q/DQ-origin reformats)."""
    count = 0
    p03a_adds = {f.nodes[0] for f in findings if f.rule in ("P03a", "P03c")}
    for t in sorted({q.input[0] for q in g.nodes if q.op_type == "QuantizeLinear"}):
        if g.is_const(t):
            continue
        scales = {s for _, _, s in g.quantized_uses(t)}
        floats = [
            c for c in g.float_uses(t) if not (c.op_type == "Add" and g.backbone(t) is not None)
        ]
        standalone = t in g.inputs or bool(floats) or _float_producer(g, t, p03a_adds)
        count += (1 if standalone else 0) + max(0, len(scales) - 1)
    count += sum(1 for f in findings if f.rule in ("P12", "P01"))
    return count


def _float_producer(g: LintGraph, tensor: str, p03a_adds: set[str]) -> bool:
    node = g.producer.get(tensor)
    while node is not None and node.op_type in COPY_OPS | {"Relu", "MaxPool"}:
        if node.op_type == "MaxPool" and len(g.consumers.get(node.input[0], [])) > 1:
            return True
        node = g.producer.get(node.input[0])
    if node is None:
        return True
    if node.op_type == "Add" and g.name(node) in p03a_adds:
        return True
    if node.op_type in ("GlobalAveragePool", "AveragePool", "ReduceMean"):
        return g.qinput(node.input[0]) is None
    return False


def _islands(g: LintGraph, floats: list[Any]) -> int:
    """Connected groups of float compute layers that sit between INT8 layers."""
    ids = {id(n) for n in floats}
    seen: set[int] = set()
    islands = 0
    for n in floats:
        if id(n) in seen:
            continue
        islands += 1
        stack = [n]
        while stack:
            cur = stack.pop()
            if id(cur) in seen:
                continue
            seen.add(id(cur))
            near = [g.producer.get(i) for i in cur.input] + [
                c for o in cur.output for c in g.consumers.get(o, [])
            ]
            stack.extend(x for x in near if x is not None and id(x) in ids)
    return islands


def _strong_typing(g: LintGraph, floats: list[Any]) -> list[Finding]:
    """B02: a float32 ONNX built strongly typed runs everything outside Q/DQ in FP32.
    V11: DequantizeLinear outputs its scale's dtype, so FP32 scales make FP32 consumers."""
    from onnx import TensorProto

    out: list[Finding] = []
    dtypes = Counter(i.data_type for i in g.graph.initializer)
    heads = [
        g.producer[o]
        for o in g.outputs
        if o in g.producer and g.producer[o].op_type not in _SKIP_OPS
    ]
    fp32 = floats + [h for h in heads if h not in floats]
    if fp32 and dtypes.get(TensorProto.FLOAT16, 0) == 0:
        names = tuple(g.name(n) for n in fp32[:10])
        out.append(
            Finding(
                "B02",
                WARN,
                names,
                f"strongly typed target: {len(fp32)} layers outside Q/DQ are FP32 in the ONNX",
                "they run FP32 on TensorRT 11",
                "export with qdq.export_onnx(..., fp16=True) (or ModelOpt AutoCast)",
                "rule spec §1.5",
            )
        )
    fp32_dq = [
        n
        for n in g.nodes
        if n.op_type == "DequantizeLinear"
        and n.input[1] in g.const
        and g.const[n.input[1]].dtype.name == "float32"
        and not g.is_const(n.input[0])
    ]
    if fp32_dq:
        out.append(
            Finding(
                "V11",
                INFO,
                tuple(g.name(n) for n in fp32_dq[:10]),
                f"{len(fp32_dq)} activation DequantizeLinear nodes have FP32 scales",
                "their outputs (and consumers) are FP32 under strong typing, or Casts follow",
                "use opset >= 19 with FP16 scales (qdq.export_onnx(..., fp16=True, opset=19))",
                "rule spec §1.1 V11",
            )
        )
    return out
