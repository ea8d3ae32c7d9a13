"""``QuantPlan``: every candidate Q/DQ point, what was decided for it and why (plain data).

A plan is produced by :func:`qdq.graph.planner.build_plan` and materialised by
:func:`qdq.graph.insert.materialize`. It prints as a table, serialises to JSON, and compares by value,
so it can be golden-tested without running a model.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qdq.config import CalibSpec, QuantSpec

__all__ = ["Coverage", "QuantPlan", "QuantPoint", "ScaleGroup"]

QUANTIZE, SHARE, SKIP = "quantize", "share", "skip"


@dataclass(frozen=True)
class QuantPoint:
    """One candidate Q/DQ point: an input edge (or the weight) of one op.

    Attributes:
        name: unique, human-readable (``"layer1.0.conv1:input"``, ``"layer1.0.add:input1"``).
        owner: the op's name for overrides and reports (``"layer1.0.conv1"``, ``"layer1.0.add"``).
        op: the op kind (``"conv"``, ``"add"``, ``"cat"`` ...).
        kind: ``"input"`` or ``"weight"``.
        consumer: fx node that reads the quantized tensor.
        arg: position of the tensor in ``consumer``'s arguments (index inside the list for ``cat``;
            a keyword name for keyword arguments).
        producer: fx node producing the tensor (a ``get_attr`` node for weights).
        decision: ``"quantize"`` (owns a quantizer), ``"share"`` (uses the quantizer of its scale
            group's leader) or ``"skip"`` (stays float).
        rule: the rule that decided quantize/skip (``"P01"``, ``"P03"``, ``"H02"``, ``"USER"`` ...).
        reason: one line.
        group: scale-group id for quantized and shared points.
        share_rule: for ``"share"``: the rule that put it in the group (``"S01"``/``"S02"``/``"S03"``).
        spec / calib: how it is quantized (``None`` when skipped).
        format_rule: in a plan that is not INT8 only (``QuantConfig(format="fp8")``), the rule
            that gave the point its format (``"F01"``..``"F06"``; the reason says which format).
    """

    name: str
    owner: str
    op: str
    kind: str
    consumer: str
    arg: int | str
    producer: str
    decision: str
    rule: str
    reason: str
    group: int | None = None
    share_rule: str | None = None
    spec: QuantSpec | None = None
    calib: CalibSpec | None = None
    format_rule: str | None = None

    @property
    def quantized(self) -> bool:
        """Whether the point is quantized (owning or sharing a quantizer)."""
        return self.decision != SKIP


@dataclass(frozen=True)
class ScaleGroup:
    """Points that share one quantizer (one amax). ``crosses``: pass-through ops inside the group."""

    id: int
    leader: str
    members: tuple[str, ...]
    rules: tuple[str, ...]
    crosses: tuple[str, ...] = ()
    quantizer: str = ""  # module path of the shared Quantizer in the prepared model


@dataclass(frozen=True)
class Coverage:
    """What happened to one Conv/ConvTranspose/Linear module of the original model."""

    module: str
    type: str
    status: str  # "int8", "float" or "not reached"
    rule: str
    reason: str


@dataclass(frozen=True)
class QuantPlan:
    """Every Q/DQ decision for one model, with rule ids and reasons."""

    model: str
    points: tuple[QuantPoint, ...]
    groups: tuple[ScaleGroup, ...]
    coverage: tuple[Coverage, ...] = field(default=())
    notes: tuple[str, ...] = ()
    capture: str = ""  # how the dataflow was seen: "recorded" (one eager run) or "replacement"
    #: module paths where a tensor value decided Python control flow when the plan was recorded
    control_flow: tuple[str, ...] = ()
    #: where (``file:line``) those values were read, in the model's code
    control_flow_sites: tuple[str, ...] = ()

    # ------------------------------------------------------------- queries
    def point(self, name: str) -> QuantPoint:
        """The point called ``name`` (``KeyError`` lists close names)."""
        for p in self.points:
            if p.name == name:
                return p
        close = [p.name for p in self.points if name.split(":")[0] in p.name][:8]
        raise KeyError(f"no point {name!r} in the plan; similar: {close}")

    def points_of(self, owner: str) -> list[QuantPoint]:
        """All points of one op."""
        return [p for p in self.points if p.owner == owner]

    def group_of(self, name: str) -> ScaleGroup | None:
        """The scale group of a quantized point, ``None`` for skipped points."""
        gid = self.point(name).group
        return None if gid is None else self.groups[gid]

    def counts(self) -> dict[str, dict[str, int]]:
        """``{decision: {rule: count}}`` (the rule of shared points is their sharing rule)."""
        out: dict[str, Counter[str]] = {QUANTIZE: Counter(), SHARE: Counter(), SKIP: Counter()}
        for p in self.points:
            rule = p.share_rule if p.decision == SHARE and p.share_rule else p.rule
            out[p.decision][rule] += 1
        return {k: dict(sorted(v.items())) for k, v in out.items()}

    # -------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)

    def to_json(self) -> str:
        """The plan as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, default=str)

    def format(self, owners: list[str] | None = None) -> str:
        """A readable table, optionally restricted to some ops.

        Columns: point, decision, rule, scale group, reason.
        """
        rows = [p for p in self.points if owners is None or p.owner in owners]
        width = max([len(p.name) for p in rows] + [5])
        lines = [f"{'point':<{width}}  {'decision':<8}  {'rule':<4}  {'group':<5}  reason"]
        for p in rows:
            g = "" if p.group is None else f"g{p.group}"
            rule = p.share_rule if p.decision == SHARE and p.share_rule else p.rule
            lines.append(f"{p.name:<{width}}  {p.decision:<8}  {rule:<4}  {g:<5}  {p.reason}")
        return "\n".join(lines)

    def summary(self) -> str:
        """Counts by decision and rule, and the Conv/Linear coverage."""
        c = self.counts()
        parts = [
            f"QuantPlan for {self.model}: {len(self.points)} points, {len(self.groups)} scale groups"
        ]
        for decision in (QUANTIZE, SHARE, SKIP):
            by_rule = ", ".join(f"{r} {n}" for r, n in c[decision].items()) or "-"
            parts.append(f"  {decision:<8} {sum(c[decision].values()):>4}  ({by_rule})")
        parts.extend(f"  note: {n}" for n in self.notes)
        if self.coverage:
            status = Counter(cv.status for cv in self.coverage)
            parts.append(
                "  Conv/Linear modules: "
                + ", ".join(f"{n} {s}" for s, n in sorted(status.items()))
                + f" of {len(self.coverage)}"
            )
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.summary() + "\n" + self.format()
