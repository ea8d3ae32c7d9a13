"""Step 3 of the planner: average pools (P06) and Concats (S02).

A pool's or a Concat's inputs are quantized when its output feeds a quantized op, so it runs INT8
between Q/DQ (a Concat with one scale shared by its inputs and its readers). Later steps can give
such an op its first quantized reader (a P17 Add, a P04 fan-out reader): the planner then calls
:func:`plan_pools_and_concats` again with ``again=True`` for those left float until nothing changes.
Two shapes are planned from their readers' side:

* a global pool read by one activation before a quantized reader (FocalNet's
  ``gelu(ctx.mean((2, 3), keepdim=True))``): the pooled vector is quantized too, so the pool runs
  INT8 in and out and its input is not also read in float (P04);
* a Concat read only by ReLU-family activations before quantized ops (NASNet's and PNASNet's
  cells): each activation reads it in INT8 as an INT8 PointWise layer.
"""

from __future__ import annotations

import torch.fx as fx

from qdq.graph.context import (
    PlanContext,
    input_label,
    input_point,
    input_points,
    quantize_input,
    reaches_quantized,
    release,
    skip_input,
    users_through,
)
from qdq.graph.patterns import COPY_KINDS, THROUGH_ACT_KINDS, tensor_inputs
from qdq.graph.residual import weighted_writer

__all__ = [
    "NO_QUANTIZED_READER",
    "left_float",
    "plan_concat",
    "plan_pools_and_concats",
    "release_float_written_concats",
]

#: the reason of a pool or Concat left float (``again`` plans it when a reader appears)
NO_QUANTIZED_READER = "output does not feed a quantized op"


def plan_pools_and_concats(ctx: PlanContext, nodes: list[fx.Node], again: bool = False) -> bool:
    """Step 3: average pools, then Concats from the output back (a Concat read by a quantized
    Concat is quantized too). With ``again``, only those left float for want of a quantized
    reader that a later step has since given one; returns whether any was planned.

    A Concat is planned before the float Adds between INT8 layers (P17) and the fan-out readers
    (P04), so when its only quantized reader is such an Add (GhostNet's ``cat(x1, cheap(x1))``
    sliced into the residual Add) it was left float and the Add then quantized its output: a
    standalone Quantize after a float Concat (S02b), and ``x1`` read both INT8 (by the cheap
    depthwise conv) and float (by the Concat: P04). Planned again, its inputs share the output's
    scale, the Concat is eliminated and its producers write INT8. A Concat quantized then can make
    another Add eligible for P17 or another reader a P04 fan-out reader: the caller loops.
    """
    planned = False
    for n in nodes:
        if ctx.kinds[n] == "avg_pool" and (not again or _late_reader(ctx, n)):
            _plan_avg_pool(ctx, n)
            planned = True
    for n in reversed(nodes):
        if ctx.kinds[n] == "cat" and not again:
            _plan_activation_readers(ctx, n)
        if ctx.kinds[n] == "cat" and (not again or _late_reader(ctx, n)):
            plan_concat(ctx, n)
            planned = True
    return planned


#: what an INT8 PointWise layer after a Concat may be made of (a BatchNorm first, then these)
_POINTWISE_ACT_KINDS = frozenset({"act", "silu", "hardswish"})


def _pointwise_reader(ctx: PlanContext, node: fx.Node) -> bool:
    """``node`` starts a PointWise layer (an activation, or a standalone BatchNorm and the
    activations after it) whose output a quantized op reads: given an INT8 input it runs INT8."""
    kind = ctx.kinds[node]
    if len(tensor_inputs(node)) != 1:
        return False
    if kind in _POINTWISE_ACT_KINDS:
        return reaches_quantized(ctx, node)
    return kind == "bn" and reaches_quantized(ctx, node, THROUGH_ACT_KINDS | _POINTWISE_ACT_KINDS)


def _plan_activation_readers(ctx: PlanContext, node: fx.Node) -> None:
    """S02: a Concat read only by activations (or a BatchNorm and its activation) that quantized
    ops read: NASNet's and PNASNet's cells, each cell's Concat read by the next cells'
    ``relu -> conv``; DPN's last dual-path Concat read by ``silu(bn(x))`` before the pooled head.
    Each reader takes the Concat in INT8 and runs as an INT8 PointWise layer (DQ-in/Q-out: a
    pre-activation cannot join the conv after it), so the Concat runs INT8 too and its inputs
    (the cell's conv+Add fusions) write INT8; left float, every cell output was written in float
    and quantized again by a standalone Quantize per reader (P03a/P04)."""
    readers = [u for u in node.users if ctx.kinds[u] not in ("shape",)]
    if not readers or reaches_quantized(ctx, node) or not ctx.config.family_enabled("concat"):
        return
    if not all(_pointwise_reader(ctx, u) for u in readers):
        return
    resolved = [
        ctx.config.resolve(ctx.owners[u], ctx.owner_types[u], ctx.kinds[u]) for u in readers
    ]
    if any(excluded for excluded, _, _ in resolved):
        return
    for reader, (_, calib_o, bits_o) in zip(readers, resolved, strict=True):
        quantize_input(
            ctx,
            reader,
            tensor_inputs(reader)[0][0],
            node,
            "S02",
            f"{ctx.kinds[reader]} reading a Concat before a quantized op: it reads the Concat in "
            "INT8 and runs as an INT8 PointWise layer, so the Concat and the layers writing its "
            "inputs run INT8 too",
            calib_o,
            bits_o,
        )


def _late_reader(ctx: PlanContext, node: fx.Node) -> bool:
    """``node`` was left float for want of a quantized reader, and now has one."""
    if not left_float(ctx, node):
        return False
    return reaches_quantized(ctx, node) or (
        ctx.kinds[node] == "avg_pool" and _pooled_readers(ctx, node) is not None
    )


#: per-element ops TensorRT runs alone on a pooled vector, on the way to a quantized reader (GELU
#: has no INT8 PointWise path; a BatchNorm1d before the classifier is a Scale layer)
_POOLED_KINDS = frozenset({"act", "gelu", "silu", "sigmoid", "hardswish", "bn"})


def _pooled_readers(ctx: PlanContext, node: fx.Node) -> list[fx.Node] | None:
    """The readers (through copies: a flatten) of a global average pool's output when every one
    is a per-element op on the pooled vector through which a quantized op reads it: FocalNet's
    ``gelu(ctx.mean((2, 3), keepdim=True))`` read by its INT8 modulator, RepViT's
    ``linear(bn1d(flatten(pool(x))))`` heads. ``None`` otherwise."""
    shape = getattr(node.meta.get("tensor_meta"), "shape", None)
    if shape is None or len(shape) < 2 or any(d != 1 for d in shape[2:]):
        return None  # not a global pool (``(N, C)``: a mean without keepdim): no small vector
    reached = users_through(ctx, node, COPY_KINDS)
    copies = [u for u in reached if ctx.kinds[u] in COPY_KINDS]
    readers = [u for u in reached if ctx.kinds[u] not in COPY_KINDS and ctx.kinds[u] != "shape"]
    if any(len(tensor_inputs(u)) != 1 for u in (*copies, *readers)):
        return None
    if any(ctx.kinds[u] not in _POOLED_KINDS for u in readers):
        return None
    through = THROUGH_ACT_KINDS | _POOLED_KINDS
    if not readers or not all(reaches_quantized(ctx, u, through) for u in readers):
        return None
    return readers


def left_float(ctx: PlanContext, node: fx.Node) -> bool:
    """Every input point of ``node`` is a skip for want of a quantized reader."""
    owner = ctx.owners[node]
    points = [ctx.points.get(f"{owner}:{input_label(node, pos)}") for pos, _ in tensor_inputs(node)]
    return bool(points) and all(
        p is not None and not p.quantized and p.reason.startswith(NO_QUANTIZED_READER)
        for p in points
    )


def _plan_avg_pool(ctx: PlanContext, node: fx.Node) -> None:
    ins = tensor_inputs(node)
    if not ins:
        return
    pos, producer = ins[0]
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "avg_pool")
    if excluded or not ctx.config.family_enabled("pooling"):
        reason = "excluded by the QuantConfig" if excluded else "rule family 'pooling' disabled"
        skip_input(ctx, node, pos, producer, "USER" if excluded else "P06", reason, label="input")
        return
    readers = None if reaches_quantized(ctx, node) else _pooled_readers(ctx, node)
    if readers is not None or reaches_quantized(ctx, node):
        quantize_input(
            ctx,
            node,
            pos,
            producer,
            "P06",
            "average pool between INT8 layers runs INT8 with DQ-in/Q-out",
            calib_o,
            bits_o,
        )
    for reader in readers or ():  # the pool's Q-out: the ops after it run on the pooled vector
        rpos, rproducer = tensor_inputs(reader)[0]
        quantize_input(
            ctx,
            reader,
            rpos,
            rproducer,
            "P06",
            f"{ctx.kinds[reader]} on a global average pool's output before a quantized reader: "
            "the pooled vector is quantized too, so the pool runs INT8 in and out (its input is "
            "not also read in float, P04) and this op runs alone on a C-element vector",
            calib_o,
            bits_o,
        )
    if readers is None and not reaches_quantized(ctx, node):
        skip_input(
            ctx,
            node,
            pos,
            producer,
            "P06",
            f"{NO_QUANTIZED_READER}; the pool stays float",
            label="input",
        )


def plan_concat(ctx: PlanContext, node: fx.Node, *, fanout: bool = False) -> None:
    ins = tensor_inputs(node)
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "cat")
    quantize = not excluded and ctx.config.family_enabled("concat")
    quantize = quantize and (fanout or reaches_quantized(ctx, node))
    for pos, producer in ins:
        if quantize:
            quantize_input(
                ctx,
                node,
                pos,
                producer,
                "P04" if fanout else "S02",
                "Concat input: inputs and output share one scale"
                + (
                    "; its inputs are INT8 already (for other readers, or written by INT8 "
                    "layers), so the Concat runs INT8 and one Dequantize serves its float reader "
                    "(no input written twice)"
                    if fanout
                    else ""
                ),
                calib_o,
                bits_o,
            )
            continue
        if excluded:
            rule, reason = "USER", "excluded by the QuantConfig"
        elif not ctx.config.family_enabled("concat"):
            rule, reason = "S02", "rule family 'concat' disabled"
        else:
            rule, reason = "S02", f"{NO_QUANTIZED_READER}; the Concat stays float"
        skip_input(ctx, node, pos, producer, rule, reason, label=input_label(node, pos))


def release_float_written_concats(ctx: PlanContext, nodes: list[fx.Node]) -> int:
    """S02 once the weighted layers' precisions are final (after H02's small convolutions that
    read INT8 went INT8): a quantized Concat with two or more inputs written by float Conv/GEMM
    layers stays float. Those layers cannot write INT8 at no cost, so each such input's Quantize
    would run standalone, where the Concat's quantized reader quantizes its output with one.
    Returns the number of Concats released."""
    released = 0
    for n in nodes:
        if ctx.kinds[n] != "cat":
            continue
        points = input_points(ctx, n)
        if not all(p is not None and p.quantized and p.rule == "S02" for p in points):
            continue
        floats = _float_writers(ctx, tensor_inputs(n))
        if len(floats) < 2:
            continue
        reason = (
            f"{len(floats)} of its inputs are written by float layers ({', '.join(floats[:3])}"
            f"{', ...' if len(floats) > 3 else ''}): quantized, each would be a standalone "
            "Quantize; the Concat stays float and its quantized reader quantizes its output "
            "(one Quantize)"
        )
        for p in points:
            assert p is not None
            release(ctx, p, "S02", reason)
        released += 1
    return released


def _float_writers(ctx: PlanContext, ins: list[tuple[int, fx.Node]]) -> list[str]:
    """The float Conv/GEMM layers (their owners: left float by an earlier rule, H02's small
    convolutions) that write the Concat inputs ``ins``, through their epilogues and pass-through
    ops: such a layer cannot write INT8 at no cost, so an INT8 Concat input it writes is a
    standalone Quantize (Res2Net's 14-channel 3x3 convolutions: seven per block)."""
    found = []
    for _, producer in ins:
        layer = weighted_writer(ctx, producer)
        ups = tensor_inputs(layer) if layer is not None else []
        if layer is None or not ups:
            continue
        point = input_point(ctx, layer, ups[0][0])
        if point is not None and not point.quantized:
            found.append(ctx.owners[layer])
    return found
