"""Rules checked against the declared ``Target`` (TensorRT version and build flags) and the predicted
engine layers rather than the graph alone (rule spec §1.1 V13, §1.2 P05/P11, §1.5 B01)."""

from __future__ import annotations

from typing import Any

from qdq.lint.findings import ERROR, INFO, WARN, Finding
from qdq.lint.graph import LintGraph
from qdq.lint.predict import PredictedLayer
from qdq.lint.target import Target

__all__ = ["build_rules"]

_SRC = "reference/tensorrt-qdq-rules.md §1.5"


def build_rules(
    g: LintGraph, t: Target, layers: list[PredictedLayer], floats: list[Any]
) -> list[Finding]:
    """V13 (Q/DQ built without INT8), B01 (no FP16 for the float remainder), P11 (Resize), and
    P05 (INT8 in, float out), read off the predicted layers."""
    out: list[Finding] = []
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in g.nodes)
    if not t.strongly_typed and has_qdq and not t.flags & {"int8", "best"}:
        out.append(
            Finding(
                "V13",
                ERROR,
                (),
                f"a Q/DQ model built with flags {sorted(t.flags) or 'none'} (no --int8)",
                "the weakly typed build fails or does not run the Q/DQ layers in INT8",
                "build with --int8 --fp16 (or --stronglyTyped on TensorRT >= 10.12)",
                "NVIDIA/TensorRT#4021",
            )
        )
    if not t.strongly_typed and floats and not t.flags & {"fp16", "best"}:
        names = tuple(g.name(n) for n in floats[:10])
        out.append(
            Finding(
                "B01",
                WARN,
                names,
                f"weakly typed build without --fp16: {len(floats)} layers outside Q/DQ run FP32",
                "FP32 islands (the INT8 engine can end up slower than FP16)",
                "add --fp16 to the build (or --best)",
                _SRC,
            )
        )
    out.extend(_resize(g, t, layers))
    out.extend(_int8_in_float_out(g, layers))
    return out


def _int8_in_float_out(g: LintGraph, layers: list[PredictedLayer]) -> list[Finding]:
    """P05: a quantizable non-weighted layer whose inputs are quantized but whose output is not:
    TensorRT needs INT8 out for INT8 in, so it runs float behind standalone Dequantize layers."""
    by_name = {g.name(n): n for n in g.nodes}
    out = []
    for ly in layers:
        if ly.kind in ("weighted", "qdq") or ly.reason != "output not quantized":
            continue
        inputs = [i for x in ly.nodes for i in by_name[x].input if i]
        dqs = [g.name(q.dq) for i in inputs if (q := g.qinput(i)) is not None]
        out.append(
            Finding(
                "P05",
                WARN,
                (ly.name, *dqs),
                f"{ly.name}: inputs quantized but its output is not",
                f"runs {ly.output_precision} behind standalone Dequantize layer(s)",
                "quantize its output (the input of its consumer) too, or remove the input Q/DQ",
                "reference/tensorrt-qdq-rules.md §1.2 P05",
            )
        )
    return out


def _resize(g: LintGraph, t: Target, layers: list[PredictedLayer]) -> list[Finding]:
    """P11: nearest Resize between INT8 layers runs INT8 from TensorRT 8.6 on, float before."""
    int8 = {n for ly in layers if ly.int8 for n in ly.nodes}
    out = []
    for n in g.nodes:
        name = g.name(n)
        if n.op_type != "Resize" or name not in int8:
            continue
        new = t.at_least(8, 6)
        out.append(
            Finding(
                "P11",
                INFO,
                (name,),
                f"{name}: nearest Resize between INT8 layers",
                "runs INT8 (TensorRT >= 8.6)" if new else f"no INT8 Resize in {t.label}: reformats",
                "" if new else "target TensorRT >= 8.6, or keep the Resize float",
                "NVIDIA/TensorRT#2976, #1310",
            )
        )
    return out
