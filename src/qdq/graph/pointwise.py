"""Rule P17: Adds between INT8 layers that no conv can absorb run as INT8 PointWise layers.

An Add whose operands are also read by other layers cannot join a conv epilogue (P03), and
step 2 leaves it float (P05). When one of its operands is already INT8 for another reader and its
output feeds a quantized op, TensorRT runs it — together with a gating Mul feeding it — as one
PointWise layer, INT8 in and out when every external input arrives through a Dequantize:

* PP-OCR's RSE layer ``x + x * se(x)``: ``x`` (quantized for the squeeze-excitation pool, P06)
  is quantized once for the pool, the Mul and the Add; the gate is quantized; the Mul→Add edge
  stays inside the fused layer (no Q/DQ);
* an FPN top-down Add ``lateral + upsample(top)`` whose ``top`` is quantized for its output conv:
  both operands quantized;
* HRNet's multi-resolution fusion ``relu((x0 + up(bn(conv(x1)))) + up(bn(conv(x2))))``: the
  chain of Adds (each read only by the next) and the ReLU are one PointWise layer, its output
  read by the next convs through the ReLU; every input of the chain quantized, no Q/DQ between
  its Adds. A conv+Add fused with an INT8 skip (P03: ``bn(conv_s2(x0)) + x1``) counts as an INT8
  operand: it writes INT8 at no cost, where a float reader would leave its output float (P03d);
* EfficientFormer's / PoolFormer's pooling mixer ``x + drop_path(gamma * (avg_pool(x) - x))``:
  the Sub, the LayerScale and the stochastic depth join the Add's PointWise layer; ``x`` and the
  pool's output are its inputs (the pool then runs INT8, P06, planned again by the planner);
* FocalNet's modulator ``sum_l ctx_l * gate_l + gelu(mean(ctx_L)) * gate_L``, read by the 1x1
  conv ``h``: each focal level ``ctx_l`` is also read by the next level's INT8 depthwise conv
  (or the global pool), so the products and their sum are one PointWise layer reading every
  level and gate in INT8; left float, each level was written twice (P04).

Run after the gating-Mul step (:func:`qdq.graph.planner.build_plan`), repeated until nothing
changes (one Add's INT8 output makes the Add reading it eligible).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from qdq.graph.context import (
    PlanContext,
    alias_root,
    input_label,
    input_point,
    input_points,
    is_scale,
    quantize_input,
    quantized_for_others,
    reaches_quantized,
    skip_input,
)
from qdq.graph.patterns import PASS_THROUGH_KINDS, THROUGH_ACT_KINDS, tensor_inputs

__all__ = ["plan_pointwise_adds"]

_INSIDE = "fused with this Add into one PointWise layer: no Q/DQ inside"


def plan_pointwise_adds(ctx: PlanContext, nodes: list[fx.Node]) -> None:
    """Quantize every input of the float (P05) Adds between INT8 layers (rule P17)."""
    if not ctx.config.family_enabled("residual"):
        return
    adds = [n for n in nodes if ctx.kinds[n] == "add" and len(tensor_inputs(n)) == 2]
    changed = True
    while changed:
        changed = False
        for add in adds:
            if _eligible(ctx, add):
                _quantize_add(ctx, add)
                changed = True


def _eligible(ctx: PlanContext, add: fx.Node) -> bool:
    if any(p is None or p.quantized or p.rule != "P05" for p in input_points(ctx, add)):
        return False
    excluded, _, _ = ctx.config.resolve(ctx.owners[add], ctx.owner_types[add], "add")
    inputs = _external_inputs(ctx, add)
    # TensorRT's PointWise layer takes the activation after the Add too (HRNet's fusion
    # ``relu(x_i + upsample(bn(conv(x_j))))``), and its output is what the next conv quantizes
    if excluded or inputs is None or not reaches_quantized(ctx, add, THROUGH_ACT_KINDS):
        return False
    readers = {add.name} | {c.name for c, _, _ in inputs}
    int8 = {p.producer for p in ctx.points.values() if p.quantized and p.consumer not in readers}
    # a conv+Add fused with an INT8 skip (P03) read only by this PointWise layer writes INT8 at
    # no cost: HRNet's fusion ``(bn(conv_s2(x0)) + x1) + up(x2)``, whose inner Add would else
    # output float (P03d). Not when a float op reads it too (PoolFormerV2's GroupNorm): that
    # reader would then cost a Dequantize (P04)
    int8 |= {p.consumer for p in ctx.points.values()
             if p.quantized and p.rule == "P03" and ctx.kinds[ctx.by_name[p.consumer]] == "add"
             and not _float_readers(ctx, ctx.by_name[p.consumer], readers)}  # fmt: skip
    return any(name in int8 for _, _, producer in inputs for name in _sources(ctx, producer))


def _float_readers(ctx: PlanContext, node: fx.Node, readers: set[str]) -> list[fx.Node]:
    """The readers of ``node`` other than ``readers`` that would read it in float: not reading
    it through a quantized point, and not an average pool (it runs INT8 once its output is
    quantized, P06); through pass-through ops, their readers."""
    quantized = {p.consumer for p in ctx.points.values() if p.quantized and p.producer == node.name}
    out = []
    for u in node.users:
        if u.name in readers or u.name in quantized or ctx.kinds[u] == "avg_pool":
            continue
        if ctx.kinds[u] in PASS_THROUGH_KINDS:  # what reads the copy reads the tensor
            out += _float_readers(ctx, u, readers)
        else:
            out.append(u)
    return out


def _gating_mul(ctx: PlanContext, add: fx.Node, operand: fx.Node) -> bool:
    """``operand`` is a Mul read only by ``add`` that multiplies the Add's other operand."""
    if ctx.kinds[operand] != "mul" or len(operand.users) != 1:
        return False
    others = [p for _, p in tensor_inputs(add) if p is not operand]
    mul_ins = [p for _, p in tensor_inputs(operand)]
    return len(mul_ins) == 2 and len(others) == 1 and others[0] in mul_ins


def _chained(ctx: PlanContext, add: fx.Node, operand: fx.Node) -> str | None:
    """What ``operand`` is when it joins ``add``'s PointWise layer (``None``: it does not): it is
    read only by ``add`` and is

    * ``"Add"``: a float (P05) two-input Add: HRNet sums three branches as
      ``(x0 + up(x1)) + up(x2)``, and TensorRT fuses the chain (with the ReLU after it) into one
      PointWise layer, so its inputs are the chain's inputs;
    * ``"Sub"``: a difference of two activations, ``"scale"``: a Mul by a constant, or
      ``"identity"`` (stochastic depth, dropout): the pooling mixer of EfficientFormer and
      PoolFormer, ``x + drop_path(gamma * (avg_pool(x) - x))``;
    * ``"gating Mul"``: a squeeze-excitation ``x * gate`` whose ``x`` is already INT8 for another
      reader (the SE pool), TResNet's and SE-ResNet's ``drop_path(se(x)) + shortcut``: the Mul
      joins the layer and reads ``x`` in INT8, so ``x`` is not read in float (P04);
    * ``"product"``: any other product of two activations whose every other reader reads them
      INT8 already (or is an average pool, which runs INT8 once its input is: P06), FocalNet's
      gated sum ``ctx_0 * g_0 + ctx_1 * g_1 + gelu(mean(ctx_1)) * g_2``: its terms join one
      PointWise layer, so the focal levels are read in INT8 only;
    * ``"offset"``: a constant added (``0 + x``: the sum's first term).
    """
    if len(operand.users) != 1:
        return None
    ins = tensor_inputs(operand)
    kind = ctx.kinds[operand]
    if is_scale(ctx, operand):
        return "scale"
    if kind == "mul" and len(ins) == 2:
        if ctx.config.resolve(ctx.owners[operand], ctx.owner_types[operand], "mul")[0]:
            return None  # excluded by the config
        int8 = quantized_for_others(ctx, operand)
        if any(alias_root(ctx, producer).name in int8 for _, producer in ins):
            return "gating Mul"
        if all(not _float_readers(ctx, producer, {operand.name}) for _, producer in ins):
            return "product"
        return None
    if kind == "bias" and len(ins) == 1:
        return "offset"  # a constant added: FocalNet's ``ctx_all = 0`` before its first term
    if kind == "identity" and len(ins) == 1:
        return "identity"  # stochastic depth / dropout in eval
    if _is_sub(operand) and len(ins) == 2:
        return "Sub"
    if kind != "add" or len(ins) != 2:
        return None
    if any(_gating_mul(ctx, operand, q) for _, q in ins):
        return None  # a gated Add (PP-OCR's RSE) is a PointWise layer of its own
    points = input_points(ctx, operand)
    return (
        "Add"
        if all(p is not None and not p.quantized and p.rule == "P05" for p in points)
        else None
    )


def _is_sub(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in ("sub", "sub_")
    return node.op == "call_function" and node.target in (operator.sub, operator.isub, torch.sub)


def _external_inputs(ctx: PlanContext, add: fx.Node) -> list[tuple[fx.Node, int, fx.Node]] | None:
    """``(reader, position, producer)`` of every input of the PointWise layer the Add heads: its
    operands, with a gating Mul's operands in place of the Mul (``None`` when that Mul is
    excluded by the config: the Add then stays float)."""
    out = []
    for pos, producer in tensor_inputs(add):
        if _chained(ctx, add, producer):  # its operands are inputs of the same layer
            inner = _external_inputs(ctx, producer)
            if inner is None:
                return None
            out.extend(inner)
            continue
        if not _gating_mul(ctx, add, producer):
            out.append((add, pos, producer))
            continue
        if ctx.config.resolve(ctx.owners[producer], ctx.owner_types[producer], "mul")[0]:
            return None
        out.extend((producer, mpos, mprod) for mpos, mprod in tensor_inputs(producer))
    return out


def _sources(ctx: PlanContext, node: fx.Node) -> list[str]:
    """``node`` and what it copies through pass-through ops (an upsampled FPN level) and
    average pools (NASNet's ``avg_pool(x) + avg_pool(x)``: a pool of an INT8 tensor runs INT8
    once its output is quantized, P06)."""
    names = [node.name]
    while ctx.kinds[node] in PASS_THROUGH_KINDS | {"avg_pool"} and len(tensor_inputs(node)) == 1:
        node = tensor_inputs(node)[0][1]
        names.append(node.name)
    return names


def _inner_edges(ctx: PlanContext, add: fx.Node) -> list[tuple[fx.Node, int, fx.Node, str]]:
    """``(reader, position, producer, what)`` of the edges inside the PointWise layer ``add``
    heads: from a chained Add or a gating Mul, down the chain."""
    out = []
    for pos, producer in tensor_inputs(add):
        what = _chained(ctx, add, producer)
        if what is not None:
            out += [(add, pos, producer, what), *_inner_edges(ctx, producer)]
        elif _gating_mul(ctx, add, producer):
            out.append((add, pos, producer, "gating Mul"))
    return out


def _quantize_add(ctx: PlanContext, add: fx.Node) -> None:
    inputs = _external_inputs(ctx, add) or []
    inside = _inner_edges(ctx, add)  # before the inputs are quantized: that ends the chains
    for reader, pos, producer in inputs:
        point = input_point(ctx, reader, pos)
        if point is not None and point.quantized:
            continue  # a gating Mul operand already quantized (P04)
        _, calib_o, bits_o = ctx.config.resolve(
            ctx.owners[reader], ctx.owner_types[reader], ctx.kinds[reader]
        )
        quantize_input(
            ctx,
            reader,
            pos,
            producer,
            "P17",
            "Add between INT8 layers that no conv can absorb: every input of its PointWise "
            "layer quantized, so it runs INT8 in and out",
            calib_o,
            bits_o,
        )
    for reader, pos, producer, what in inside:
        skip_input(
            ctx, reader, pos, producer, "P17", f"{what} {_INSIDE}", label=input_label(reader, pos)
        )
