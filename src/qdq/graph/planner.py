"""The planner: captured graph + ``QuantConfig`` + TensorRT rules → ``QuantPlan`` (a pure function).

Steps, each citing its rule id (``qdq.rules``):

1. weighted ops (P01, V12, P08, H02, P14, P15): quantize activation input + weight, or skip with a
   reason (:mod:`qdq.graph.weighted`; P15: the input is a float stream a normalization reads,
   :mod:`qdq.graph.streams`);
2. residual Adds (P03, P05): quantize only the skip operand (:mod:`qdq.graph.residual`);
3. average pools (P06) and Concats (S02): quantize the input(s) when the output feeds a quantized
   op (:mod:`qdq.graph.pools`);
4. gating Muls (P04): both operands when one is already quantized for another reader (SE blocks);
   standalone BatchNorms (P04): the input when it is quantized for another reader, and the other
   operand of the float Add they feed (RepVGG's identity branch); float Adds between INT8 layers
   (P17): every input of their PointWise layer, through a gating Mul (PP-OCR's ``x + x * se(x)``)
   (:mod:`qdq.graph.pointwise`); ReLUs and RoIAligns (P04) reading a tensor quantized for another
   reader (FPN levels); then step 3 again for the pools and Concats a step-4 point gave their first
   quantized reader, and the P17/P04 part of step 4 after it, until nothing changes;
5. residual skips quantized only for an Add whose fused output stays float go back to float
   (P03, :func:`qdq.graph.residual.release_float_output_skips`);
6. scale groups by union-find: one quantizer per tensor (S01), across pass-through ops (S03) and
   across each Concat (S02) (:mod:`qdq.graph.grouping`);
7. explanation-only points for SiLU epilogues (P07); Conv/Linear coverage of the original model.
"""

from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import replace

import torch.fx as fx
from torch import nn

from qdq.config import QuantConfig
from qdq.graph.context import (
    PlanContext,
    alias_root,
    input_label,
    input_point,
    input_points,
    is_scale,
    owner_names,
    owner_type,
    quantize_input,
    quantized_for_others,
    reaches_quantized,
    release,
    skip_input,
    users_through,
)
from qdq.graph.formats import float_movement, fp8_fused_adds
from qdq.graph.formats_blocks import assign_block_formats, block_releases, plan_int4w
from qdq.graph.grouping import coverage, group_points
from qdq.graph.patterns import (
    COPY_KINDS,
    EPILOGUE_KINDS,
    PASS_THROUGH_KINDS,
    THROUGH_ACT_KINDS,
    WEIGHTED_KINDS,
    op_kind,
    tensor_inputs,
)
from qdq.graph.plan import QuantPlan
from qdq.graph.pointwise import plan_pointwise_adds
from qdq.graph.pools import (
    left_float,
    plan_concat,
    plan_pools_and_concats,
    release_float_written_concats,
)
from qdq.graph.residual import plan_residual_add, release_float_output_skips, silu_operand
from qdq.graph.weighted import plan_weighted

__all__ = ["build_plan"]


def build_plan(
    graph: fx.Graph,
    root: nn.Module,
    config: QuantConfig | None = None,
    model: nn.Module | None = None,
    unused: Collection[str] = (),
) -> QuantPlan:
    """Plan Q/DQ placement for a recorded graph (:func:`qdq.graph.record.record`).

    Args:
        graph: the recorded graph.
        root: the module copy the graph's ``get_attr``/``call_module`` targets refer to.
        config: what to quantize (default ``QuantConfig.tensorrt()``).
        model: the original model, for the Conv/Linear coverage list (default: ``root``).
        unused: module paths whose calls the recording dropped
            (:attr:`~qdq.graph.record.Recording.unused`), for the coverage list.
    """
    cfg = config if config is not None else QuantConfig.tensorrt()
    modules = dict(root.named_modules())
    nodes = list(graph.nodes)
    kinds = {n: op_kind(n, modules) for n in nodes}
    ctx = PlanContext(
        root=root,
        config=cfg,
        modules=modules,
        kinds=kinds,
        owners=owner_names(nodes, kinds, modules),
        owner_types={n: owner_type(n, modules) for n in nodes},
        order={n: i for i, n in enumerate(nodes)},
        by_name={n.name: n for n in nodes},
        points={},
        quantized_weighted=set(),
    )
    for n in nodes:
        if kinds[n] in WEIGHTED_KINDS:
            plan_weighted(ctx, n)
    for n in nodes:
        if kinds[n] == "add":
            plan_residual_add(ctx, n)
    plan_pools_and_concats(ctx, nodes)
    for n in nodes:
        if kinds[n] == "mul":
            _plan_gating_mul(ctx, n)
        elif kinds[n] == "bn":
            _plan_fanout_bn(ctx, n)
    _settle(ctx, nodes)
    if _small_convs_between_int8(ctx, nodes):
        _settle(ctx, nodes)
    release_float_written_concats(ctx, nodes)
    release_float_output_skips(ctx)
    _release_float_output_bns(ctx)
    for n in nodes:
        _explain_silu(ctx, n)
    if cfg.format == "int4w":  # INT4 weight-only GEMMs, the rest float (F16, F17)
        plan_int4w(ctx)
    points, groups = group_points(ctx, nodes)
    if cfg.format not in ("int8", "int4w"):  # F01-F10; F11-F16 in block plans
        points = assign_block_formats(ctx, points, groups)
        floated: set[str] = set()
        for _ in range(len(nodes)):  # each pass releases points, so it ends
            released = float_movement(ctx, points, floated)
            for p, why in released:
                release(ctx, ctx.points[p.name], "F10", why)
            moved = block_releases(points)  # read in float beside a block format (F15, F16)
            for p, rule, why in moved:
                release(ctx, ctx.points[p.name], rule, why)
            # step 5 again: a fused Add may now write float (an FP8 one unless every reader
            # quantizes its output)
            skips = release_float_output_skips(ctx, fp8_fused_adds(ctx, points))
            if not released and not moved and not skips:
                break
            _release_float_output_bns(ctx)
            points, groups = group_points(ctx, nodes)
            points = assign_block_formats(ctx, points, groups)
    ordered = sorted(points, key=lambda p: (ctx.order[ctx.by_name[p.consumer]], p.kind != "weight"))
    covered = coverage(model if model is not None else root, ordered, unused)
    name = type(model if model is not None else root).__name__
    return QuantPlan(
        model=name,
        points=tuple(ordered),
        groups=tuple(groups),
        coverage=covered,
        capture="recorded",
    )


# ----------------------------------------------------- pools and concats
#: the reason of a Concat / average pool left float because nothing quantized read its output
def _settle(ctx: PlanContext, nodes: list[fx.Node]) -> None:
    """Step 4's P17/P04 part, then step 3 again for the pools and Concats it gave their first
    quantized reader, until nothing changes."""
    _plan_pointwise(ctx, nodes)
    while plan_pools_and_concats(ctx, nodes, again=True):
        _plan_pointwise(ctx, nodes)


def _small_convs_between_int8(ctx: PlanContext, nodes: list[fx.Node]) -> bool:
    """H02 yields: a small conv (fewer than 16 channels, left float by step 1) whose input is
    INT8 already for another reader runs INT8 too (GhostNet's and RepGhostNet's cheap depthwise
    convs, FasterNet's and InceptionNeXt's partial convs on a slice of a Split), and so does one
    whose input is written INT8 at no cost beside such a reader: a gating Mul of an INT8 tensor
    (GhostNet's squeeze-excitation before a 60 -> 10 conv), a conv+Add fused with an INT8 skip
    (RepGhostNet's ``relu(cheap(x1) + bn(x1))`` before a small conv). Left float, its input was
    written twice (P04) and a residual Add feeding it wrote float (P03d) for a conv whose FLOPs
    are negligible; TensorRT runs it with a padded INT8 kernel (the C=3 first conv's int8x4
    kernel is the documented case; the speed of other small INT8 convs is not measured here).
    Returns whether any was re-planned."""
    changed = False
    for n in nodes:
        if ctx.kinds[n] != "conv" or not tensor_inputs(n):
            continue
        pos, x = tensor_inputs(n)[0]
        point = input_point(ctx, n, pos)
        if point is None or point.quantized or point.rule != "H02":
            continue
        why, gate = _int8_input(ctx, n, x)
        if why is None:
            continue
        plan_weighted(ctx, n, performance=False)
        point = input_point(ctx, n, pos)
        assert point is not None  # plan_weighted planned it
        if not point.quantized:  # float for another rule (P15: a normalization reads its input)
            continue
        ctx.add(replace(point, reason=f"{point.reason}; small conv (H02) whose input is {why}"))
        if gate is not None:
            _plan_gating_mul(ctx, gate)
        changed = True
    return changed


def _int8_input(ctx: PlanContext, conv: fx.Node, x: fx.Node) -> tuple[str | None, fx.Node | None]:
    """Why the small conv ``conv`` should read its input ``x`` in INT8 (``None``: it should
    not), and the gating Mul that then runs INT8 with it."""
    int8 = quantized_for_others(ctx, conv)
    while alias_root(ctx, x).name not in int8 and ctx.kinds[x] in PASS_THROUGH_KINDS:
        if len(tensor_inputs(x)) != 1:  # a slice of a Split of an INT8 tensor reads INT8
            break
        x = tensor_inputs(x)[0][1]
    if alias_root(ctx, x).name in int8:
        return (
            "INT8 for its other readers already: it reads that INT8 version (no float copy)",
            None,
        )
    if _gates_int8(ctx, x):
        why = "a gating Mul of a tensor INT8 for its other readers: the Mul runs INT8 and writes"
        return f"{why} INT8 at no cost (no second float copy of its operand)", x
    while ctx.kinds[x] in THROUGH_ACT_KINDS and len(tensor_inputs(x)) == 1 and len(x.users) == 1:
        x = tensor_inputs(x)[0][1]  # read by the small conv alone, through an activation
    fused = any(
        p.consumer == x.name and p.quantized and p.rule == "P03" for p in ctx.points.values()
    )
    if ctx.kinds[x] == "add" and len(x.users) == 1 and fused:
        why = "a conv+Add fused with an INT8 skip (P03), which writes INT8 at no cost; read in"
        return f"{why} float, the skip would go back to float and be read in both precisions", None
    return None, None


def _gates_int8(ctx: PlanContext, node: fx.Node) -> bool:
    """``node`` is a two-operand Mul (a squeeze-excitation ``x * gate``) one operand of which is
    quantized for another reader (the SE pool), not excluded by the config (nor the P04 family)."""
    ins = tensor_inputs(node)
    if ctx.kinds[node] != "mul" or len(ins) != 2 or silu_operand(ctx, node) is not None:
        return False
    if not ctx.config.family_enabled("fanout"):
        return False
    if ctx.config.resolve(ctx.owners[node], ctx.owner_types[node], "mul")[0]:
        return False
    quantized = quantized_for_others(ctx, node)
    return any(alias_root(ctx, producer).name in quantized for _, producer in ins)


def _plan_pointwise(ctx: PlanContext, nodes: list[fx.Node]) -> None:
    """Step 4's second half: the float Adds between INT8 layers (P17), then the fan-out readers
    (P04)."""
    plan_pointwise_adds(ctx, nodes)
    for n in nodes:
        if ctx.kinds[n] in _FANOUT_READERS:
            _plan_fanout_reader(ctx, n)
        elif ctx.kinds[n] == "cat" and _fanout_concat(ctx, n):
            plan_concat(ctx, n, fanout=True)
            for _, producer in tensor_inputs(n):  # a gate that now reaches a quantized op
                gate = producer
                while is_scale(ctx, gate):
                    gate = tensor_inputs(gate)[0][1]
                if ctx.kinds[gate] == "mul":
                    _plan_gating_mul(ctx, gate)


def _fanout_concat(ctx: PlanContext, node: fx.Node) -> bool:
    """P04: a Concat left float for want of a quantized reader, whose inputs are quantized for
    other readers or written by an INT8 layer (the last Concat of a dense stage, read by a
    LayerNorm, over the features the stage's inner Concats quantize and the last block's
    output). Quantized, the Concat runs INT8 and one Dequantize serves its float reader; float,
    every input quantized elsewhere is written twice (INT8 and float). A float reader that is a
    pool (RDNet's head) then reads INT8 and writes float (lint P05): that Dequantize is the one
    reformat left. Not for a Concat a graph output reads (the output stays exact), nor one with
    no input quantized elsewhere."""
    if not left_float(ctx, node) or not ctx.config.family_enabled("fanout"):
        return False
    if reaches_quantized(ctx, node, PASS_THROUGH_KINDS | {"cat"}):
        return False  # a reader quantized since step 3 (maybe through a Concat): S02 plans it
    ins = tensor_inputs(node)
    quantized = quantized_for_others(ctx, node)
    shared = [p for _, p in ins if alias_root(ctx, p).name in quantized]
    if not shared or any(p not in shared and not _writes_int8(ctx, p) for _, p in ins):
        return False
    stack, seen = [node], {node}
    while stack:
        for u in stack.pop().users:
            if u.op == "output":
                return False
            if ctx.kinds[u] in PASS_THROUGH_KINDS and u not in seen:
                seen.add(u)
                stack.append(u)
    return True


def _writes_int8(ctx: PlanContext, node: fx.Node, depth: int = 4) -> bool:
    """Whether ``node`` (through its epilogue: BatchNorms, activations, sigmoids, Muls by a constant) is
    a layer that runs INT8 or can: a quantized conv/linear, an op every input of which is quantized, or
    an elementwise Mul/Add every operand of which is quantized for another reader or written by
    such a layer (RDNet's gate ``x * hardsigmoid(fc(mean(x)))``, whose pool quantizes ``x``)."""
    while ctx.kinds[node] in THROUGH_ACT_KINDS | EPILOGUE_KINDS or is_scale(ctx, node):
        ins = tensor_inputs(node)
        if len(ins) != 1:
            return False
        node = ins[0][1]
    if node in ctx.quantized_weighted:
        return True
    owner, ins = ctx.owners[node], tensor_inputs(node)
    points = [ctx.points.get(f"{owner}:{input_label(node, pos)}") for pos, _ in ins]
    if points and all(p is not None and p.quantized for p in points):
        return True
    if ctx.kinds[node] not in ("mul", "add") or len(ins) != 2 or depth == 0:
        return False
    quantized = quantized_for_others(ctx, node)
    return all(
        alias_root(ctx, p).name in quantized or _writes_int8(ctx, p, depth - 1) for _, p in ins
    )


def _plan_gating_mul(ctx: PlanContext, node: fx.Node) -> None:
    """P04: ``x * gate(x)`` where ``x`` is also quantized for another reader (the squeeze-excitation
    pool): quantize both operands so ``x`` is quantized for all its readers and the Mul runs INT8."""
    if not _gates_int8(ctx, node):
        return
    _, calib_o, bits_o = ctx.config.resolve(ctx.owners[node], ctx.owner_types[node], "mul")
    # ReXNet's ``relu6(x * sigmoid(se(x)))``: the activation joins the Mul's PointWise layer, as
    # do RDNet's layer scale ``(x * gate) * gamma``, NF-RegNet's ``silu(se(x) * gain)`` and
    # FastViT's last block ``gelu(x * se(x))`` before its pooled head
    if not reaches_quantized(
        ctx, node, THROUGH_ACT_KINDS | {"silu", "hardswish", "gelu"}, scales=True
    ):
        return
    for pos, producer in tensor_inputs(node):
        quantize_input(
            ctx,
            node,
            pos,
            producer,
            "P04",
            "gating Mul: its operand is quantized for another reader, so both operands are "
            "quantized (INT8 PointWise; the producer keeps its INT8 output)",
            calib_o,
            bits_o,
        )


def _split_concat(ctx: PlanContext, node: fx.Node) -> bool:
    """Whether ``node`` is a Concat one input of which is a slice of a Split (``getitem``) whose
    other slices are read through a quantized point."""
    if ctx.kinds[node] != "cat":
        return False
    read = {p.producer for p in ctx.points.values() if p.quantized}
    for _, piece in tensor_inputs(node):
        if piece.op != "call_function" or piece.target is not operator.getitem:
            continue
        split = piece.args[0]
        if isinstance(split, fx.Node) and any(
            u is not piece and u.name in read for u in split.users
        ):
            return True
    return False


def _plan_fanout_bn(ctx: PlanContext, node: fx.Node) -> None:
    """P04: a standalone BatchNorm reading a tensor that is quantized for its other readers
    (RepVGG's identity branch ``bn(x)`` beside ``conv(x)``) reads the same INT8 version, so the
    producer writes INT8 once. When the BatchNorm feeds an Add left float (P05), the Add's other
    operand is quantized too: BN + Add (+ activation) then run as one INT8 PointWise layer."""
    ins = tensor_inputs(node)
    if not ins:
        return
    pos, producer = ins[0]
    quantized = quantized_for_others(ctx, node)
    reason = (
        "BatchNorm beside quantized readers of its input: it reads the same INT8 version (the "
        "producer writes INT8 once; no standalone Quantize)"
    )
    if alias_root(ctx, producer).name not in quantized:
        if not _split_concat(ctx, producer) or not reaches_quantized(ctx, node, THROUGH_ACT_KINDS):
            return
        reason = (
            "BatchNorm after a Concat of slices of a Split whose other slices are read INT8 "
            "(InceptionNeXt's identity slice beside its depthwise convs): it reads INT8 and the "
            "Concat runs INT8 (S02), so every slice is INT8 and the Split's producer writes INT8 "
            "once (no float copy, and its fused residual Add writes INT8: no P03d)"
        )
    excluded, calib_o, bits_o = ctx.config.resolve(ctx.owners[node], ctx.owner_types[node], "bn")
    if excluded or not ctx.config.family_enabled("fanout"):
        return
    quantize_input(ctx, node, pos, producer, "P04", reason, calib_o, bits_o)
    out = node
    while len(out.users) == 1 and ctx.kinds[next(iter(out.users))] in ("identity", "copy"):
        out = next(iter(out.users))  # BatchNormAct2d's drop/act identities
    for add in out.users:
        add_ins = tensor_inputs(add)
        if ctx.kinds[add] != "add" or len(add_ins) != 2:
            continue
        points = input_points(ctx, add)
        if any(p is None or p.quantized or p.rule != "P05" for p in points):
            continue
        a_excluded, a_calib, a_bits = ctx.config.resolve(
            ctx.owners[add], ctx.owner_types[add], "add"
        )
        if a_excluded:
            continue
        for i, other in add_ins:
            if other is not out:
                quantize_input(
                    ctx,
                    add,
                    i,
                    other,
                    "P04",
                    f"Add of {ctx.owners[node]} (INT8 in) and this operand: quantized so the "
                    "BatchNorm and the Add run as one INT8 PointWise layer",
                    a_calib,
                    a_bits,
                )


def _release_float_output_bns(ctx: PlanContext) -> None:
    """P04, after step 5: a fan-out BatchNorm whose only readers are residual Adds that released
    it as a float skip (P03: the fused Add writes float for a small float conv, H02) reads its input
    in float again. INT8 in and float out would cost a standalone Dequantize (P05) in place of the
    producer's second, float output (P04): no gain, and the float read is exact."""
    for point in list(ctx.points.values()):
        if point.rule != "P04" or not point.quantized or point.kind != "input":
            continue
        bn = ctx.by_name[point.consumer]
        if ctx.kinds[bn] != "bn" or reaches_quantized(ctx, bn, THROUGH_ACT_KINDS | {"add"}):
            continue
        # only a BN every reader of which is an Add that released it as a float skip (P03);
        # RepVGG's identity BN joins its Add's INT8 PointWise, FastViT's feeds a Sub (P17)
        users = users_through(ctx, bn, COPY_KINDS)
        out = {bn.name} | {u.name for u in users}
        readers = [u for u in users if ctx.kinds[u] not in COPY_KINDS]
        skips = {
            p.consumer
            for p in ctx.points.values()
            if p.rule == "P03" and not p.quantized and p.kind == "input" and p.producer in out
        }
        if not readers or any(u.name not in skips for u in readers):
            continue
        release(
            ctx,
            point,
            "P04",
            "BatchNorm beside quantized readers of its input, but its output stays float (no "
            "quantized op reads it): it reads the float version (INT8 in, float out would cost a "
            "standalone Dequantize, P05)",
        )


#: float readers that take the INT8 version of a tensor quantized for its other readers (P04):
#: ReLU/clamp, SiLU and Hardswish (one PointWise layer) run INT8 when their output is quantized
#: too (a pre-activation block's ``act(x)`` beside its residual ``x``); RoIAlign has no INT8 kernel and reads
#: it through a Dequantize. (Max pools need no rule: TensorRT moves a Quantize across them, S03.)
_FANOUT_READERS = {
    "act": "runs INT8 between Q/DQ",
    "silu": "runs INT8 between Q/DQ",
    "hardswish": "runs INT8 between Q/DQ",
    "roi_align": "has no INT8 kernel and dequantizes it",
}


def _plan_fanout_reader(ctx: PlanContext, node: fx.Node) -> None:
    """P04: a ReLU or RoIAlign reading a tensor that is quantized for its other readers (an FPN
    level read by the shared RPN/RetinaNet head conv, by RetinaNet's ``relu(p6)`` and by the RoI
    pooler) reads the same INT8 version, so the producer writes INT8 once and no reader needs a
    standalone Quantize. A ReLU qualifies only when its own output feeds a quantized op, directly
    or through Muls by a constant (NF-ResNet's pre-activation ``act(x) * beta``): then it runs
    INT8 between Q/DQ, the scale in the same PointWise layer."""
    ins = tensor_inputs(node)
    if not ins:
        return
    pos, producer = ins[0]
    key = f"{ctx.owners[node]}:{input_label(node, pos)}"
    if key in ctx.points and ctx.points[key].quantized:
        return
    quantized = quantized_for_others(ctx, node)
    if alias_root(ctx, producer).name not in quantized:
        return
    kind = ctx.kinds[node]
    if kind != "roi_align" and not reaches_quantized(ctx, node, scales=True):
        return
    excluded, calib_o, bits_o = ctx.config.resolve(ctx.owners[node], ctx.owner_types[node], kind)
    if excluded or not ctx.config.family_enabled("fanout"):
        return
    quantize_input(
        ctx,
        node,
        pos,
        producer,
        "P04",
        f"{kind} beside quantized readers of its input: it reads the same INT8 version (the "
        f"producer writes INT8 once; no standalone Quantize) and {_FANOUT_READERS[kind]}",
        calib_o,
        bits_o,
    )


def _explain_silu(ctx: PlanContext, node: fx.Node) -> None:
    kind = ctx.kinds[node]
    x = silu_operand(ctx, node) if kind == "mul" else None
    if kind in ("silu", "hardswish") and tensor_inputs(node):
        x = tensor_inputs(node)[0][1]
    point = ctx.points.get(f"{ctx.owners[node]}:input")
    if x is None or (point is not None and point.quantized):  # a P04 fan-out reader: INT8
        return
    skip_input(
        ctx,
        node,
        0,
        x,
        "P07",
        "SiLU/Hardswish epilogue: fused into the producing conv, no Q/DQ inside",
        label="input",
    )
