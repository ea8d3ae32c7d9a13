"""Materialise a ``QuantPlan``: insert ``Quantizer`` modules into the captured ``GraphModule``.

One :class:`~qdq.quant.Quantizer` object per scale group. Activation groups are called once per
quantized tensor (every consumer of that tensor reads the same quantized value); all members of a
group call the *same* module, so calibration sees all their data (joint calibration). Weight
quantizers sit next to their weight (``layer1.0.conv1.weight_quantizer``) and are calibrated from the
weight right away; activation quantizers wait for :func:`qdq.calibrate`.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.fx as fx

from qdq.graph.capture import fetch_attr
from qdq.graph.plan import QuantPlan, QuantPoint, ScaleGroup
from qdq.quant import Quantizer, QuantMode

__all__ = ["materialize"]


def materialize(gm: fx.GraphModule, plan: QuantPlan) -> QuantPlan:
    """Insert the plan's quantizers into ``gm`` (in place); return the plan with quantizer paths."""
    nodes = {n.name: n for n in gm.graph.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    points = {p.name: p for p in plan.points}
    groups: list[ScaleGroup] = []
    for group in plan.groups:
        members = [points[m] for m in group.members]
        leader = points[group.leader]
        assert leader.spec is not None and leader.calib is not None
        path = _register(gm, leader, nodes, Quantizer(leader.spec, leader.calib, name=leader.name))
        groups.append(
            ScaleGroup(group.id, group.leader, group.members, group.rules, group.crosses, path)
        )
        if leader.kind == "weight":
            _insert_weight(gm, nodes[leader.producer], nodes[leader.consumer], leader.arg, path)
        else:
            _insert_activation(gm, members, nodes, order, path)
    gm.graph.lint()
    gm.recompile()
    return QuantPlan(plan.model, plan.points, tuple(groups), plan.coverage, plan.notes)


def _register(
    gm: fx.GraphModule, point: QuantPoint, nodes: dict[str, fx.Node], quantizer: Quantizer
) -> str:
    """Add ``quantizer`` under a readable path: next to the weight, or inside the op's module."""
    modules = dict(gm.named_modules())
    label = point.name.rpartition(":")[2]
    if point.kind == "weight":
        base = f"{nodes[point.producer].target}_quantizer"
    elif point.owner in modules:
        base = f"{point.owner}.{label}_quantizer"
    else:
        parent, _, leaf = point.owner.rpartition(".")
        base = f"{parent}.{leaf}_{label}_quantizer" if parent else f"{leaf}_{label}_quantizer"
    path, i = base, 1
    while _exists(gm, path):
        path, i = f"{base}_{i}", i + 1
    gm.add_submodule(path, quantizer)
    return path


def _exists(gm: fx.GraphModule, path: str) -> bool:
    try:
        gm.get_submodule(path)
    except AttributeError:
        return False
    return True


def _replace_arg(consumer: fx.Node, arg: int | str, old: fx.Node, new: fx.Node) -> None:
    if isinstance(arg, str):
        consumer.update_kwarg(arg, new)
        return
    if consumer.op == "call_function" and consumer.target in (
        torch.cat,
        torch.concat,
        torch.concatenate,
    ):
        seq = list(consumer.args[0])  # type: ignore[arg-type]
        assert seq[arg] is old
        seq[arg] = new
        consumer.update_arg(0, seq)
        return
    assert consumer.args[arg] is old, (consumer, arg, old)
    consumer.update_arg(arg, new)


def _insert_weight(
    gm: fx.GraphModule, w: fx.Node, consumer: fx.Node, arg: int | str, path: str
) -> None:
    with gm.graph.inserting_before(consumer):
        q = gm.graph.call_module(path, (w,))
    _replace_arg(consumer, arg, w, q)
    quantizer = gm.get_submodule(path)
    assert isinstance(quantizer, Quantizer)
    weight = fetch_attr(gm, str(w.target))
    with torch.no_grad():
        quantizer.mode = QuantMode.CALIBRATE
        quantizer(weight)
        quantizer.load_calib_amax("max")
        quantizer.calibrator.reset()
        quantizer.mode = QuantMode.QUANTIZE


def _insert_activation(
    gm: fx.GraphModule,
    members: list[QuantPoint],
    nodes: dict[str, fx.Node],
    order: dict[fx.Node, int],
    path: str,
) -> None:
    by_producer: dict[str, list[QuantPoint]] = defaultdict(list)
    for p in members:
        by_producer[p.producer].append(p)
    for producer_name, pts in by_producer.items():
        producer = nodes[producer_name]
        consumers = [nodes[p.consumer] for p in pts]
        first = min(consumers, key=lambda n: order[n])
        with gm.graph.inserting_before(first):
            q = gm.graph.call_module(path, (producer,))
        for p, c in zip(pts, consumers, strict=True):
            _replace_arg(c, p.arg, producer, q)
