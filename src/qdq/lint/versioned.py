"""Rules checked against the declared ``Target`` (TensorRT version and build flags) and the predicted
engine layers rather than the graph alone (rule spec §1.1 V13, §1.2 P03d/P05/P11, §1.5 B01)."""

from __future__ import annotations

from typing import Any

from qdq.lint.findings import ERROR, INFO, WARN, Finding
from qdq.lint.formats import FORMATS, INT8, is_qdq
from qdq.lint.graph import COPY_OPS, LintGraph
from qdq.lint.predict import PredictedLayer, int8_capable, quantized_skips
from qdq.lint.target import Target

__all__ = ["build_rules"]

_SRC = "reference/tensorrt-qdq-rules.md §1.5"


def build_rules(
    g: LintGraph, t: Target, layers: list[PredictedLayer], floats: list[Any]
) -> list[Finding]:
    """V13 (Q/DQ built without INT8), B01 (no FP16 for the float remainder), P11 (Resize), P05
    (INT8 in, float out) and P03d (a quantized residual read by a float-output fusion), read off
    the predicted layers."""
    out: list[Finding] = []
    has_qdq = any(  # INT8 Q/DQ (an FP8 one without --fp8 is F07)
        is_qdq(n) and g.qdq_format(n) == INT8 for n in g.nodes
    )
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
    out.extend(_float_output_skips(g, layers))
    return out


def _float_output_skips(g: LintGraph, layers: list[PredictedLayer]) -> list[Finding]:
    """P03d: a Conv+Add(+act) fusion whose output stays float reads its residual operand in that
    precision ("the precision of the residual input determines the precision of the output",
    and the real engines' fused Conv+Add layers all read it in the output's precision), so a
    quantized residual costs a standalone DequantizeLinear. The fix that keeps the fusion INT8 is
    to quantize the output's readers; when they cannot run INT8, leaving the residual float
    removes the reformat only if nothing else reads that tensor quantized (otherwise it moves to
    the residual's producer, which then writes float for the Add and requantizes for the rest)."""
    by_name = {g.name(n): n for n in g.nodes}
    out: list[Finding] = []
    for ly in layers:
        if ly.kind != "weighted" or not ly.quantized or ly.output_precision == ly.input_precision:
            continue
        members = [by_name[x] for x in ly.nodes]
        out.extend(_p03d(g, ly, members, add, skip) for add, skip in quantized_skips(g, members))
    return out


def final_readers(g: LintGraph, tensor: str) -> tuple[list[Any], bool]:
    """The float readers of ``tensor`` looking through copy ops, and whether it (or a copy of it)
    is a graph output."""
    readers, returned, todo = [], tensor in g.outputs, [tensor]
    while todo:
        for c in g.float_uses(todo.pop()):
            if c.op_type in COPY_OPS:
                todo.extend(c.output)
                returned = returned or any(o in g.outputs for o in c.output)
            else:
                readers.append(c)
    return readers, returned


def can_read_int8(g: LintGraph, node: Any, depth: int = 0) -> bool:
    """Quantizing ``node``'s input would make it run INT8: a weighted op whose weight is quantized
    (one left float on purpose -- a GEMM too small for INT8 kernels (P14), a fallback -- is not
    a fix to suggest); a pool, data-movement or pointwise op only when its own output can be
    INT8 too -- every float reader of it (through copy ops) can read INT8 (P05: INT8 in needs
    INT8 out)."""
    if g.weighted(node):
        return g.dq_weight(node.input[1])
    if not int8_capable(g, node) or depth > 8:
        return False
    for out in node.output:
        readers, returned = final_readers(g, out)
        if returned or not all(can_read_int8(g, r, depth + 1) for r in readers):
            return False
    return True


def _p03d(g: LintGraph, ly: PredictedLayer, members: list[Any], add: Any, skip: Any) -> Finding:
    last = members[-1].output[0]
    readers, returned = final_readers(g, last)
    names = ", ".join(g.name(r) for r in readers) or "the graph output"
    q, dq = g.name(skip.q), g.name(skip.dq)
    effect = (
        f"{ly.name} writes {ly.output_precision} and reads its residual input in "
        f"{ly.output_precision} too: {dq} runs as a standalone Dequantize "
        f"({ly.input_precision.upper()} → {ly.output_precision} reformat)"
    )
    message = (
        f"{g.name(add)}: residual input {skip.source} is quantized but the fused layer's output "
        f"{last} stays float (read by {names})"
    )
    # the skip's tensor and its copies (a transposed view read by a GEMM's Quantize counts too)
    same, todo = {skip.source}, [skip.source]
    while todo:
        for c in g.consumers.get(todo.pop(), []):
            if c.op_type in COPY_OPS and c.output[0] not in same:
                same.add(c.output[0])
                todo.append(c.output[0])
    other_q_readers = [
        c for t in same for c in g.consumers.get(t, []) if c.op_type == "QuantizeLinear"
    ]
    only_here = other_q_readers == [skip.q] and len(g.consumers.get(skip.q.output[0], [])) == 1
    if FORMATS[skip.fmt].plain_layers:
        readable = all(can_read_int8(g, r) for r in readers)
    else:  # FP8: only a GEMM/convolution reads it quantized (no FP8 pooling or pointwise)
        readable = all(g.weighted(r) for r in readers)
    if readers and not returned and readable:
        severity, fix = (
            WARN,
            (
                f"quantize {last} (the input of {names}: for a pool, P06's Q/DQ on the pool input) "
                "so the fusion writes INT8 and reads the residual in INT8"
            ),
        )
    elif only_here:
        severity, fix = (
            WARN,
            (
                f"its reader cannot run INT8: leave the residual float (remove {q} and {dq}; nothing "
                f"else reads {skip.source} quantized), and no reformat remains"
            ),
        )
    else:
        severity, fix = (
            INFO,
            (
                f"no placement removes it while {names} cannot run INT8: leaving the residual float "
                f"only moves the reformat to {skip.source}'s producer (it would write float for "
                "the Add and need a standalone Quantize for its INT8 readers)"
            ),
        )
    return Finding(
        "P03d", severity, (g.name(add), dq), message, effect, fix,
        "reference/tensorrt-qdq-rules.md §1.2 P03, A.3 (residual Add fusion precision)",
    )  # fmt: skip


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
