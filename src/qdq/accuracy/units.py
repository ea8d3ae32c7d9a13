"""Units of sensitivity and fallback: what can be switched between INT8 and float as one.

A unit is one activation quantizer — one scale group: every point that shares its amax, since
TensorRT needs them equal (rules S01–S03) — together with the weight quantizers of the weighted ops
among those points (a Conv whose input stays float runs in float: its weight Q/DQ goes too). A
weight quantizer whose op has no quantized input is a unit of its own.

Falling back a unit keeps its *owners* (the ops of its points) in float: ``QuantConfig.exclude``
by name, which the planner reports as rule ``USER``.

Example:
    >>> import torch, qdq
    >>> conv = torch.nn.Conv2d
    >>> net = torch.nn.Sequential(conv(3, 16, 3), torch.nn.ReLU(), conv(16, 32, 3))
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 12, 12),))
    >>> [(u.name, u.quantizers, u.owners) for u in units_of(m)][1]
    ('2:input', ('2.input_quantizer', '2.weight_quantizer'), ('2',))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from torch import nn

from qdq.api import plan_of, quantizers_of
from qdq.quant import Quantizer, QuantMode

__all__ = ["Unit", "units_of", "units_off", "units_only"]


@dataclass(frozen=True)
class Unit:
    """Quantizers switched together.

    Attributes:
        name: the leader point of its scale group (``"layer1.0.conv1:input"``), or the weight
            point for a lone weight quantizer.
        quantizers: module paths of its quantizers in the prepared model (activation first).
        owners: the ops of its points (module paths / functional op names), in plan order.
        ops: the op kinds of those points (``"conv"``, ``"add"`` ...), deduplicated.
    """

    name: str
    quantizers: tuple[str, ...]
    owners: tuple[str, ...]
    ops: tuple[str, ...]


def units_of(prepared: nn.Module) -> list[Unit]:
    """Every unit of a prepared model, in plan order (activation groups, then lone weights)."""
    plan = plan_of(prepared)
    present = quantizers_of(prepared)
    weight_of: dict[str, str] = {}  # owner -> its weight quantizer path
    for g in plan.groups:
        leader = plan.point(g.leader)
        if leader.kind == "weight" and g.quantizer in present:
            weight_of[leader.owner] = g.quantizer
    units: list[Unit] = []
    claimed: set[str] = set()
    for g in plan.groups:
        leader = plan.point(g.leader)
        if leader.kind == "weight" or g.quantizer not in present:
            continue
        members = [plan.point(m) for m in g.members]
        owners = tuple(dict.fromkeys(p.owner for p in members))
        weights = tuple(weight_of[o] for o in owners if o in weight_of)
        claimed.update(weights)
        units.append(
            Unit(
                name=g.leader,
                quantizers=(g.quantizer, *weights),
                owners=owners,
                ops=tuple(dict.fromkeys(p.op for p in members)),
            )
        )
    for g in plan.groups:
        leader = plan.point(g.leader)
        if leader.kind == "weight" and g.quantizer in present and g.quantizer not in claimed:
            units.append(Unit(g.leader, (g.quantizer,), (leader.owner,), (leader.op,)))
    return units


@contextlib.contextmanager
def units_off(prepared: nn.Module, units: Iterable[Unit]) -> Iterator[None]:
    """Bypass the quantizers of ``units`` (they run in float); every mode restored on exit."""
    off = {path for u in units for path in u.quantizers}
    with _modes(prepared, lambda path, q: QuantMode.BYPASS if path in off else q.mode):
        yield


@contextlib.contextmanager
def units_only(prepared: nn.Module, units: Iterable[Unit]) -> Iterator[None]:
    """Only the quantizers of ``units`` quantize; every other one is bypassed (restored on exit)."""
    on = {path for u in units for path in u.quantizers}
    with _modes(prepared, lambda path, q: q.mode if path in on else QuantMode.BYPASS):
        yield


@contextlib.contextmanager
def _modes(prepared: nn.Module, choose: Callable[[str, Quantizer], QuantMode]) -> Iterator[None]:
    quantizers = quantizers_of(prepared)
    saved = {path: q.mode for path, q in quantizers.items()}
    try:
        for path, q in quantizers.items():
            mode = choose(path, q)
            q.mode = QuantMode.QUANTIZE if mode is QuantMode.CALIBRATE else mode
        yield
    finally:
        for path, q in quantizers.items():
            q.mode = saved[path]
