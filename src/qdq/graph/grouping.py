"""Scale groups (S01, S02, S03) by union-find, and Conv/Linear coverage of the original model."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import replace

import torch.fx as fx
from torch import nn

from qdq.graph.capture import COVERED_BY_NAME, TRACE_THROUGH
from qdq.graph.context import PlanContext
from qdq.graph.patterns import DATA_MOVEMENT_KINDS, tensor_inputs
from qdq.graph.plan import SHARE, Coverage, QuantPoint, ScaleGroup
from qdq.graph.weighted import FOLDED_REASON
from qdq.rules import UnionFind

__all__ = ["UNUSED_REASON", "coverage", "group_points"]


def group_points(
    ctx: PlanContext, nodes: list[fx.Node]
) -> tuple[list[QuantPoint], list[ScaleGroup]]:
    """Union-find: one scale per tensor (S01), across pass-through ops and rolls (S03), per
    Concat (S02)."""
    tensors = UnionFind(nodes)
    crossing: dict[fx.Node, str] = {}
    if ctx.config.family_enabled("pooling"):
        for n in nodes:
            ins = tensor_inputs(n)
            if ctx.kinds[n] in DATA_MOVEMENT_KINDS and len(ins) == 1:
                tensors.union(ins[0][1], n)
                crossing[n] = "S03"
    by_name = ctx.by_name
    quantized = [p for p in ctx.points.values() if p.quantized and p.kind == "input"]
    points = UnionFind(p.name for p in quantized)
    first_on_component: dict[fx.Node, str] = {}
    for p in quantized:
        comp = tensors.find(by_name[p.producer])
        assert isinstance(comp, fx.Node)
        if comp in first_on_component:
            leader = first_on_component[comp]
            points.union(leader, p.name)
        else:
            first_on_component[comp] = p.name
    cat_members: dict[str, list[str]] = {}
    for p in quantized:
        if p.op == "cat":  # S02, or a fan-out Concat (P04): one scale either way
            cat_members.setdefault(p.consumer, []).append(p.name)
    for cat_name, members in cat_members.items():
        cat = by_name[cat_name]
        downstream = [
            p.name for p in quantized if tensors.find(by_name[p.producer]) is tensors.find(cat)
        ]
        for m in members[1:] + downstream:
            points.union(members[0], m)
    result = {p.name: p for p in ctx.points.values()}
    groups: list[ScaleGroup] = []
    for gid, group_members in enumerate(points.groups()):
        names = [str(m) for m in group_members]
        leader = names[0]
        lead_tensor = by_name[ctx.points[leader].producer]
        share = {m: _share_rule(ctx, tensors, by_name, lead_tensor, m) for m in names[1:]}
        rules = sorted(set(share.values()))
        comps = {tensors.find(by_name[ctx.points[m].producer]) for m in names}
        crosses = sorted(ctx.owners[n] for n in crossing if tensors.find(n) in comps)
        groups.append(ScaleGroup(gid, leader, tuple(names), tuple(rules), tuple(crosses)))
        lead = result[leader]
        for m in names:
            p = result[m]
            if m == leader:
                result[m] = replace(p, group=gid)
            else:
                result[m] = replace(
                    p,
                    group=gid,
                    decision=SHARE,
                    share_rule=share[m],
                    spec=lead.spec,
                    calib=lead.calib,
                    reason=f"{p.reason} (scale shared with {leader})",
                )
    # weights: one group (one quantizer) per parameter, however often it is used
    weight_groups: dict[str, list[str]] = {}
    for p in result.values():
        if p.kind == "weight" and p.quantized:
            weight_groups.setdefault(p.producer, []).append(p.name)
    for members in weight_groups.values():
        gid = len(groups)
        groups.append(ScaleGroup(gid, members[0], tuple(members), ("S01",) if members[1:] else ()))
        lead = result[members[0]]
        for m in members:
            p = result[m]
            if m == members[0]:
                result[m] = replace(p, group=gid)
            else:
                result[m] = replace(
                    p,
                    group=gid,
                    decision=SHARE,
                    share_rule="S01",
                    spec=lead.spec,
                    calib=lead.calib,
                    reason=f"{p.reason} (the same parameter as {members[0]})",
                )
    return list(result.values()), groups


def _share_rule(
    ctx: PlanContext,
    tensors: UnionFind,
    by_name: dict[str, fx.Node],
    lead_tensor: fx.Node,
    member: str,
) -> str:
    """Why ``member`` shares the leader's scale: same tensor (S01), the same tensor across
    pass-through ops (S03), or a Concat group (S02)."""
    tensor = by_name[ctx.points[member].producer]
    if tensor is lead_tensor:
        return "S01"
    if tensors.find(tensor) is tensors.find(lead_tensor):
        return "S03"
    return "S02"


# --------------------------------------------------------------- coverage
#: why a Conv/Linear module is not reached when forward calls it but its results reach no output
UNUSED_REASON = (
    "its result reaches no output of the model (forward computes it and drops it): the "
    "exporters leave it out, so it is not quantized"
)


def coverage(
    model: nn.Module, points: Iterable[QuantPoint], unused: Collection[str] = ()
) -> tuple[Coverage, ...]:
    """One entry per Conv/Linear module; a module called several times is int8 only if every
    call that runs is (the entry then cites the first float call). A call on constants alone
    (DeBERTa's projections of its relative-position table) is folded by the builder and no
    runtime layer: it counts only when it is the module's every call. ``unused``: modules that
    forward calls but whose calls left the graph (their results reach no output)."""
    weights: dict[str, QuantPoint] = {}
    for p in points:
        if p.kind != "weight":
            continue
        name = re.sub(r"\.call\d+$", "", p.owner)
        if name not in weights or _rank(p) > _rank(weights[name]):
            weights[name] = p
    leaves = [
        (name, m)
        for name, m in model.named_modules()
        if name and not isinstance(m, TRACE_THROUGH) and _is_opaque_leaf(m)
    ]
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, TRACE_THROUGH) and type(m).__name__ not in COVERED_BY_NAME:
            continue
        wp = weights.get(name)
        if wp is not None:
            status = "int8" if wp.quantized else "float"
            out.append(Coverage(name, type(m).__name__, status, wp.rule, wp.reason))
            continue
        parent = next((ln for ln, lm in leaves if name.startswith(ln + ".")), None)
        if parent is not None:
            reason = f"inside {parent} ({type(dict(leaves)[parent]).__name__}), run as one fused op"
        elif name in unused:
            reason = UNUSED_REASON
        else:
            reason = "not called by forward() on the example inputs"
        out.append(Coverage(name, type(m).__name__, "not reached", "-", reason))
    return tuple(out)


def _rank(p: QuantPoint) -> int:
    """Which call a module's coverage cites: a float one, else an INT8 one, else a folded one."""
    if p.quantized:
        return 1
    return 0 if p.reason == FOLDED_REASON else 2


def _is_opaque_leaf(m: nn.Module) -> bool:
    """A torch.nn leaf module (not traced into) that holds Conv/Linear children."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    if not m.__module__.startswith("torch.nn") or isinstance(m, containers):
        return False
    return any(isinstance(c, TRACE_THROUGH) for c in m.modules())
