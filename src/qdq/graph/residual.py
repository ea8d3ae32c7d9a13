"""Rule step 2: residual Adds (P03, P05) — quantize only the operand TensorRT cannot fuse."""

from __future__ import annotations

from collections import deque

import torch.fx as fx

from qdq.graph.context import (
    PlanContext,
    alias_root,
    final_reads,
    quantize_input,
    reaches_quantized,
    release,
    skip_input,
)
from qdq.graph.patterns import (
    COPY_KINDS,
    EPILOGUE_KINDS,
    PASS_THROUGH_KINDS,
    WEIGHTED_KINDS,
    tensor_inputs,
)
from qdq.graph.plan import QuantPoint
from qdq.graph.streams import norm_reader

__all__ = ["fused_layer", "plan_residual_add", "silu_operand", "weighted_writer"]

#: pointwise ops whose other operand is a constant (ConvNeXt's LayerScale ``x * gamma``, a bias
#: ``x + b``): one more pointwise op of the epilogue, with a single activation input
_CONSTANT_OPERAND_KINDS = frozenset({"mul", "add"})
#: what a fused conv+Add's output passes through before its readers: its epilogue (the activation
#: TensorRT fuses after it) and pass-through ops
_THROUGH_EPILOGUE = PASS_THROUGH_KINDS | EPILOGUE_KINDS


def _backbone(ctx: PlanContext, x: fx.Node) -> fx.Node | None:
    """The quantized weighted op whose epilogue can absorb an Add fed by ``x``.

    Walks back through epilogue ops (BN, bias, activations, SiLU, a scale by a constant) and copy
    ops; every tensor on the
    way must be read only by the next op (SiLU's input also by its sigmoid), or TensorRT cannot fuse.
    """
    if len(x.users) != 1:
        return None
    cur = x
    while True:
        kind = ctx.kinds[cur]
        if kind in WEIGHTED_KINDS:
            return cur if cur in ctx.quantized_weighted else None
        silu_x = silu_operand(ctx, cur)
        ins = tensor_inputs(cur)
        if silu_x is not None:
            nxt, readers = silu_x, 2
        elif kind in EPILOGUE_KINDS | COPY_KINDS | _CONSTANT_OPERAND_KINDS and len(ins) == 1:
            nxt, readers = ins[0][1], 1
        else:
            return None
        if len(nxt.users) != readers:
            return None
        cur = nxt


def fused_layer(ctx: PlanContext, point: QuantPoint) -> fx.Node | None:
    """The weighted op whose epilogue absorbs the Add of a quantized residual skip ``point``
    (P03): the backbone of the Add's other operand; ``None`` for any other point."""
    if point.rule != "P03" or not point.quantized or point.kind != "input":
        return None
    add = ctx.by_name[point.consumer]
    others = [n for pos, n in tensor_inputs(add) if pos != point.arg]
    return _backbone(ctx, others[0]) if len(others) == 1 else None


def silu_operand(ctx: PlanContext, node: fx.Node) -> fx.Node | None:
    """For ``x * sigmoid(x)`` return ``x``."""
    if ctx.kinds[node] != "mul":
        return None
    ins = [a for _, a in tensor_inputs(node)]
    if len(ins) != 2:
        return None
    for a, b in (ins, ins[::-1]):
        if ctx.kinds[b] == "sigmoid" and tensor_inputs(b) and tensor_inputs(b)[0][1] is a:
            return a
    return None


def weighted_writer(
    ctx: PlanContext, node: fx.Node, fused: dict[str, fx.Node] | None = None
) -> fx.Node | None:
    """The weighted op whose output ``node`` is: through its epilogue (BN, activations, SiLU),
    pass-through ops and a residual Add fused into it (``fused``: Add name -> the weighted op it
    fuses into); ``None`` if none."""
    cur = node
    for _ in range(len(ctx.order)):
        kind = ctx.kinds.get(cur)
        if kind in WEIGHTED_KINDS:
            return cur
        ins = tensor_inputs(cur)
        if fused and cur.name in fused:
            cur = fused[cur.name]
        elif (x := silu_operand(ctx, cur)) is not None:
            cur = x
        elif kind in EPILOGUE_KINDS | PASS_THROUGH_KINDS and len(ins) == 1:
            cur = ins[0][1]
        else:
            return None
    return None


def _distance_from(ancestor: fx.Node, target: fx.Node) -> int:
    """Shortest number of edges from ``ancestor`` down to ``target``."""
    seen = {ancestor}
    queue = deque([(ancestor, 0)])
    while queue:
        n, d = queue.popleft()
        if n is target:
            return d
        for u in n.users:
            if u not in seen:
                seen.add(u)
                queue.append((u, d + 1))
    return 1 << 30


def _ancestors(node: fx.Node) -> set[fx.Node]:
    out: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for a in n.all_input_nodes:
            if a not in out:
                out.add(a)
                stack.append(a)
    return out


def _fused_operand(ctx: PlanContext, a: fx.Node, b: fx.Node) -> tuple[int | None, str]:
    """Which of the two Add operands TensorRT fuses into its conv (0 or 1), and why."""
    ba, bb = _backbone(ctx, a), _backbone(ctx, b)
    if ba is not None and bb is not None:
        common = (_ancestors(a) | {a}) & (_ancestors(b) | {b})
        if not common:
            return 0, f"two conv branches; fusing into {ctx.owners[ba]}"
        lca = max(common, key=lambda n: ctx.order[n])
        da, db = _distance_from(lca, a), _distance_from(lca, b)
        i, conv = (0, ba) if da >= db else (1, bb)
        return i, f"two conv branches; {ctx.owners[conv]} is on the longer path from {lca.name}"
    if ba is not None:
        other = b
        if ba in _ancestors(other) or ba is other:
            return None, f"both operands descend from {ctx.owners[ba]}: not a residual Add"
        return 0, f"conv branch {ctx.owners[ba]}"
    if bb is not None:
        if bb in _ancestors(a) or bb is a:
            return None, f"both operands descend from {ctx.owners[bb]}: not a residual Add"
        return 1, f"conv branch {ctx.owners[bb]}"
    return None, "no quantized conv/linear branch to fuse the Add into"


def _float_stream_reader(ctx: PlanContext, skip: fx.Node) -> fx.Node | None:
    """A normalization (LayerNorm, GroupNorm, an RMSNorm written as arithmetic) reading the Add's
    skip operand, through copy ops: the residual stream of a pre-norm transformer block
    (``x + f(norm(x))``), which TensorRT keeps float. (An Add whose *output* feeds a norm, as at a
    ConvNeXt stage end, keeps P03: its skip is quantized for a conv anyway, and a float Add would
    read it in float beside that conv.)"""
    return norm_reader(ctx, skip, COPY_KINDS)


def _keep_float(
    ctx: PlanContext, node: fx.Node, ins: list[tuple[int, fx.Node]], rule: str, reason: str
) -> None:
    """Leave both operands of the Add unquantized, with one rule and reason."""
    for pos, producer in ins:
        skip_input(ctx, node, pos, producer, rule, reason, label=f"input{pos}")


def plan_residual_add(ctx: PlanContext, node: fx.Node) -> None:
    ins = tensor_inputs(node)
    if len(ins) != 2:
        return
    owner = ctx.owners[node]
    excluded, calib_o, bits_o = ctx.config.resolve(owner, ctx.owner_types[node], "add")
    if excluded or not ctx.config.family_enabled("residual"):
        reason = "excluded by the QuantConfig" if excluded else "rule family 'residual' disabled"
        _keep_float(ctx, node, ins, "USER" if excluded else "P03", reason)
        return
    fused, why = _fused_operand(ctx, ins[0][1], ins[1][1])
    if fused is None:
        _keep_float(ctx, node, ins, "P05", f"{why}; the Add stays in its inputs' precision")
        return
    stream = _float_stream_reader(ctx, ins[1 - fused][1])
    if stream is not None:
        gemm = _backbone(ctx, ins[fused][1]) or node
        reason = (
            f"residual stream read in float by {ctx.owners[stream]} ({ctx.kinds[stream]}): the "
            f"Add stays in {ctx.owners[gemm]}'s float epilogue"
        )
        _keep_float(ctx, node, ins, "P15", reason)
        return
    for i, (pos, producer) in enumerate(ins):
        if i == fused:
            skip_input(
                ctx,
                node,
                pos,
                producer,
                "P03",
                f"{why}: TensorRT fuses conv+Add here, no Q/DQ",
                label=f"input{pos}",
            )
        else:
            quantize_input(
                ctx,
                node,
                pos,
                producer,
                "P03",
                "residual skip input: makes the fused conv+Add output INT8",
                calib_o,
                bits_o,
            )


def _copies_of(ctx: PlanContext, node: fx.Node) -> set[str]:
    """Names of the nodes holding the same tensor as ``node``: its source through copy ops
    (timm's ``shortcut = nn.Identity()``) and every copy of that source."""
    root = alias_root(ctx, node, COPY_KINDS)
    names, stack = {root.name}, [root]
    while stack:
        for u in stack.pop().users:
            if ctx.kinds[u] in COPY_KINDS and u.name not in names:
                names.add(u.name)
                stack.append(u)
    return names


def release_float_output_skips(ctx: PlanContext, fp8_adds: frozenset[str] = frozenset()) -> int:
    """P03, second pass (after every other step): a residual skip quantized only for its Add
    stays float when the fused conv+Add's output (through its epilogue) feeds no quantized op,
    or, for the Adds of ``fp8_adds`` (fused into an FP8 layer), when any reader of it runs float
    (no FP8 Concat, pooling or PointWise layer reads it quantized: the layer writes float).
    Returns how many skips it released.

    TensorRT's conv+Add fusion reads its residual in its output precision: with a float output an
    INT8 skip costs a standalone DequantizeLinear (lint P03d), a float skip costs nothing. A skip
    that other quantized ops read (a ResNet block input, shared with ``conv1``) keeps its Q/DQ:
    leaving it float would only move the reformat to its producer.
    """
    released = 0
    for name, point in list(ctx.points.items()):
        if point.rule != "P03" or not point.quantized or point.kind != "input":
            continue
        add = ctx.by_name[point.consumer]
        if ctx.kinds[add] != "add":
            continue
        if add.name in fp8_adds:
            if not _float_reader(ctx, add):
                continue
            why = (
                "residual skip read only by this Add, fused into an FP8 layer whose output a "
                "float layer reads (TensorRT has no FP8 Concat, pooling or PointWise layer): the "
                "layer writes float and reads the skip in float, so it stays float (an FP8 skip "
                "would cost a standalone DequantizeLinear, lint P03d)"
            )
        elif reaches_quantized(ctx, add, _THROUGH_EPILOGUE, scales=True):
            continue
        else:
            why = (
                "residual skip read only by this Add, whose fused conv+Add output stays float (it "
                "feeds no quantized op): TensorRT reads the skip in that precision, so it stays "
                "float (an INT8 skip would cost a standalone DequantizeLinear, lint P03d)"
            )
        aliases = _copies_of(ctx, ctx.by_name[point.producer])
        if any(
            p.quantized and p.producer in aliases and p.name != name for p in ctx.points.values()
        ):
            continue
        release(ctx, point, "P03", why)
        released += 1
    return released


def _float_reader(ctx: PlanContext, node: fx.Node) -> bool:
    """Whether some reader of ``node``'s output (through its epilogue and pass-through ops)
    reads it unquantized (the graph output included)."""
    reads = final_reads(ctx, node, _THROUGH_EPILOGUE, scales=True)
    return any(not quantized for _, quantized in reads)
