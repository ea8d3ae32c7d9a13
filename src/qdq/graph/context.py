"""Planning state shared by the rule steps, point construction and op naming."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch.fx as fx
from torch import nn

from qdq.config import CalibSpec, QuantConfig
from qdq.graph.capture import TRACE_THROUGH, module_path
from qdq.graph.patterns import (
    DATA_MOVEMENT_KINDS,
    PASS_THROUGH_KINDS,
    WEIGHTED_KINDS,
    tensor_inputs,
)
from qdq.graph.plan import QUANTIZE, SKIP, QuantPoint

__all__ = [
    "PlanContext",
    "alias_root",
    "final_reads",
    "input_label",
    "input_point",
    "input_points",
    "is_scale",
    "make_point",
    "owner_names",
    "owner_type",
    "quantize_input",
    "quantized_for_others",
    "reaches_quantized",
    "release",
    "skip_input",
    "users_through",
]


@dataclass
class PlanContext:
    """Everything the rule steps read, and the points decided so far."""

    root: nn.Module
    config: QuantConfig
    modules: dict[str, nn.Module]
    kinds: dict[fx.Node, str]
    owners: dict[fx.Node, str]
    owner_types: dict[fx.Node, type | None]
    order: dict[fx.Node, int]
    by_name: dict[str, fx.Node]
    points: dict[str, QuantPoint]
    quantized_weighted: set[fx.Node]

    def add(self, point: QuantPoint) -> None:
        self.points[point.name] = point


def owner_names(
    nodes: list[fx.Node], kinds: dict[fx.Node, str], modules: dict[str, nn.Module]
) -> dict[fx.Node, str]:
    """``layer1.0.conv1`` for traced-through modules, ``layer1.0.add`` for functional ops.

    A module called several times (a weight-shared head) gets ``head``, ``head.call1``, ... so
    every call is planned on its own. A functional Conv/Linear call on the weight of a Conv/Linear
    module that is not itself called (``nn.MultiheadAttention`` applies ``out_proj.weight`` with
    ``F.linear``) is named after that module.
    """
    names: dict[fx.Node, str] = {}
    seen: dict[str, list[fx.Node]] = {}
    calls: dict[str, int] = {}
    for n in nodes:
        path = module_path(n)
        stack = n.meta.get("nn_module_stack")
        inner_type = list(stack.values())[-1][1] if stack else None
        weight_owner = _weight_module(n, kinds, modules)
        if weight_owner is not None:
            path = weight_owner
        if (
            n.op == "call_module"
            or weight_owner is not None
            or (
                kinds[n] in WEIGHTED_KINDS
                and isinstance(inner_type, type)
                and issubclass(inner_type, TRACE_THROUGH)
            )
        ):
            i = calls.get(path, 0)
            calls[path] = i + 1
            names[n] = path if i == 0 else f"{path}.call{i}"
            continue
        base = re.sub(r"_\d+$", "", n.name)
        key = f"{path}.{base}" if path else base
        seen.setdefault(key, []).append(n)
        names[n] = key
    for key, group in seen.items():
        if len(group) > 1:
            for i, n in enumerate(group):
                names[n] = f"{key}_{i}" if i else key
    return names


def _weight_module(
    node: fx.Node, kinds: dict[fx.Node, str], modules: dict[str, nn.Module]
) -> str | None:
    """The Conv/Linear module whose weight a functional weighted call reads directly, when the
    call is not that module's own forward."""
    if kinds[node] not in WEIGHTED_KINDS or node.op != "call_function":
        return None
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    owner, _, attr = str(weight.target).rpartition(".")
    if attr != "weight" or not isinstance(modules.get(owner), TRACE_THROUGH):
        return None
    return None if module_path(node) == owner else owner


def owner_type(node: fx.Node, modules: dict[str, nn.Module]) -> type | None:
    if node.op == "call_module":
        return type(modules[str(node.target)])
    stack = node.meta.get("nn_module_stack")
    if stack:
        t = list(stack.values())[-1][1]
        return t if isinstance(t, type) else None
    return None


def make_point(
    ctx: PlanContext,
    consumer: fx.Node,
    arg: int | str,
    producer: fx.Node,
    kind: str,
    label: str,
    **kw: object,
) -> QuantPoint:
    owner = ctx.owners[consumer]
    return QuantPoint(
        name=f"{owner}:{label}",
        owner=owner,
        op=ctx.kinds[consumer],
        kind=kind,
        consumer=consumer.name,
        arg=arg,
        producer=producer.name,
        **kw,  # type: ignore[arg-type]
    )


def input_label(node: fx.Node, arg: int) -> str:
    return "input" if len(tensor_inputs(node)) == 1 else f"input{arg}"


def input_point(ctx: PlanContext, node: fx.Node, arg: int) -> QuantPoint | None:
    """The point planned so far for ``node``'s activation input ``arg`` (``None``: none yet)."""
    return ctx.points.get(f"{ctx.owners[node]}:{input_label(node, arg)}")


def input_points(ctx: PlanContext, node: fx.Node) -> list[QuantPoint | None]:
    """:func:`input_point` of every activation input of ``node``, in order."""
    return [input_point(ctx, node, pos) for pos, _ in tensor_inputs(node)]


def quantize_input(
    ctx: PlanContext,
    node: fx.Node,
    pos: int,
    producer: fx.Node,
    rule: str,
    reason: str,
    calib_o: CalibSpec | None,
    bits_o: int | None,
) -> None:
    spec = (
        ctx.config.activation if bits_o is None else replace(ctx.config.activation, num_bits=bits_o)
    )
    calib = calib_o if calib_o is not None else ctx.config.activation_calib
    label = input_label(node, pos)
    roll = _rolled(ctx, producer)
    if roll is not None:
        reason = (
            f"{reason}; read through the cyclic shift {ctx.owners[roll]} (torch.roll: Slices and "
            "a Concat in ONNX), data movement TensorRT moves this Quantize back across to the "
            "rolled tensor (S03)"
        )
    if (
        ctx.kinds[producer] == "pad"
        and len(producer.users) == 1
        and ctx.kinds[node] in ("conv", "conv_transpose")
        and ctx.config.family_enabled("pad")
    ):
        pad_in = tensor_inputs(producer)[0][1]
        point = make_point(
            ctx,
            producer,
            0,
            pad_in,
            "input",
            label,
            decision=QUANTIZE,
            rule="P08",
            reason=f"moved in front of zero Pad {ctx.owners[producer]} so Pad+{ctx.kinds[node]} fuse",
            spec=spec,
            calib=calib,
        )
        ctx.add(
            replace(
                point,
                name=f"{ctx.owners[node]}:{label}",
                owner=ctx.owners[node],
                op=ctx.kinds[node],
            )
        )
        return
    ctx.add(
        make_point(
            ctx,
            node,
            pos,
            producer,
            "input",
            label,
            decision=QUANTIZE,
            rule=rule,
            reason=reason,
            spec=spec,
            calib=calib,
        )
    )


def _rolled(ctx: PlanContext, node: fx.Node) -> fx.Node | None:
    """The ``torch.roll`` call ``node`` is data movement of (through pass-through ops), if any."""
    seen: set[fx.Node] = set()
    while ctx.kinds.get(node) in DATA_MOVEMENT_KINDS and node not in seen:
        if ctx.kinds[node] == "roll":
            return node
        seen.add(node)
        ins = tensor_inputs(node)
        if len(ins) != 1:
            return None
        node = ins[0][1]
    return None


def skip_input(
    ctx: PlanContext,
    node: fx.Node,
    pos: int | str,
    producer: fx.Node,
    rule: str,
    reason: str,
    *,
    label: str,
) -> None:
    """Record an input of ``node`` that stays float, with the rule and reason."""
    ctx.add(
        make_point(
            ctx, node, pos, producer, "input", label, decision=SKIP, rule=rule, reason=reason
        )
    )


def release(ctx: PlanContext, point: QuantPoint, rule: str, reason: str) -> None:
    """Turn a quantized input point back to float (a later pass found the INT8 read costs a
    reformat, or the plan's format keeps the layer float), keeping its name, owner and op. A
    point moved in front of a zero Pad (P08) sits on the Pad's input but is its convolution's: the
    float point replaces it under the convolution's name, not a new one under the Pad's."""
    skip = make_point(
        ctx,
        ctx.by_name[point.consumer],
        point.arg,
        ctx.by_name[point.producer],
        "input",
        point.name.split(":", 1)[1],
        decision=SKIP,
        rule=rule,
        reason=reason,
    )
    ctx.add(replace(skip, name=point.name, owner=point.owner, op=point.op))


def is_scale(ctx: PlanContext, node: fx.Node) -> bool:
    """A Mul by a constant (a layer scale ``x * gamma``): one activation input."""
    return ctx.kinds.get(node) == "mul" and len(tensor_inputs(node)) == 1


def alias_root(
    ctx: PlanContext, node: fx.Node, kinds: frozenset[str] = frozenset({"identity"})
) -> fx.Node:
    """``node`` itself, or the tensor it is an alias of through single-input ops of ``kinds``:
    by default ``nn.Identity`` / eval-mode dropout calls, the same tensor in the export
    (RepGhost's ``bn(fusion_conv(x1))`` with an identity ``fusion_conv`` reads the ``x1`` its
    cheap conv quantizes)."""
    while ctx.kinds.get(node) in kinds:
        ins = tensor_inputs(node)
        if len(ins) != 1:
            break
        node = ins[0][1]
    return node


def quantized_for_others(ctx: PlanContext, node: fx.Node) -> set[str]:
    """Names of the tensors a planned point quantizes for some reader other than ``node``, each
    also by its :func:`alias_root` (check a producer with ``alias_root(ctx, producer).name``)."""
    names = {p.producer for p in ctx.points.values() if p.quantized and p.consumer != node.name}
    return names | {alias_root(ctx, ctx.by_name[n]).name for n in names if n in ctx.by_name}


def reaches_quantized(
    ctx: PlanContext,
    node: fx.Node,
    through: frozenset[str] = PASS_THROUGH_KINDS,
    *,
    scales: bool = False,
) -> bool:
    """Whether ``node``'s output (through ops of the ``through`` kinds, by default the
    pass-through ones; with ``scales`` also through Muls by a constant, which join a PointWise
    layer) is read by a quantized point."""
    return any(quantized for _, quantized in final_reads(ctx, node, through, scales=scales))


def final_reads(
    ctx: PlanContext,
    node: fx.Node,
    through: frozenset[str] = PASS_THROUGH_KINDS,
    *,
    scales: bool = False,
) -> Iterator[tuple[fx.Node, bool]]:
    """The readers of ``node``'s output, looking through unquantized reads by ops of the
    ``through`` kinds (with ``scales`` also Muls by a constant), each with whether a planned
    point quantizes what it reads."""
    read = {(p.producer, p.consumer) for p in ctx.points.values() if p.quantized}
    stack, seen = [node], {node}
    while stack:
        n = stack.pop()
        for u in n.users:
            if (n.name, u.name) in read:
                yield u, True
            elif ctx.kinds.get(u) in through or (scales and is_scale(ctx, u)):
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
            else:
                yield u, False


def users_through(ctx: PlanContext, node: fx.Node, kinds: frozenset[str]) -> set[fx.Node]:
    """The readers of ``node``, looking through readers of the given ``kinds``."""
    out: set[fx.Node] = set()
    stack = [node]
    while stack:
        for u in stack.pop().users:
            if u not in out:
                out.add(u)
                if ctx.kinds.get(u) in kinds:
                    stack.append(u)
    return out
